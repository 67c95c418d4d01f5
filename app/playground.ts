/**
 * The playground: a page at `/` that lets a person feel the problem (app/playground/), and the few JSON
 * endpoints it needs under `/playground/api/*`. Served ONLY with the demo accounts (embedded database or
 * IDEM_DEMO=1): these endpoints pay as the demo account without an API key.
 *
 *   POST /playground/api/pay    send one payment attempt as the demo account, with a chosen fault, and
 *                               report what the client saw (or that it saw nothing)
 *   GET  /playground/api/state  the key as the store shows it (`store.inspect`: recovery point, lease),
 *                               its payment, the demo account's provider charges, outbox and emails
 *
 * They show only the demo account's data, and never an internal error: a failure is logged and
 * answered with a generic problem.
 *
 * Attempts without a server-side fault go to the service itself, in process, through every middleware,
 * exactly as a client's request would. The crash and slow-worker faults need crash points, which the
 * public route never has: such attempts run on a second instance of the payments route, built for that
 * one attempt with `faults` and a short lease, and called at the same path (`/v1/payments`), so that the
 * request's fingerprint is the same and a retry on the public route resumes it.
 */
import { readFile } from "node:fs/promises";
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import { downstreamKey, formatIdempotencyKey } from "idem";
import type { Db, PhaseFaults, PostgresStore } from "idem/postgres";
import { crashAt, listCharges, pauseAt } from "idem/testing";
import type { Logger } from "pino";
import type { ApiKeys } from "./accounts.ts";
import { DEMO_ACCOUNTS } from "./accounts.ts";
import { MAX_BODY_BYTES } from "./payments.ts";
import { paymentPhasesRoutes } from "./payments-phases.ts";
import { stormRoutes } from "./playground-storm.ts";
import { problem, unavailableProblem } from "./problems.ts";
import {
  PLAYGROUND_FAULTS,
  type PlaygroundFault,
  type PlaygroundPayInput,
  PlaygroundPayRequest,
} from "./schemas.ts";
import { validBody } from "./validate.ts";

export { PLAYGROUND_FAULTS, type PlaygroundFault };

type Env = { Variables: { log?: Logger; body: PlaygroundPayInput } };

export interface PlaygroundOptions {
  db: Db;
  store: PostgresStore;
  apiKeys: ApiKeys;
  /** The payment provider's base URL (its charges are shown). Required. */
  providerUrl: string;
  /** The service itself (its `fetch`), for attempts without a server-side fault. Required. */
  service: (request: Request) => Response | Promise<Response>;
  /** Lease of the faulty worker's attempts, so that a crashed one frees its key soon. Default: 3,000 ms. */
  leaseMs?: number;
  /** How long the slow worker stalls (past its lease) before it carries on. Default: 2 × leaseMs + 1,000. */
  slowMs?: number;
  /** Whether a receipt-email worker runs (app/receipts.ts): its emails are shown. Default: false. */
  emailWorker?: boolean;
  /** The card-token key of the service's routes (IDEM_CARD_TOKEN_KEY), so both tokenize a card alike. */
  cardTokenKey?: string;
}

const ACCOUNT = DEMO_ACCOUNTS[0];
const STATIC: Record<string, string> = {
  "index.html": "text/html; charset=utf-8",
  "playground.js": "text/javascript; charset=utf-8",
  "playground.css": "text/css; charset=utf-8",
  "storm.js": "text/javascript; charset=utf-8",
  "storm-formula.js": "text/javascript; charset=utf-8",
  "favicon.svg": "image/svg+xml",
};

