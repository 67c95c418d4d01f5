/**
 * The contract's payments app (test/http/web-app.ts) served by another runtime's own HTTP server: Bun
 * (`Bun.serve`), Deno (`Deno.serve`), or Node for comparison. Run by test/runtimes/runtimes.slow.test.ts:
 *
 *   bun test/runtimes/serve.ts          IDEM_DB_URL=postgres://...  IDEM_DRIVER=postgres|pg
 *   deno run -A test/runtimes/serve.ts  (the same variables)
 *
 * It prints `listening <port>` once up. Besides the contract's routes it serves:
 *   GET|DELETE /_crashes   what `onError` received (the contract checks it)
 *   POST /v1/orders        a keyed route whose transaction writes an outbox event (`writeOutbox`)
 *   POST /_client          idem's client, run in this runtime: POSTs `{ url, body, intent }` with retries
 */
import pg from "pg";
import postgres from "postgres";
import { createClient } from "../../src/client/index.ts";
import { idempotency } from "../../src/http/web.ts";
import { fromPg } from "../../src/postgres/drivers/pg.ts";
import { fromPostgresJs } from "../../src/postgres/drivers/postgres-js.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { phasesRunner } from "../http/contract-app.ts";
import { dispatch, webRoutes } from "../http/web-app.ts";

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

const crashes: Array<{ message: string }> = [];
const routes = webRoutes({ store, runner: phasesRunner(store) }, (err) =>
  crashes.push({ message: (err as Error).message }),
);
routes["/v1/orders"] = idempotency(
  async (_request, { tx, scope, body }) => {
    const id = await writeOutbox(tx, { topic: "orders", type: "order.placed", payload: { scope, body } });
    return Response.json({ event: id }, { status: 201 });
  },
  { store, scope: (request) => request.headers.get("x-account") ?? undefined },
);
const client = createClient();
routes["/_client"] = async (request) => {
  const {
    url: target,
    body,
    intent,
    headers,
  } = (await request.json()) as {
    url: string;
    body: unknown;
    intent: string;
    headers: Record<string, string>;
  };
  const res = await client.post(target, body, { intent, headers });
  return Response.json({
    status: res.status,
    replayed: res.headers.get("idempotent-replayed"),
    body: await res.text(),
  });
};
routes["/_crashes"] = async (request) => {
  if (request.method === "DELETE") crashes.length = 0;
  return Response.json(crashes);
};
const fetch = dispatch(routes);

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
