/**
 * Compact storage: a route that saves only the status and the created resource's id, and rebuilds its
 * replies from them. Driven through a real Hono app on every backend.
 */
import { type Context, Hono } from "hono";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type CompactOptions, fingerprint, type StoredResponse } from "../../src/core/index.ts";
import { idempotency } from "../../src/http/hono.ts";
import type { Tx } from "../../src/postgres/db.ts";
import { CompactWithoutRebuildError } from "../../src/postgres/keys/row.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, type OpenDb } from "../helpers/db.ts";

const enc = new TextEncoder();

interface Payment {
  id: string;
  amount_cents: number;
  currency: string;
  status: string;
  description: string;
}

function reply(status: number, p: Payment): StoredResponse {
  return {
    status,
    headers: [
      ["content-type", "application/json"],
      ["location", `/v1/payments/${p.id}`],
    ],
    body: enc.encode(JSON.stringify(p)),
  };
}

/** The route's compact form: the payment id from the saved reply; the reply rebuilt by reading the payment. */
const compact: CompactOptions<Tx> = {
  id: (r) => (r.status === 201 ? (JSON.parse(new TextDecoder().decode(r.body)) as Payment).id : undefined),
  rebuild: async ({ status, id }, tx) => {
    const { rows } = await tx.query<Payment>(
      "SELECT id, amount_cents, currency, status, description FROM payments WHERE id = $1",
      [id],
    );
    return reply(status, rows[0]!);
  },
};

