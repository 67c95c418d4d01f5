/**
 * The contract's payments app (test/http/web-app.ts) served by another runtime's own HTTP server: Bun
 * (`Bun.serve`), Deno (`Deno.serve`), or Node for comparison. Run by test/runtimes/runtimes.slow.test.ts:
 *
 *   bun test/runtimes/serve.ts          IDEM_DB_URL=postgres://...  IDEM_DRIVER=postgres|pg
 *   deno run -A test/runtimes/serve.ts  (the same variables)
 *
 * It prints `listening <port>` once up. The routes are app.ts's.
 */
import pg from "pg";
import postgres from "postgres";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { fromPostgresJs } from "../../src/postgres/drivers/postgres-js.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { runtimeApp } from "./app.ts";

declare const Bun: { serve(o: object): { port: number } } | undefined;
declare const Deno:
  | {
      env: { get(name: string): string | undefined };
      serve(o: object, handler: (r: Request) => Promise<Response>): unknown;
    }
  | undefined;

const env = (name: string) =>
  typeof Deno !== "undefined"
    ? Deno.env.get(name)
    : (globalThis as { process?: { env: Record<string, string> } }).process?.env[name];
const url = env("IDEM_DB_URL");
if (!url) throw new Error("set IDEM_DB_URL");
function pool(): pg.Pool {
  const p = new pg.Pool({ connectionString: url, max: 8 });
  p.on("error", () => {}); // an idle connection cut (the contract's database outage): the next use reconnects
  return p;
}
const db =
  env("IDEM_DRIVER") === "pg"
    ? fromPg(pool())
    : fromPostgresJs(postgres(url, { max: 8, onnotice: () => {} }));
const store = await PostgresStore.open(db, { lockTimeoutMs: 1_000 });

const fetch = runtimeApp(store);

const announce = (port: number) => console.log(`listening ${port}`);
if (typeof Bun !== "undefined") {
  announce(Bun.serve({ port: 0, hostname: "127.0.0.1", fetch }).port);
} else if (typeof Deno !== "undefined") {
  Deno.serve(
    { port: 0, hostname: "127.0.0.1", onListen: ({ port }: { port: number }) => announce(port) },
    fetch,
  );
} else {
  const { serve } = await import("@hono/node-server");
  serve({ fetch, port: 0, hostname: "127.0.0.1" }, (info) => announce(info.port));
}
