import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { CliError, EXIT, parse } from "./shared.ts";

const RUN = fileURLToPath(new URL("../../bench/run.ts", import.meta.url));

const USAGE = `usage: idem bench [--only GROUPS]

Runs the benchmarks (the same as \`npm run bench\` in a clone) against the real PostgreSQL at
$DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test; each benchmark uses a database of its
own and drops it), prints each figure and ratio, and writes bench/results/latest.md and latest.svg.
  --only GROUPS   comma-separated subset (sets BENCH_ONLY), e.g. http,phases
Exit codes: 0 done, 1 a benchmark failed, 2 bad usage.`;

export async function benchCommand(argv: string[]): Promise<number> {
  const { values } = parse(argv, { only: { type: "string" } }, USAGE);
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  if (!existsSync(RUN)) {
    throw new CliError(
      "the benchmarks ship with the source: run `idem bench` from a clone of the repository",
    );
  }
  const env = { ...process.env, ...(values.only ? { BENCH_ONLY: values.only } : {}) };
  const r = spawnSync(process.execPath, ["--conditions=source", "--import", "tsx", RUN], {
    stdio: "inherit",
    env,
  });
  return r.status === 0 ? EXIT.ok : EXIT.failure;
}
