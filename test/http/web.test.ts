import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { describe } from "vitest";
import { backends } from "../helpers/db.ts";
import { type AppParts, paymentsContract, useApp } from "./contract.ts";
import { lifecycleContract, ownBodyContract } from "./contract-lifecycle.ts";
import { dispatch, webRoutes } from "./web-app.ts";

const crashes: unknown[] = [];

function startWeb({ store, runner }: AppParts) {
  const fetch = dispatch(webRoutes({ store, runner }, (err) => crashes.push(err)));
  return new Promise<{ url: string; close(): Promise<void> }>((resolve) => {
    const server = serve(
      {
        fetch,
        port: 0,
        hostname: "127.0.0.1",
      },
      (info: AddressInfo) =>
        resolve({
          url: `http://127.0.0.1:${info.port}`,
          close: () =>
            new Promise<void>((done) => {
              server.close(() => done());
              (server as unknown as { closeAllConnections?(): void }).closeAllConnections?.();
            }),
        }),
    );
  });
}

describe.each(backends)("Web-standard adapter on $name", (backend) => {
  const app = useApp(backend, startWeb);
  paymentsContract(app, { hangUp: true });
  lifecycleContract(app);

  ownBodyContract(app, crashes);
});
