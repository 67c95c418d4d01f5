/**
 * One variant's server, in a process of its own:
 *
 *   tsx --conditions=source bench/compare/server.ts <variant>     (DATABASE_URL, REDIS_URL, BENCH_RUN)
 *
 * prints `listening http://127.0.0.1:<port>` once it accepts requests. The bench stops it with SIGTERM.
 */
import { variant } from "./variants.ts";

const v = variant(process.argv[2] ?? "");
const url = process.env.DATABASE_URL;
if (!url) throw new Error("DATABASE_URL is required");
// Only the modules this variant uses are loaded.
const port =
  v.kind === "peer"
    ? await (await import("./peers.ts")).startPeer(v, url)
    : v.name === "idem-statement"
      ? await (await import("./statement.ts")).startStatement(url)
      : v.kind === "hand"
        ? await (await import("./hand.ts")).startHand(v, url)
        : v.framework === "nest"
          ? await (await import("./nest.ts")).startNest(v, url)
          : await (await import("./frameworks.ts")).startFramework(v, url);
console.log(`listening http://127.0.0.1:${port}`);
process.on("SIGTERM", () => process.exit(0));
