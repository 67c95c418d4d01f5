/**
 * The payment flow of the spec's scenario table, on a fresh database and a fresh provider simulator:
 *   started  (external) charge the provider with `<scope>:<key>`; a decline is a final 402
 *   charged  (local)    insert the payment row and one receipt-email outbox row, answer 201
 */
import { type Claim, downstreamKey, RetryableError, type StoredResponse } from "../../src/core/index.ts";
import type { Db } from "../../src/postgres/db.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import {
  definePhases,
  jsonResponse,
  type PhaseContext,
  type PhaseFaults,
  type PhaseStore,
  type PhasesOptions,
} from "../../src/postgres/phases/index.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { type Provider, type ProviderOptions, startProvider } from "../../src/testing/provider.ts";
import { chargeProvider, findCharges } from "../../src/testing/provider-client.ts";
import { paymentClaim } from "../helpers/claim.ts";
import { backends, type OpenDb, serverBackends, type TestBackend } from "../helpers/db.ts";
import { TestTime } from "../helpers/time.ts";

export const LEASE_MS = 30_000;

/**
 * The real server's drivers when DATABASE_URL is set, else PGlite: for files whose behaviour does not
 * depend on the driver, so that the suite does not pay for one more embedded database start-up.
 */
export const serverOrEmbedded: TestBackend[] = serverBackends.length > 0 ? serverBackends : backends;

export interface PayInput {
  amount_cents: number;
  currency: string;
}
export type PayData = { chargeId: string };

export function claimOf(scope: string, key: string, input: PayInput | Record<string, unknown>): Claim {
  return paymentClaim(scope, key, JSON.stringify(input));
}

export interface World {
  open: OpenDb;
  db: Db;
  store: PostgresStore;
  provider: Provider;
  /** The time the store's statements read (epoch ms); advance it to expire leases. */
  now: TestTime;
  runner(options?: RunnerOptions): ReturnType<typeof paymentsRunner>;
  counts(key?: string): Promise<{ charges: number; declined: number; receipts: number; payments: number }>;
  point(scope: string, key: string): Promise<string | undefined>;
  lease(scope: string, key: string): Promise<{ lease_token: string | null; updated_at: Date | null }>;
  close(): Promise<void>;
}

export interface RunnerOptions {
  faults?: PhaseFaults;
  onLeaseTakeover?: PhasesOptions<PayInput, PayData>["onLeaseTakeover"];
  heartbeatMs?: number;
  /** Runs inside the external phase just before the provider call (a slow worker's stall). */
  beforeCharge?: (ctx: PhaseContext<PayInput, PayData>) => Promise<void>;
  /** The provider call's own timeout. Default 2,000 ms. */
  timeoutMs?: number;
  name?: string;
  /** The answer bound. Default here: none (Infinity), so a slow machine never turns a result into a 409. */
  answerWithinMs?: number;
  /**
   * A provider WITHOUT idempotency keys (`startProvider({ idempotency: false })`): the charge carries
   * our reference, and the phase either looks its effect up by it ("search") or cannot ("none").
   * Default: the provider dedups by our key.
   */
  noIdempotency?: "search" | "none";
  maxLookupFailures?: number;
}