/** What the playground tells the page about one attempt. */
export interface AttemptReport {
  key: string;
  amount_cents: number;
  card: string | null;
  fault: PlaygroundFault;
  /** `public route` (the service itself) or `faulty worker` (the second route instance with crash points). */
  via: "public route" | "faulty worker";
  /** False when the client got nothing: the reply was lost, or the server crashed. */
  answered: boolean;
  /** Why there was no answer. */
  silence?: "reply lost" | "server crashed";
  status?: number;
  replayed?: boolean;
  expires?: string | null;
  retryAfter?: string | null;
  location?: string | null;
  /** `Idempotency-Operation-State` (problem answers): where the operation stands, for the next step. */
  operationState?: string | null;
  body?: unknown;
  ms: number;
}

export function playgroundRoutes(o: PlaygroundOptions): Hono<Env> {
  const app = new Hono<Env>();
  const leaseMs = o.leaseMs ?? 3_000;
  const slowMs = o.slowMs ?? 2 * leaseMs + 1_000;
  const dir = new URL("./playground/", import.meta.url);
  const schema = o.store.schema;

  const file = (name: string) => async () => {
    const body = await readFile(new URL(name, dir));
    return new Response(body, { headers: { "content-type": STATIC[name]!, "cache-control": "no-store" } });
  };
  app.get("/", file("index.html"));
  app.get("/playground/playground.js", file("playground.js"));
  app.get("/playground/playground.css", file("playground.css"));
  // The look the playground shares with the operations console: the console's own stylesheet.
  app.get("/playground/look.css", async () => {
    const body = await readFile(new URL("../src/admin/console/look.css", import.meta.url));
    return new Response(body, {
      headers: { "content-type": STATIC["playground.css"]!, "cache-control": "no-store" },
    });
  });
  app.get("/playground/favicon.svg", file("favicon.svg"));
  app.get("/playground/storm.js", file("storm.js"));
  app.get("/playground/storm-formula.js", file("storm-formula.js"));
  app.route("/", stormRoutes(o)); // the retry-storm calculator's live mode
  // Browsers ask for /favicon.ico on pages without an icon link (the JSON ones): the same icon.
  app.get("/favicon.ico", file("favicon.svg"));

  const limit = bodyLimit({
    maxSize: MAX_BODY_BYTES,
    onError: () => problem(413, "body-too-large", `The body is larger than ${MAX_BODY_BYTES} bytes.`),
  });
  // A generic answer for anything unexpected: the error goes to the log, never to the page.
  app.onError((err, c) => {
    const unavailable = unavailableProblem(err); // the database down or failing over: 503, retry
    if (unavailable) return unavailable;
    c.var.log?.error({ err }, "playground failed");
    return problem(500, "internal-error", "The playground failed; see the service's log.");
  });

  app.post("/playground/api/pay", limit, validBody(PlaygroundPayRequest, { what: "attempt" }), async (c) => {
    const { key, amount_cents: amount } = c.var.body;
    const fault: PlaygroundFault = c.var.body.fault ?? "none";
    const card = c.var.body.card ? c.var.body.card : null;
    const init: RequestInit = {
      method: "POST",
      headers: {
        authorization: `Bearer ${ACCOUNT.apiKey}`,
        "content-type": "application/json",
        "idempotency-key": formatIdempotencyKey(key),
      },
      body: JSON.stringify({ amount_cents: amount, currency: "eur", ...(card ? { card } : {}) }),
    };
    const started = performance.now();
    const report: AttemptReport = {
      key,
      amount_cents: amount,
      card,
      fault,
      via: "public route",
      answered: true,
      ms: 0,
    };
    let res: Response | undefined;
    if (fault === "crash-after-charge" || fault === "slow-worker") {
      report.via = "faulty worker";
      res = await faultyAttempt(fault, key, init, c.var.log);
    } else {
      res = await o.service(new Request("http://playground.internal/v1/payments", init));
    }
    const text = res ? await res.text() : "";
    report.ms = Math.round(performance.now() - started);
    if (!res) {
      report.answered = false;
      report.silence = "server crashed";
    } else if (fault === "lose-reply") {
      // The service did the work and answered; the answer never reaches the client.
      report.answered = false;
      report.silence = "reply lost";
    } else {
      report.status = res.status;
      report.replayed = res.headers.get("idempotent-replayed") === "true";
      report.expires = res.headers.get("idempotency-expires");
      report.retryAfter = res.headers.get("retry-after");
      report.location = res.headers.get("location");
      report.operationState = res.headers.get("idempotency-operation-state");
      try {
        report.body = JSON.parse(text);
      } catch {
        report.body = text;
      }
    }
    return c.json(report);
  });

  /** One attempt on a route instance of its own with a crash point; undefined when it "crashed". */
  async function faultyAttempt(
    fault: "crash-after-charge" | "slow-worker",
    key: string,
    init: RequestInit,
    log: Logger | undefined,
  ): Promise<Response | undefined> {
    let faults: PhaseFaults;
    if (fault === "crash-after-charge") {
      // The provider charged the card; the process dies before the recovery point says so.
      faults = crashAt("after-external", { phase: "started", key });
    } else {
      // The charge is recorded; then the worker stalls before the local phase, without a heartbeat,
      // past its lease. A retry may take the key over; when this worker wakes, its fenced write fails.
      const stall = pauseAt("before-phase", { phase: "charged", key });
      stall.reached.then(() => setTimeout(stall.release, slowMs).unref?.());
      faults = stall;
    }
    const worker = new Hono();
    // The faulty worker holds its caller past the stall, so the page shows how its attempt really ends.
    worker.route("/", paymentPhasesRoutes({ ...o, leaseMs, faults, answerWithinMs: slowMs + 10_000 }));
    let crashed = false;
    worker.onError((err) => {
      if (err.name !== "SimulatedCrashError") {
        log?.error({ err }, "playground: the faulty worker failed");
        return problem(500, "internal-error", "The faulty worker failed; see the service's log.");
      }
      crashed = true; // like a dead process: no answer at all
      return new Response(null, { status: 500 });
    });
    const res = await worker.request("/v1/payments", init);
    return crashed ? undefined : res;
  }

  app.get("/playground/api/state", async (c) => {
    const key = c.req.query("key") || null;
    const now = Date.now();
    const state: Record<string, unknown> = { now: new Date(now).toISOString(), account: ACCOUNT.id, key };

    // The key as the store shows it (the newest row, if the key was reused after it expired).
    let chargeId: string | null = null;
    // What the provider knows this claim of the key by (a reused key's new claim has a new one).
    let downstream: string | null = null;
    if (key) {
      const k = await o.store.inspect(ACCOUNT.id, key);
      downstream = k ? downstreamKey(ACCOUNT.id, key, k.claimId) : null;
      chargeId = typeof k?.phaseData?.chargeId === "string" ? k.phaseData.chargeId : null;
      state.row = k
        ? {
            recovery_point: k.recoveryPoint,
            state: k.state,
            status: k.saved?.status ?? null,
            lease_token: k.lease?.token ?? null,
            lease_until: k.lease ? k.lease.until.toISOString() : null,
            lease_left_ms: k.lease ? k.lease.until.getTime() - now : null,
            runner: k.runner,
            phase_data: k.phaseData,
            operation_ref: k.ref,
            created_at: k.createdAt.toISOString(),
            updated_at: k.updatedAt ? k.updatedAt.toISOString() : null,
          }
        : null;
    }

    // The provider's charges: this key's, and the demo account's latest.
    try {
      const all = await listCharges(o.providerUrl, { scope: ACCOUNT.id });
      const mine = downstream
        ? all.filter((ch) => ch.idempotency_key === downstream || ch.reference === downstream)
        : [];
      state.charges = { total: all.length, forKey: mine, recent: all.slice(-8).reverse() };
      chargeId ??= mine.find((ch) => ch.status === "succeeded")?.id ?? null;
    } catch (err) {
      c.var.log?.error({ err }, "playground: the payment provider did not answer");
      state.charges = { error: "the payment provider did not answer" };
    }

    // The payment made from this key's charge (its id is derived from the charge id).
    const paymentId = chargeId ? `pay_${chargeId.replace(/^ch_/, "")}` : null;
    const payments = paymentId
      ? (
          await o.db.query<Record<string, unknown>>(
            "SELECT id, amount_cents, currency, status, created_at FROM payments WHERE id = $1 AND account_id = $2",
            [paymentId, ACCOUNT.id],
          )
        ).rows.map((p) => ({ ...p, amount_cents: Number(p.amount_cents), created_at: iso(p.created_at) }))
      : [];
    state.payments = payments;

    // The outbox: receipt emails waiting for (or published by) the relay.
    const { rows: outbox } = await o.db.query<Record<string, unknown>>(
      `SELECT id, topic, type, payload, attempts, published_at, created_at FROM ${schema}.outbox
        WHERE topic = 'receipt-email' AND payload->>'account' = $1 ORDER BY id DESC LIMIT 8`,
      [ACCOUNT.id],
    );
    const forKey = paymentId
      ? (
          await o.db.query<Record<string, unknown>>(
            `SELECT id, topic, type, payload, attempts, published_at, created_at FROM ${schema}.outbox
              WHERE topic = 'receipt-email' AND payload->>'payment' = $1 AND payload->>'account' = $2
              ORDER BY id`,
            [paymentId, ACCOUNT.id],
          )
        ).rows
      : [];
    const shape = (r: Record<string, unknown>) => ({
      id: String(r.id),
      type: r.type,
      payment: (r.payload as { payment?: string } | null)?.payment ?? null,
      attempts: Number(r.attempts),
      published_at: iso(r.published_at),
      created_at: iso(r.created_at),
    });
    state.outbox = { forKey: forKey.map(shape), recent: outbox.map(shape) };

    // The emails sent, if a receipt worker runs (app/receipts.ts); otherwise say there is none. (Its
    // table exists either way: the owner's migration makes it.)
    if (o.emailWorker) {
      state.emails = { worker: true, ...(await sentEmails(o.db, paymentId, c.var.log)) };
    } else {
      state.emails = { worker: false, total: 0, forKey: [], recent: [] };
    }
    return c.json(state);
  });

  return app;
}

