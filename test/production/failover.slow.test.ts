/**
 * The reference service through HAProxy in front of a Patroni cluster (etcd, PostgreSQL nodes), while
 * paying clients retry each payment with its one key until it succeeds: the primary is killed (-9)
 * three times, then switched over once. The service is never restarted. Every request must end (a
 * 15 s bound per try: no hang), none may be answered 500, and every key must have exactly one payment.
 * The time from each primary loss to the first new payment is printed.
 */
import { randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { describe, expect, it } from "vitest";
import { ApiKeys, ensureDemoAccounts } from "../../app/accounts.ts";
import { createApp } from "../../app/app.ts";
import { prepareSchema } from "../../app/database.ts";
import { createLogger } from "../../app/observability.ts";
import { openDatabaseUrl } from "../../src/postgres/drivers/connect.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { KEY_1 } from "../app/service.ts";
import { missing } from "../infra/common.ts";
import { patroniMissing, startPatroni } from "../infra/patroni.ts";

const why = missing(patroniMissing());
const LOOPS = 4;
const TRY_MS = 15_000;

describe.skipIf(why)("a Patroni failover under paying clients", () => {
  it("loses the primary three times and switches over once: no 500, no hang, one payment per key", async () => {
    const cluster = await startPatroni();
    const { db } = await openDatabaseUrl(cluster.url, { max: 10, connectTimeoutMs: 2_000 });
    let server: ReturnType<typeof serve> | undefined;
    try {
      await prepareSchema(db);
      await ensureDemoAccounts(db);
      const store = await PostgresStore.open(db);
      const app = createApp({
        paymentsMode: "atomic",
        db,
        store,
        apiKeys: new ApiKeys(db),
        logger: createLogger({ level: "silent" }),
      });
      server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" });
      await new Promise<void>((r) => server!.once("listening", () => r()));
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/payments`;

      const statuses = new Map<string, number>();
      const paid = new Map<string, Set<string>>(); // key -> payment ids answered
      /** When each new (not replayed) payment's successful try was sent, and answered. */
      const payments: { sent: number; answered: number }[] = [];
      let running = true;
      const count = (s: string) => statuses.set(s, (statuses.get(s) ?? 0) + 1);
      const loop = async () => {
        while (running) {
          const key = randomUUID(); // one key per payment, reused by every try until it succeeds
          for (;;) {
            let status: string;
            const sent = Date.now();
            try {
              const res = await fetch(url, {
                method: "POST",
                headers: {
                  authorization: `Bearer ${KEY_1}`,
                  "content-type": "application/json",
                  "idempotency-key": key,
                },
                body: JSON.stringify({ amount_cents: 1234, currency: "eur" }),
                signal: AbortSignal.timeout(TRY_MS),
              });
              status = String(res.status);
              const body = await res.text();
              if (res.status === 201) {
                const ids = paid.get(key) ?? new Set();
                ids.add(JSON.parse(body).id);
                paid.set(key, ids);
                if (res.headers.get("idempotent-replayed") !== "true")
                  payments.push({ sent, answered: Date.now() });
                count(status);
                break;
              }
            } catch (err) {
              status = (err as Error).name === "TimeoutError" ? "hang" : "network";
            }
            count(status);
            await new Promise((r) => setTimeout(r, 100));
          }
        }
      };
      const loops = Array.from({ length: LOOPS }, loop);
      /** From the primary loss to the first new payment by a try sent after it. */
      const recovered = async (what: string, since: number) => {
        const t = Date.now();
        for (;;) {
          const first = payments.find((p) => p.sent > since);
          if (first) {
            const ms = first.answered - since;
            console.log(`${what}: payments again after ${(ms / 1000).toFixed(1)} s`);
            return ms;
          }
          if (Date.now() - t > 120_000) throw new Error(`no payment within 120 s after ${what}`);
          await new Promise((r) => setTimeout(r, 50));
        }
      };
      const times: number[] = [];
      await new Promise((r) => setTimeout(r, 2_000));
      for (let run = 1; run <= 3; run++) {
        const primary = await cluster.primary();
        await cluster.kill(primary);
        const at = Date.now();
        times.push(await recovered(`primary ${primary.name} killed (-9), run ${run}`, at));
        await cluster.addNode(); // a replica again for the next run
        await new Promise((r) => setTimeout(r, 2_000));
      }
      const primary = await cluster.primary();
      const candidate = cluster.nodes().find((n) => n !== primary)!;
      const at = Date.now();
      await cluster.switchover(candidate);
      times.push(await recovered(`switchover ${primary.name} -> ${candidate.name}`, at));
      await new Promise((r) => setTimeout(r, 2_000));
      running = false;
      await Promise.all(loops);

      console.log(
        `answers: ${[...statuses].map(([s, n]) => `${s} x ${n}`).join(", ")}; recovery ` +
          `${times.map((t) => (t / 1000).toFixed(1)).join(" / ")} s (Patroni ttl 10 s, loop_wait 1 s)`,
      );
      expect(statuses.get("500") ?? 0).toBe(0);
      expect(statuses.get("hang") ?? 0).toBe(0);
      for (const [, ids] of paid) expect(ids.size).toBe(1);
      const { rows } = await db.query<{ id: string }>("SELECT id FROM payments");
      const answered = new Set([...paid.values()].flatMap((ids) => [...ids]));
      expect(rows.length).toBe(paid.size); // exactly one payment per key, none without an answer
      for (const r of rows) expect(answered.has(r.id)).toBe(true);
      expect(paid.size).toBeGreaterThan(20);
    } finally {
      await new Promise<void>((r) => (server ? server.close(() => r()) : r()));
      await db.close().catch(() => {});
      await cluster.stop();
    }
  }, 420_000);
});