export function paymentsRunner(store: PhaseStore, providerUrl: string, o: RunnerOptions = {}) {
  return definePhases<PayInput, PayData>({
    store,
    name: o.name ?? "payments",
    leaseMs: LEASE_MS,
    heartbeatMs: o.heartbeatMs ?? 0,
    answerWithinMs: o.answerWithinMs ?? Number.POSITIVE_INFINITY,
    maxLookupFailures: o.maxLookupFailures,
    faults: o.faults,
    onLeaseTakeover: o.onLeaseTakeover,
    phases: {
      started: {
        external: async (ctx) => {
          await o.beforeCharge?.(ctx);
          const r = await chargeProvider(providerUrl, {
            amount: ctx.input.amount_cents,
            currency: ctx.input.currency,
            ...(o.noIdempotency ? { reference: ctx.idempotencyKey } : { idempotencyKey: ctx.idempotencyKey }),
            timeoutMs: o.timeoutMs ?? 2_000,
            signal: ctx.signal,
          });
          if (r.kind === "declined") return { response: jsonResponse(402, { error: "card declined" }) };
          if (r.kind === "charged") return { data: { chargeId: r.charge.id } };
          if (r.kind === "rejected") return { response: jsonResponse(400, { error: r.message }) };
          throw new RetryableError(`provider: ${r.reason}`);
        },
        ...(o.noIdempotency === "none" ? { idempotent: false } : {}),
        ...(o.noIdempotency === "search"
          ? {
              lookup: async (ctx: PhaseContext<PayInput, PayData>) => {
                const [charge] = await findCharges(providerUrl, ctx.idempotencyKey, { timeoutMs: 1_000 });
                if (!charge) return undefined;
                if (charge.status === "failed")
                  return { response: jsonResponse(402, { error: "card declined" }) };
                return { data: { chargeId: charge.id } };
              },
            }
          : {}),
        next: "charged",
      },
      charged: {
        needs: ["chargeId"],
        local: async (ctx, tx) => {
          const chargeId = ctx.data.chargeId!;
          await tx.query(
            "INSERT INTO payments (charge_id, scope, key, amount_cents) VALUES ($1, $2, $3, $4)",
            [chargeId, ctx.scope, ctx.key, ctx.input.amount_cents],
          );
          await writeOutbox(tx, {
            topic: "receipt-email",
            type: "payment.succeeded",
            aggregateType: "payment",
            aggregateId: chargeId,
            payload: { charge: chargeId, amount_cents: ctx.input.amount_cents },
          });
          return { response: jsonResponse(201, { charge: chargeId, amount_cents: ctx.input.amount_cents }) };
        },
      },
    },
  });
}

export async function openWorld(
  backend: TestBackend,
  providerOptions: ProviderOptions = {},
  storeOptions: { retentionMs?: number } = {},
): Promise<World> {
  const open = await backend.open();
  const db = open.db;
  await migrate(db);
  // No unique index on charge_id on purpose: a second payment row for one charge must be countable.
  await db.exec(`CREATE TABLE payments (
    id serial PRIMARY KEY, charge_id text NOT NULL, scope text NOT NULL, key text NOT NULL,
    amount_cents int NOT NULL)`);
  const now = new TestTime(Date.UTC(2030, 4, 6, 12));
  const store = await PostgresStore.open(db, { timeShift: now, ...storeOptions });
  const provider = await startProvider({ seed: 7, ...providerOptions });
  const count = async (sql: string, params: unknown[] = []) =>
    (await db.query<{ n: number }>(sql, params)).rows[0]!.n;
  return {
    open,
    db,
    store,
    provider,
    now,
    runner: (o) => paymentsRunner(store, provider.url, o),
    async counts(key) {
      // The downstream keys of every claim of `key` still in the table (they name the claim, not the key).
      const mine = new Set(key ? await downstreamKeys(db, key) : []);
      const charges = provider
        .charges()
        .filter((c) => !key || mine.has(c.idempotency_key ?? "") || mine.has(c.reference ?? ""));
      return {
        charges: charges.filter((c) => c.status === "succeeded").length,
        declined: charges.filter((c) => c.status === "failed").length,
        receipts: await count(
          key
            ? "SELECT count(*)::int AS n FROM idem.outbox o JOIN payments p ON p.charge_id = o.aggregate_id WHERE o.topic = 'receipt-email' AND p.key = $1"
            : "SELECT count(*)::int AS n FROM idem.outbox WHERE topic = 'receipt-email'",
          key ? [key] : [],
        ),
        payments: await count(
          key
            ? "SELECT count(*)::int AS n FROM payments WHERE key = $1"
            : "SELECT count(*)::int AS n FROM payments",
          key ? [key] : [],
        ),
      };
    },
    async point(scope, key) {
      return (await store.inspect(scope, key))?.recoveryPoint;
    },
    async lease(scope, key) {
      const k = await store.inspect(scope, key);
      if (!k) throw new Error(`no key ${scope}/${key}`);
      return { lease_token: k.lease?.token ?? null, updated_at: k.updatedAt };
    },
    async close() {
      await provider.close();
      await open.close();
    },
  };
}

/** The downstream keys (`ctx.idempotencyKey`) of every claim of `key` still in the keys table. */
export async function downstreamKeys(db: Db, key: string): Promise<string[]> {
  const { rows } = await db.query<{ scope: string; claim_id: string | null }>(
    "SELECT scope, claim_id::text AS claim_id FROM idem.keys WHERE key = $1 AND NOT marker",
    [key],
  );
  return rows.map((r) => downstreamKey(r.scope, key, r.claim_id));
}

export const text = (r: StoredResponse) => new TextDecoder().decode(r.body);

export function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
