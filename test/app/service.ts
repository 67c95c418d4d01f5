/** Start the reference service in this process on a fresh database, on a random loopback port. */
import type { ChildProcess } from "node:child_process";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import type { Logger } from "pino";
import { ApiKeys, ensureDemoAccounts } from "../../app/accounts.ts";
import { createApp } from "../../app/app.ts";
import { ensureSchema, prepareSchema } from "../../app/database.ts";
import { createLogger } from "../../app/observability.ts";
import { DECLINED_TEST_CARD } from "../../app/payments-phases.ts";
import type { Sealer } from "../../src/core/index.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { type Provider, startProvider } from "../../src/testing/provider.ts";
import type { OpenDb, TestBackend } from "../helpers/db.ts";

export const KEY_1 = "sk_test_demo_1";
export const KEY_2 = "sk_test_demo_2";

export interface RunningService {
  url: string;
  open: OpenDb;
  store: PostgresStore;
  /** The provider simulator's URL (phases mode). */
  providerUrl?: string;
  /** The provider simulator itself (phases mode). */
  provider?: Provider;
  stop(): Promise<void>;
  count(sql: string, params?: unknown[]): Promise<number>;
}

export async function startService(
  backend: TestBackend,
  options: {
    requireKey?: boolean;
    logger?: Logger;
    /** `atomic` (default here: local payments, issue 2's first cut) or `phases` (charges a simulator). */
    paymentsMode?: "atomic" | "phases";
    /** Serve the playground (phases mode). */
    playground?: boolean;
    /** `false`: the simulator and the service run without provider idempotency (lookup mode). */
    providerIdempotency?: boolean;
    /** The store's retention (default 24 h). */
    retentionMs?: number;
    /** IDEM_ADMIN_TOKEN: the operations console at /admin (default: off). */
    adminTokens?: string;
    /** Added latency of every provider charge, in ms (phases mode; default 0). */
    providerLatencyMs?: number;
    /** Start as app/main.ts does: migrate only when the schema is behind (default: always prepare). */
    ensureSchema?: boolean;
    /** Encryption at rest (IDEM_ENCRYPTION_KEYS; default: none). */
    sealer?: Sealer;
  } = {},
): Promise<RunningService> {
  const open = await backend.open();
  await (options.ensureSchema ? ensureSchema(open.db) : prepareSchema(open.db));
  await ensureDemoAccounts(open.db);
  const store = await PostgresStore.open(open.db, {
    retentionMs: options.retentionMs,
    sealer: options.sealer,
  });
  const mode = options.paymentsMode ?? "atomic";
  const provider =
    mode === "phases"
      ? await startProvider({
          port: 0,
          host: "127.0.0.1",
          declineCards: [DECLINED_TEST_CARD],
          idempotency: options.providerIdempotency,
          latencyMs: options.providerLatencyMs,
        })
      : undefined;
  const app = createApp({
    paymentsMode: mode,
    providerUrl: provider?.url,
    providerIdempotency: options.providerIdempotency,
    db: open.db,
    store,
    apiKeys: new ApiKeys(open.db),
    requireKey: options.requireKey,
    logger: options.logger ?? createLogger({ level: "silent" }),
    playground: options.playground,
    adminTokens: options.adminTokens,
  });
  const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" });
  await new Promise<void>((r) => server.once("listening", () => r()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    open,
    store,
    providerUrl: provider?.url,
    provider,
    async stop() {
      await new Promise<void>((r) => server.close(() => r()));
      await provider?.close();
      await open.close();
    },
    async count(sql, params) {
      const { rows } = await open.db.query<{ n: number }>(sql, params);
      return Number(rows[0]?.n);
    },
  };
}

export function pay(
  url: string,
  init: {
    key?: string;
    apiKey?: string;
    body?: string;
    contentType?: string;
    headers?: Record<string, string>;
  } = {},
): Promise<Response> {
  const headers: Record<string, string> = {
    authorization: `Bearer ${init.apiKey ?? KEY_1}`,
    "content-type": init.contentType ?? "application/json",
    ...init.headers,
  };
  if (init.key !== undefined) headers["idempotency-key"] = init.key;
  return fetch(`${url}/v1/payments`, {
    method: "POST",
    headers,
    body: init.body ?? JSON.stringify({ amount_cents: 5000, currency: "eur" }),
  });
}

/**
 * The URL a spawned service process prints once it listens ("... on http://127.0.0.1:PORT"); rejects
 * with what it printed when it exits first or stays silent past `timeoutMs`.
 */
export function listeningUrl(child: ChildProcess, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`service did not start: ${out}`)), timeoutMs);
    child.stdout!.on("data", (d) => {
      out += d;
      const m = /on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    });
    child.stderr!.on("data", (d) => {
      out += d;
    });
    child.once("exit", (code) => reject(new Error(`service exited with ${code}: ${out}`)));
  });
}
