/**
 * `npm run bench`: every benchmark, each printing figures measured in one run (ratios, not absolute
 * timings compared across runs). Needs the real PostgreSQL: DATABASE_URL, default
 * postgres://postgres@127.0.0.1:5432/test (each benchmark works in a database of its own and drops it).
 */
import { clientBench } from "./client.ts";
import { httpBench, printRows } from "./http.ts";
import { phasesBench } from "./phases.ts";

const rows = await httpBench();
printRows("Payment endpoint over HTTP (real PostgreSQL, autocannon, 32 connections)", rows);
const [unkeyed, keyed, replay] = rows;
console.log(`keyed first-time / unkeyed = ${(keyed!.rps / unkeyed!.rps).toFixed(2)}  (goal >= 0.80)`);
console.log(`keyed replay / unkeyed     = ${(replay!.rps / unkeyed!.rps).toFixed(2)}  (goal >= 1.00)`);

console.log("\nClient overhead on the success path");
await clientBench();

console.log("\nPhases mode (provider over HTTP) against atomic mode, same run");
await phasesBench();
