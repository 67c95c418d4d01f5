/**
 * Quick probe while optimising (not part of the bench report): CPU per request of some variants.
 *   tsx --conditions=source bench/compare/cpu-probe.ts <variant>[:mode] ... (DATABASE_URL, SECONDS)
 */
import pg from "pg";
import { backendsCpu, backendsDelta, processCpuUs } from "./cpu.ts";
import { send } from "./requests.ts";
import { startServer } from "./spawn.ts";
import { type Mode, wrk } from "./wrk.ts";

const url = process.env.DATABASE_URL!;
const dbName = new URL(url).pathname.slice(1);
const seconds = Number(process.env.SECONDS_EACH ?? 4);
const admin = new pg.Client({ connectionString: url });
await admin.connect();
for (const arg of process.argv.slice(2)) {
  const [name, modes = "keyed,replay"] = arg.split(":");
  const server = await startServer(name!, { DATABASE_URL: url, BENCH_RUN: "probe" });
  try {
    const prefix = `p${Date.now().toString(36)}`;
    await send(
      server.url,
      Array.from({ length: 64 }, (_, i) => `${prefix}-${i}`),
      8,
    );
    for (const mode of modes.split(",") as Mode[]) {
      await wrk(server.url, { mode, prefix: `w${prefix}`, replayKeys: 64, seconds: 1, connections: 32 });
      const n0 = processCpuUs(server.pid);
      const pg0 = await backendsCpu(admin, dbName);
      const w = await wrk(server.url, {
        mode,
        prefix: mode === "replay" ? prefix : `${prefix}${mode}`,
        replayKeys: 64,
        seconds,
        connections: 32,
      });
      const pgUs = backendsDelta(pg0, await backendsCpu(admin, dbName));
      const n = w.requests;
      console.log(
        `${name!.padEnd(14)} ${mode.padEnd(6)} ${Math.round(n / w.seconds)
          .toString()
          .padStart(6)} req/s  node ${Math.round((processCpuUs(server.pid) - n0) / n)
          .toString()
          .padStart(5)} µs  pg ${Math.round(pgUs / n)
          .toString()
          .padStart(5)} µs  errors ${w.errors}`,
      );
    }
  } finally {
    await server.stop();
  }
}
await admin.end();
