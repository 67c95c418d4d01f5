/**
 * What every runtime's server serves (serve.ts on Bun and Deno, worker.ts on workerd): the contract's
 * payments app (test/http/web-app.ts) plus
 *   GET|DELETE /_crashes   what `onError` received (the contract checks it)
 *   POST /v1/orders        a keyed route whose transaction writes an outbox event (`writeOutbox`)
 *   POST /_client          idem's client, run in this runtime: POSTs `{ url, body, intent, headers }`
 *   GET /_warm             answers once the store is open
 */
import { createClient } from "../../src/client/index.ts";
import { idempotency } from "../../src/http/web.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import type { PostgresStore } from "../../src/postgres/store.ts";
import { phasesRunner } from "../http/contract-app.ts";
import { dispatch, webRoutes } from "../http/web-app.ts";

const crashes: Array<{ message: string }> = [];

export function runtimeApp(
  store: PostgresStore,
  runnerName?: string,
): (request: Request) => Promise<Response> {
  const routes = webRoutes({ store, runner: phasesRunner(store, runnerName) }, (err) =>
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
    const { url, body, intent, headers } = (await request.json()) as {
      url: string;
      body: unknown;
      intent: string;
      headers: Record<string, string>;
    };
    const res = await client.post(url, body, { intent, headers });
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
  routes["/_warm"] = async () => new Response("ok");
  return dispatch(routes);
}