/**
 * The demo account's sent emails, as app/receipts.ts records them (message_id, payment_id, account_id,
 * amount_cents, sent_at); with any other shape of the table, none (and the error is logged).
 */
async function sentEmails(db: Db, paymentId: string | null, log: Logger | undefined) {
  try {
    const [recent, total, forKey] = await Promise.all([
      db.query<Record<string, unknown>>(
        "SELECT message_id, payment_id, amount_cents, sent_at FROM sent_emails WHERE account_id = $1 ORDER BY sent_at DESC LIMIT 8",
        [ACCOUNT.id],
      ),
      db.query<{ n: number }>("SELECT count(*)::int AS n FROM sent_emails WHERE account_id = $1", [
        ACCOUNT.id,
      ]),
      db.query<Record<string, unknown>>(
        "SELECT message_id, payment_id, amount_cents, sent_at FROM sent_emails WHERE payment_id = $1 AND account_id = $2",
        [paymentId ?? "", ACCOUNT.id],
      ),
    ]);
    const shape = (r: Record<string, unknown>) => ({
      ...r,
      amount_cents: Number(r.amount_cents),
      sent_at: iso(r.sent_at),
    });
    return {
      total: Number(total.rows[0]?.n ?? 0),
      forKey: forKey.rows.map(shape),
      recent: recent.rows.map(shape),
    };
  } catch (err) {
    log?.error({ err }, "playground: the sent emails could not be read");
    return { total: 0, forKey: [], recent: [], error: "the sent emails could not be read" };
  }
}

function iso(v: unknown): string | null {
  if (v === null || v === undefined) return null;
  return new Date(v as string).toISOString();
}