describe.each(backends)("compact storage on $name", (backend) => {
  let open: OpenDb;
  let store: PostgresStore;
  let app: Hono;
  let runs = 0;

  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    await open.db.exec(`CREATE TABLE payments (id text PRIMARY KEY, account text NOT NULL, amount_cents int NOT NULL,
                          currency text NOT NULL, status text NOT NULL, description text NOT NULL)`);
    store = await PostgresStore.open(open.db);
    app = new Hono();
    const scope = (c: Context) => c.req.header("x-account");
    const pay = async (c: Context): Promise<Response> => {
      runs++;
      const body = (await c.req.json()) as { amount_cents: number; currency: string };
      const declined = body.amount_cents > 1_000_000;
      const p: Payment = {
        id: `pay_${runs.toString().padStart(6, "0")}_${Math.random().toString(36).slice(2, 10)}`,
        amount_cents: body.amount_cents,
        currency: body.currency,
        status: declined ? "declined" : "succeeded",
        description:
          "A long enough description to make the saved body worth keeping out of the table. ".repeat(3),
      };
      await c.var.idempotency.tx.query(
        "INSERT INTO payments (id, account, amount_cents, currency, status, description) VALUES ($1, $2, $3, $4, $5, $6)",
        [p.id, c.var.idempotency.scope, p.amount_cents, p.currency, p.status, p.description],
      );
      const r = reply(declined ? 402 : 201, p);
      return new Response(r.body as Uint8Array<ArrayBuffer>, { status: r.status, headers: r.headers });
    };
    app.post("/full/payments", idempotency({ store, scope }), pay);
    app.post("/compact/payments", idempotency({ store, scope, compact }), pay);
  });
  afterAll(async () => {
    await open?.close();
  });

  const post = (path: string, key: string, body: unknown, account = "acct_1") =>
    app.request(path, {
      method: "POST",
      headers: { "x-account": account, "idempotency-key": key, "content-type": "application/json" },
      body: JSON.stringify(body),
    });

  async function keyRow(key: string) {
    const { rows } = await open.db.query<{
      status: number;
      headers: unknown;
      body: Uint8Array | null;
      resource_id: string | null;
      size: number;
    }>(
      "SELECT status, headers, body, resource_id, pg_column_size(k.*)::int AS size FROM idem.keys k WHERE key = $1",
      [key],
    );
    expect(rows).toHaveLength(1);
    return rows[0]!;
  }

  it("saves the status and the resource id only, and rebuilds the reply on replay", async () => {
    const before = runs;
    const first = await post("/compact/payments", "c-replay", { amount_cents: 5000, currency: "eur" });
    expect(first.status).toBe(201);
    const created = (await first.json()) as Payment;

    const row = await keyRow("c-replay");
    expect(row).toMatchObject({ status: 201, headers: null, body: null, resource_id: created.id });

    const again = await post("/compact/payments", "c-replay", { amount_cents: 5000, currency: "eur" });
    expect(again.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.headers.get("idempotency-expires")).toBeTruthy();
    expect(again.headers.get("location")).toBe(`/v1/payments/${created.id}`);
    expect(again.headers.get("content-type")).toBe("application/json");
    expect(await again.json()).toEqual(created);
    expect(runs).toBe(before + 1);
  });

  it("answers a different request under a compact key with 422 and runs nothing", async () => {
    await post("/compact/payments", "c-mismatch", { amount_cents: 5000, currency: "eur" });
    const before = runs;
    const other = await post("/compact/payments", "c-mismatch", { amount_cents: 9999, currency: "eur" });
    expect(other.status).toBe(422);
    expect(other.headers.get("content-type")).toBe("application/problem+json");
    expect(runs).toBe(before);
  });

  it("stores a smaller key row than the full reply", async () => {
    await post("/full/payments", "size-full", { amount_cents: 5000, currency: "eur" });
    await post("/compact/payments", "size-compact", { amount_cents: 5000, currency: "eur" });
    const full = await keyRow("size-full");
    const small = await keyRow("size-compact");
    expect(full.body).not.toBeNull();
    expect(small.size).toBeLessThan(full.size / 2);
  });

  it("saves a reply without a resource id (a 402 decline) in full, and replays it byte for byte", async () => {
    const first = await post("/compact/payments", "c-declined", { amount_cents: 2_000_000, currency: "eur" });
    expect(first.status).toBe(402);
    const bytes = await first.text();
    const row = await keyRow("c-declined");
    expect(row.resource_id).toBeNull();
    expect(row.body).not.toBeNull();
    const again = await post("/compact/payments", "c-declined", { amount_cents: 2_000_000, currency: "eur" });
    expect(again.status).toBe(402);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(await again.text()).toBe(bytes);
  });

  it("replays the resource as it is now (the documented trade-off: not byte for byte)", async () => {
    const first = await post("/compact/payments", "c-now", { amount_cents: 700, currency: "usd" });
    const created = (await first.json()) as Payment;
    await open.db.query("UPDATE payments SET status = 'refunded' WHERE id = $1", [created.id]);
    const again = await post("/compact/payments", "c-now", { amount_cents: 700, currency: "usd" });
    expect(again.status).toBe(201); // the saved status, whatever the rebuild says
    expect(await again.json()).toEqual({ ...created, status: "refunded" });
  });

  it("keeps scopes apart: another account's same key is a new request", async () => {
    const a = (await (
      await post("/compact/payments", "c-scope", { amount_cents: 1, currency: "eur" })
    ).json()) as Payment;
    const res = await post("/compact/payments", "c-scope", { amount_cents: 1, currency: "eur" }, "acct_2");
    expect(res.headers.get("idempotent-replayed")).toBeNull();
    expect(((await res.json()) as Payment).id).not.toBe(a.id);
  });

  it("refuses to replay a compact key without a rebuild rather than answer an empty reply", async () => {
    await post("/compact/payments", "c-norebuild", { amount_cents: 5000, currency: "eur" });
    const claim = {
      scope: "acct_1",
      key: "c-norebuild",
      fingerprint: fingerprint({
        method: "POST",
        path: "/compact/payments",
        contentType: "application/json",
        body: enc.encode(JSON.stringify({ amount_cents: 5000, currency: "eur" })),
      }),
    };
    const err = await store
      .atomic(claim, async () => {
        throw new Error("must not run");
      })
      .catch((e) => e);
    expect(err).toBeInstanceOf(CompactWithoutRebuildError);
  });
});
