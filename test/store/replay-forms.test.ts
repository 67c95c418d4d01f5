/**
 * The forms a saved answer takes, through the store: compact keys (status and resource id, the reply
 * rebuilt on replay), also for a duplicate that waited for the first in memory; a reply saved in full on
 * a compact route; the errors a compact replay can end in; and a commit that the database refuses after
 * the handler ran (a deferred constraint). PGlite always; pg and postgres.js on the real server.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Claim, StoredResponse } from "../../src/core/index.ts";
import type { Tx } from "../../src/postgres/db.ts";
import { CompactWithoutRebuildError } from "../../src/postgres/keys/row.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { backends, type OpenDb } from "../helpers/db.ts";
import { latch } from "../helpers/latch.ts";

const enc = new TextEncoder();
const text = (r: StoredResponse) => new TextDecoder().decode(r.body);

const claimOf = (key: string): Claim => paymentClaim("acct_forms", key, '{"amount_cents":700}');

const reply = (status: number, id: string, state: string): StoredResponse => ({
  status,
  headers: [
    ["content-type", "application/json"],
    ["location", `/v1/payments/${id}`],
  ],
  body: enc.encode(JSON.stringify({ id, state })),
});

/** Creates a payment; saved compact (its id) when it succeeded, in full when declined (402). */
async function pay(tx: Tx, id: string, declined = false) {
  await tx.query("INSERT INTO payments (id, state) VALUES ($1, $2)", [id, declined ? "declined" : "paid"]);
  const response = reply(declined ? 402 : 201, id, declined ? "declined" : "paid");
  return declined ? { response, save: response } : { response, save: response, compactId: id };
}

let rebuilds = 0;
/** The route's rebuild: the reply from the payment as it is now. */
async function rebuild(saved: { status: number; id: string }, tx: Tx): Promise<StoredResponse> {
  rebuilds++;
  const { rows } = await tx.query<{ state: string }>("SELECT state FROM payments WHERE id = $1", [saved.id]);
  return reply(saved.status, saved.id, rows[0]!.state);
}

describe.each(backends)("saved answers in their forms, on $name", (backend) => {
  let open: OpenDb;
  let store: PostgresStore;

  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    await open.db.exec(`CREATE TABLE payments (id text PRIMARY KEY, state text NOT NULL);
      CREATE TABLE refunds (id serial PRIMARY KEY,
        payment text NOT NULL REFERENCES payments (id) DEFERRABLE INITIALLY DEFERRED)`);
    store = await PostgresStore.open(open.db);
  });
  afterAll(async () => {
    await open?.close();
  });

  it("a compact key is rebuilt on replay, also for a duplicate that waited for the first", async () => {
    const c = claimOf("k-compact");
    const [gate, release] = latch();
    const [holding, running] = latch();
    const first = store.atomic(
      c,
      async (tx) => {
        const r = await pay(tx, "pay_compact");
        running();
        await gate;
        return r;
      },
      { rebuild },
    );
    await holding;
    const before = rebuilds;
    const dup = store.atomic(
      c,
      async () => {
        throw new Error("must not run");
      },
      { rebuild },
    );
    await new Promise((r) => setTimeout(r, 50));
    release();
    expect((await first).kind).toBe("executed");
    const replay = await dup;
    expect(replay.kind).toBe("replayed");
    expect(replay.response.status).toBe(201);
    expect(text(replay.response)).toBe('{"id":"pay_compact","state":"paid"}');
    expect(rebuilds).toBe(before + 1);
    await open.db.query("UPDATE payments SET state = 'refunded' WHERE id = 'pay_compact'");
    const later = await store.atomic(
      c,
      async () => {
        throw new Error("must not run");
      },
      { rebuild },
    );
    expect(text(later.response)).toBe('{"id":"pay_compact","state":"refunded"}');
  });

  it("a reply saved in full on a compact route (a decline) replays byte for byte, without a rebuild", async () => {
    const c = claimOf("k-declined");
    const first = await store.atomic(c, (tx) => pay(tx, "pay_declined", true), { rebuild });
    expect(first).toMatchObject({ kind: "executed", saved: true });
    const before = rebuilds;
    const again = await store.atomic(
      c,
      async () => {
        throw new Error("must not run");
      },
      { rebuild },
    );
    expect(again.kind).toBe("replayed");
    expect(again.response.status).toBe(402);
    expect(Buffer.from(again.response.body)).toEqual(Buffer.from(first.response.body));
    expect(again.response.headers).toEqual(first.response.headers);
    expect(rebuilds).toBe(before);
  });

  it("a compact key retried on a route that cannot rebuild is refused, saying how to fix it", async () => {
    const c = claimOf("k-no-rebuild");
    await store.atomic(c, (tx) => pay(tx, "pay_no_rebuild"), { rebuild });
    const err = await store
      .atomic(c, async () => {
        throw new Error("must not run");
      })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CompactWithoutRebuildError);
    expect(err).toMatchObject({ name: "CompactWithoutRebuildError" });
    expect((err as Error).message).toMatch(
      /compact form .* replay it through a route with `compact\.rebuild`/,
    );
  });

  it("a rebuild that fails comes out as its own error", async () => {
    const c = claimOf("k-rebuild-fails");
    await store.atomic(c, (tx) => pay(tx, "pay_rebuild_fails"), { rebuild });
    const gone = new Error("payment archived");
    const err = await store
      .atomic(
        c,
        async () => {
          throw new Error("must not run");
        },
        {
          rebuild: async () => {
            throw gone;
          },
        },
      )
      .catch((e: unknown) => e);
    expect(err).toBe(gone);
  });

  it("a commit the database refuses (a deferred constraint) comes out as its error; the handler ran once", async () => {
    const c = claimOf("k-deferred");
    let runs = 0;
    const refund = async (tx: Tx, payment: string) => {
      runs++;
      await tx.query("INSERT INTO refunds (payment) VALUES ($1)", [payment]);
      const response = reply(201, payment, "refunded");
      return { response, save: response };
    };
    const err = await store.atomic(c, (tx) => refund(tx, "pay_missing")).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "23503" });
    expect(runs).toBe(1);
    const { rows } = await open.db.query("SELECT count(*)::int AS n FROM refunds");
    expect(rows[0]).toEqual({ n: 0 });
    // Nothing was saved under the key: a corrected retry runs.
    await open.db.query("INSERT INTO payments (id, state) VALUES ('pay_real', 'paid')");
    expect(await store.atomic(c, (tx) => refund(tx, "pay_real"))).toMatchObject({ kind: "executed" });
  });
});
