/**
 * The Hono adapter (the reference the other adapters mirror), served with @hono/node-server.
 */
import { describe } from "vitest";
import { backends } from "../helpers/db.ts";
import { paymentsContract, useApp } from "./contract.ts";
import { lifecycleContract } from "./contract-lifecycle.ts";
import { startHono } from "./hono-app.ts";

describe.each(backends)("Hono adapter on $name", (backend) => {
  const app = useApp(backend, startHono);
  paymentsContract(app, { hangUp: true });
  lifecycleContract(app);
});
