/**
 * The staging fault wrappers of idem/testing: off unless enabled, never in production, and with them
 * on, keyed requests that lose replies or arrive twice still take effect once (real PostgreSQL store).
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fingerprint } from "../../src/core/index.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import {
  StagingFaultsInProductionError,
  stagingFaults,
  stagingFaultsFromEnv,
} from "../../src/testing/staging.ts";
import type { OpenDb } from "../helpers/db.ts";
import { serverOrEmbedded } from "./helpers.ts";

describe("staging faults: switches", () => {
  const handler = async () => new Response("ok");

  it("is off unless enabled: the handler is returned as it is", () => {
    const listener = () => {};
    expect(stagingFaults.listener(listener, { dropReply: 1 })).toBe(listener);
    expect(stagingFaultsFromEnv({})).toEqual({ enabled: false });
  });

  it("refuses to start with NODE_ENV=production", () => {
    const env = { NODE_ENV: "production" };
    expect(() => stagingFaults.fetch(handler, { enabled: true, dropReply: 0.1, env })).toThrow(
      StagingFaultsInProductionError,
    );
    expect(() =>
      stagingFaults.listener(() => {}, stagingFaultsFromEnv({ ...env, IDEM_STAGING_FAULTS: "drop=0.1" })),
    ).toThrow(StagingFaultsInProductionError);
    expect(() => stagingFaultsFromEnv({ IDEM_STAGING_FAULTS: "explode=1" })).toThrow(/unknown fault/);
  });

  it("fetch: a dropped reply is lost after the work ran; a duplicate runs the handler twice", async () => {
    let calls = 0;
    const counting = async () => {
      calls++;
      return new Response("done");
    };
    const dropping = stagingFaults.fetch(counting, { enabled: true, dropReply: 1, env: {} });
    const res = await dropping(new Request("http://x/pay", { method: "POST", body: "{}" }));
    await expect(res.text()).rejects.toThrow();
    expect(calls).toBe(1);
    const doubling = stagingFaults.fetch(counting, { enabled: true, duplicate: 1, env: {} });
    expect(await (await doubling(new Request("http://x/pay", { method: "POST", body: "{}" }))).text()).toBe(
      "done",
    );
    await new Promise((r) => setTimeout(r, 50));
    expect(calls).toBe(3);
    // GETs are left alone by default.
    expect(await (await dropping(new Request("http://x/pay"))).text()).toBe("done");
  });
});

describe.each(serverOrEmbedded)("staging faults on a keyed node:http service on $name", (backend) => {
  let open: OpenDb;
  let server: Server;
  let url: string;
  const faults: string[] = [];

  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    await open.db.exec("CREATE TABLE effects (key text NOT NULL, n serial)");
    const store = await PostgresStore.open(open.db);
    const enc = new TextEncoder();
    const listener = async (
      req: import("node:http").IncomingMessage,
      res: import("node:http").ServerResponse,
    ) => {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const key = String(req.headers["idempotency-key"]);
      const body = new Uint8Array(Buffer.concat(chunks));
      const claim = {
        scope: "acct",
        key,
        fingerprint: fingerprint({
          method: "POST",
          path: req.url ?? "/",
          contentType: "application/json",
          body,
        }),
      };
      const out = await store.atomic(claim, async (tx) => {
        const { rows } = await tx.query<{ n: number }>("INSERT INTO effects (key) VALUES ($1) RETURNING n", [
          key,
        ]);
        const response = {
          status: 201,
          headers: [] as Array<[string, string]>,
          body: enc.encode(`effect ${rows[0]!.n}`),
        };
        return { response, save: response };
      });
      res.writeHead(out.response.status).end(Buffer.from(out.response.body));
    };
    server = createServer(
      stagingFaults.listener(
        (req, res) => {
          listener(req, res).catch(() => res.writeHead(409).end());
        },
        {
          enabled: true,
          dropReply: 0.4,
          duplicate: 0.4,
          delay: 0.2,
          delayMs: 20,
          seed: 5,
          env: {},
          onFault: (e) => faults.push(e.fault),
        },
      ),
    );
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server?.closeAllConnections();
    await new Promise((r) => server?.close(r));
    await open?.close();
  });

  it("every key ends with one effect and one answer, through dropped, delayed and doubled requests", async () => {
    const answers = new Map<string, Set<string>>();
    await Promise.all(
      Array.from({ length: 20 }, async (_, i) => {
        const key = `staging-${i}`;
        answers.set(key, new Set());
        for (let attempt = 0; attempt < 30; attempt++) {
          try {
            const r = await fetch(`${url}/pay`, {
              method: "POST",
              headers: { "idempotency-key": key },
              body: `{"i":${i}}`,
            });
            if (r.status === 201) {
              answers.get(key)!.add(await r.text());
              break;
            }
          } catch {
            // the reply was dropped: retry with the same key
          }
          await new Promise((r) => setTimeout(r, 30));
        }
      }),
    );
    expect(faults).toContain("drop-reply");
    expect(faults).toContain("duplicate");
    const { rows } = await open.db.query<{ key: string; n: number }>(
      "SELECT key, count(*)::int AS n FROM effects GROUP BY key ORDER BY key",
    );
    expect(rows).toHaveLength(20);
    expect(rows.every((r) => r.n === 1)).toBe(true);
    for (const set of answers.values()) expect(set.size).toBe(1);
  });
});
