/**
 * The webhook receiver: a delivery is verified by its scheme, then its event goes through the inbox,
 * whose mark of the event id commits in the same transaction as the handler's effect.
 *
 * Timeline of one delivery (acknowledge "after-effect", the default):
 *
 *   verify   the scheme checks the signature over the raw bytes, and the timestamp's age
 *            -> 400 (headers missing or malformed, body not the scheme's event) or 401 (signature,
 *               timestamp outside the tolerance); nothing is written
 *   BEGIN
 *     inbox mark (consumer, event id)  -> already there: ROLLBACK, 200 "duplicate" (a copy arriving
 *                                         while another is being applied waits for it on the mark's
 *                                         unique index, then sees its outcome)
 *     handler(event, { tx })           -> the effect, in the same transaction
 *   COMMIT -> 200 "applied" (or "stale": taken in, an older state not applied; recorded in the mark)
 *
 *   Deliveries that arrive while a transaction is busy wait for the next one and share it (the
 *   consumers' `Settler`: up to `batchSize` marks and effects per commit, `concurrency` commits at once); each still gets its own
 *   answer. A handler that throws rolls its batch back, and the batch is applied one by one.
 *
 *   the handler threw: ROLLBACK, the attempt is counted -> 500 (the sender retries); at `maxAttempts`
 *   the event is parked with its body (idem/admin, the console) -> 200 "parked", later copies 200
 *   "duplicate" until an operator unparks it. The database unreachable: 503, nothing marked.
 *
 * With acknowledge "on-receipt" the verified delivery is written into the outbox and answered 202 at
 * once; a relay with `receiver.publisher()` (or `receiver.startWorker()`) then runs it through the
 * same inbox and handler, retrying with the relay's backoff (senders with short timeouts).
 */
import type { ServerResponse } from "node:http";
import type { Db, Tx } from "../core/db.ts";
import { isDatabaseUnavailable } from "../core/index.ts";
import { problemResponse } from "../core/problem.ts";
import type { StoredResponse } from "../core/response.ts";
import { newStats, Settler } from "../messaging/consumer.ts";
import { Inbox, InboxResult } from "../messaging/inbox.ts";
import { Relay } from "../messaging/relay.ts";
import type { RelayOptions } from "../messaging/relay-options.ts";
import {
  type Delivery,
  errorOf,
  type OutboxMessage,
  type Publisher,
  type PublishOutcome,
} from "../messaging/types.ts";
import { versionedUpsert } from "../messaging/versioned-upsert.ts";
import { WebhookVerificationError } from "../messaging/webhook.ts";
import { writeOutbox } from "../postgres/outbox.ts";
import { schemaOf } from "../postgres/schema/migrate.ts";
import {
  BODY_PARSED_FIX,
  type FastifyLikeReply,
  type FastifyLikeRequest,
  fastifyPlugin,
  type HonoLikeContext,
  type NodeLikeRequest,
  receiveFastify,
  receiveFetch,
  receiveHono,
  receiveNest,
  receiveNode,
} from "./adapters.ts";
import { type WebhookBodyParsedError, WebhookPayloadError } from "./errors.ts";
import { bodyText, type VerifiedWebhook, type WebhookInput, type WebhookScheme } from "./scheme.ts";
import type {
  WebhookContext,
  WebhookEvent,
  WebhookHandler,
  WebhookOutcome,
  WebhookReceiverOptions,
} from "./types.ts";

/** A delivery on its way through the inbox, and what became of it. */
interface Pending<P> extends Delivery {
  event: WebhookEvent<P>;
  /** Set by the handler's transaction: applied, or taken in as stale. */
  outcome?: "applied" | "stale";
  /** The handler threw (rather than the database failing). */
  failed?: boolean;
}

/**
 * The inbox, leaving on each delivery of a batch only an outcome that committed: a batch rolled back
 * (another delivery's handler threw) is applied again one by one, and by then a copy of an event may
 * have been applied elsewhere, which makes this delivery a duplicate after all.
 */
class OutcomeInbox extends Inbox {
  override async processBatch<M extends Delivery>(
    messages: readonly M[],
    handler: Parameters<Inbox["processBatch"]>[1],
  ): Promise<InboxResult[]> {
    const results = await super.processBatch(messages, handler as never);
    results.forEach((r, i) => {
      if (r !== InboxResult.applied) (messages[i] as Partial<Pending<unknown>>).outcome = undefined;
    });
    return results;
  }
}

/** The outbox row of an event acknowledged on receipt (`acknowledge: "on-receipt"`). */
interface StoredEvent {
  event: Omit<WebhookEvent, "payload" | "createdAt"> & { createdAt: string | null };
  /** The payload as JSON text (kept as a string, so that jsonb does not reorder it). */
  payload: string;
}

const encoder = new TextEncoder();
const UNAVAILABLE = () =>
  problemResponse(503, "database-unavailable", "The event could not be recorded; deliver it again.", {
    headers: [["retry-after", "1"]],
  });
const FAILED = () =>
  problemResponse(500, "webhook-failed", "The event could not be recorded; deliver it again.");

function json(status: number, body: Record<string, unknown>): StoredResponse {
  return {
    status,
    headers: [["content-type", "application/json"]],
    body: encoder.encode(JSON.stringify(body)),
  };
}

/** A receiver of one endpoint's deliveries (see {@link webhookReceiver}). */
export class WebhookReceiver<P = unknown> {
  /** The inbox that deduplicates and parks this endpoint's events. */
  readonly inbox: Inbox;
  /** The outbox topic of events acknowledged on receipt (for a relay's `topics`). */
  readonly topic: string;
  /** The largest body read, in bytes. */
  readonly limit: number;
  /** The scheme deliveries are checked with. */
  readonly scheme: WebhookScheme;
  readonly #db: Db;
  readonly #schema: string;
  readonly #handler: WebhookHandler<P>;
  readonly #onReceipt: boolean;
  readonly #now: () => number;
  readonly #onError: (err: Error, event?: WebhookEvent) => void;
  readonly #settler: Settler;

  constructor(options: WebhookReceiverOptions<P>) {
    if (!options.db || !options.scheme || typeof options.handler !== "function") {
      throw new TypeError("webhookReceiver needs db, scheme and handler");
    }
    this.#db = options.db;
    this.#schema = schemaOf(options);
    this.scheme = options.scheme;
    this.#handler = options.handler;
    const consumer = options.consumer ?? `webhook:${options.scheme.name}`;
    this.inbox = new OutcomeInbox(options.db, {
      consumer,
      schema: options.schema,
      maxAttempts: options.maxAttempts,
    });
    this.topic = `idem.webhook.${consumer}`;
    this.limit = options.limit ?? 1024 * 1024;
    this.#onReceipt = options.acknowledge === "on-receipt";
    this.#now = options.now ?? Date.now;
    this.#onError = options.onError ?? ((err) => console.error(err));
    this.#settler = new Settler(
      {
        inbox: this.inbox,
        handler: (tx, m) => this.#apply(tx, m as Pending<P>),
        // Small batches, several at once: see docs/decisions/webhook-deliveries-share-transactions.md.
        batchSize: options.batchSize ?? 16,
        concurrency: options.concurrency ?? 8,
        onError: (err) => this.#onError(err),
      },
      newStats(),
    );
  }

  /**
   * Take one delivery (its headers and raw body) and answer it. The framework adapters
   * (`receiver.fetch`, `.node`, `.express`, `.fastify`, `.hono`, `.nest`) read the body and call this.
   */
  async receive(input: Omit<WebhookInput, "nowS">): Promise<StoredResponse> {
    let verified: VerifiedWebhook;
    let rawBody: string;
    try {
      verified = this.scheme.verify({ ...input, nowS: Math.floor(this.#now() / 1000) });
      rawBody = bodyText(input.body);
    } catch (err) {
      if (err instanceof WebhookVerificationError) {
        const status = err.reason === "signature" || err.reason === "timestamp" ? 401 : 400;
        return problemResponse(status, `webhook-${err.reason}`, err.message);
      }
      if (err instanceof WebhookPayloadError) return problemResponse(400, "webhook-payload", err.message);
      this.#onError(errorOf(err)); // a scheme of your own that failed otherwise
      return FAILED();
    }
    const event: WebhookEvent<P> = {
      id: verified.id,
      type: verified.type,
      payload: verified.payload as P,
      rawBody,
      createdAt: verified.createdAt,
      scheme: this.scheme.name,
      headers: verified.headers,
    };
    try {
      if (this.#onReceipt) return await this.#store(event);
      const outcome = await this.#settle(event);
      if (outcome === "unavailable") return UNAVAILABLE();
      if (outcome === "retry") {
        return problemResponse(
          500,
          "webhook-handler-failed",
          "The event's handler failed; nothing was applied. Deliver it again.",
        );
      }
      return json(200, { received: true, id: event.id, result: outcome });
    } catch (err) {
      this.#onError(errorOf(err), event);
      return isDatabaseUnavailable(err) ? UNAVAILABLE() : FAILED();
    }
  }

  /** The answer to a setup whose body parser ran first: 500 with the fix, reported through `onError`. */
  misconfigured(err: WebhookBodyParsedError): StoredResponse {
    this.#onError(err);
    return problemResponse(500, "webhook-body-parsed", err.message);
  }

  /** Web `Request` -> `Response`: `export const POST = receiver.fetch` (Next.js), Bun, Deno, Workers. */
  readonly fetch = (request: Request): Promise<Response> => receiveFetch(this, request);

  /** Hono: `app.post("/webhooks/stripe", receiver.hono())`. */
  hono(): (c: HonoLikeContext) => Promise<Response> {
    return (c) => receiveHono(this, c);
  }

  /** node:http: `createServer((req, res) => receiver.node(req, res))` (route it yourself). */
  readonly node = (req: NodeLikeRequest, res: ServerResponse): Promise<void> => receiveNode(this, req, res);

  /**
   * Express: `app.post("/webhooks/stripe", receiver.express())`, registered before `express.json()`
   * (or with `express.raw()` on the route, or a `verify` that keeps `req.rawBody`).
   */
  express(): (req: NodeLikeRequest, res: ServerResponse, next: (err?: unknown) => void) => void {
    return (req, res, next) => {
      receiveNode(this, req, res, BODY_PARSED_FIX.express).catch(next);
    };
  }

  /**
   * Fastify, as a plugin whose scope reads every body as bytes:
   * `app.register(receiver.fastify, { path: "/webhooks/stripe" })`.
   */
  readonly fastify = fastifyPlugin(this);

  /** A Fastify route handler of your own, when the bytes are kept (`rawBody`, or a Buffer body). */
  readonly fastifyHandler = (request: FastifyLikeRequest, reply: FastifyLikeReply): Promise<unknown> =>
    receiveFastify(this, request, reply);

  /**
   * NestJS, on Express or Fastify, with the app created `{ rawBody: true }`:
   * `@Post("webhooks/stripe") receive(@Req() req, @Res() res) { return receiver.nest(req, res); }`
   */
  readonly nest = (req: unknown, res: unknown): Promise<unknown> => receiveNest(this, req, res);

  /**
   * Run an event through the inbox and the handler in a transaction of its own (the relay's path for
   * events acknowledged on receipt). Throws only when the database is unreachable.
   */
  async process(event: WebhookEvent<P>): Promise<WebhookOutcome> {
    const d = this.#delivery(event);
    const result = await this.inbox.process(d, (tx, m) => this.#apply(tx, m as Pending<P>));
    return result === InboxResult.applied ? (d.outcome ?? "applied") : result;
  }

  /**
   * The synchronous path: the delivery joins the deliveries waiting for a transaction (the consumers'
   * `Settler`), so that many concurrent deliveries share one commit; each is answered with its own
   * outcome. "unavailable": the database failed, not the handler.
   */
  async #settle(event: WebhookEvent<P>): Promise<WebhookOutcome | "unavailable"> {
    const d = this.#delivery(event);
    switch (await this.#settler.settle(d)) {
      case "ack":
        return d.outcome ?? "duplicate";
      case "done-failed":
        return "parked";
      default:
        return d.failed ? "retry" : "unavailable";
    }
  }

  #delivery(event: WebhookEvent<P>): Pending<P> {
    return {
      id: event.id,
      topic: event.scheme,
      type: event.type,
      body: event.rawBody,
      headers: event.headers,
      // Senders do not say whether a delivery is a retry: clear failed attempts on every success.
      redelivered: true,
      event,
    };
  }

  /** The handler in the inbox's transaction, with `applyIfNewer` counting what it wrote. */
  async #apply(tx: Tx, d: Pending<P>): Promise<void> {
    const { event } = d;
    let applied = 0;
    let skipped = 0;
    d.outcome = undefined;
    const ctx: WebhookContext = {
      tx,
      applyIfNewer: async (upsert) => {
        const version = upsert.version ?? event.createdAt;
        if (version === null) {
          throw new TypeError(
            `applyIfNewer: event ${event.id} has no creation time; give the object's version`,
          );
        }
        const wrote = await versionedUpsert(tx, { ...upsert, version });
        if (wrote) applied++;
        else skipped++;
        return wrote;
      },
      stale: () => {
        skipped++;
      },
    };
    try {
      await this.#handler(event, ctx);
    } catch (err) {
      d.failed = true;
      this.#onError(errorOf(err), event);
      throw err;
    }
    const stale = skipped > 0 && applied === 0;
    if (stale) await this.inbox.markStale(tx, event.id);
    d.outcome = stale ? "stale" : "applied";
  }

  /** Acknowledge on receipt: the event into the outbox (unless the inbox has it already), 202. */
  async #store(event: WebhookEvent<P>): Promise<StoredResponse> {
    if ((await this.inbox.statusOf(event.id)) !== null) {
      return json(200, { received: true, id: event.id, result: "duplicate" });
    }
    const { payload, createdAt, ...rest } = event;
    const stored: StoredEvent = {
      event: { ...rest, createdAt: createdAt?.toISOString() ?? null },
      payload: JSON.stringify(payload),
    };
    await this.#db.transaction((tx) =>
      writeOutbox(tx, { topic: this.topic, type: event.type, payload: stored }, { schema: this.#schema }),
    );
    return json(202, { received: true, id: event.id, result: "queued" });
  }

  /**
   * The publisher a relay hands this endpoint's stored events to (`acknowledge: "on-receipt"`): each
   * goes through the inbox and the handler; a failure is the relay's to retry with backoff.
   *
   *   new Relay({ db, publisher: receiver.publisher(), topics: [receiver.topic], listen }).start();
   */
  publisher(): Publisher {
    return {
      name: `webhook-inbox:${this.inbox.consumer}`,
      keepsOrder: true,
      publish: async (messages: readonly OutboxMessage[]): Promise<PublishOutcome[]> => {
        const outcomes: PublishOutcome[] = [];
        for (const m of messages) {
          try {
            const stored = JSON.parse(m.body) as StoredEvent;
            const { createdAt, ...rest } = stored.event;
            const outcome = await this.process({
              ...rest,
              payload: JSON.parse(stored.payload) as P,
              createdAt: createdAt === null ? null : new Date(createdAt),
            });
            outcomes.push(
              outcome === "retry"
                ? { ok: false, error: new Error(`the handler of event ${rest.id} failed`) }
                : { ok: true },
            );
          } catch (err) {
            outcomes.push({ ok: false, error: errorOf(err) });
          }
        }
        return outcomes;
      },
      close: async () => {},
    };
  }

  /**
   * Start a relay that applies the events acknowledged on receipt (`publisher()` on this receiver's
   * topic). Stop it with `await relay.stop()`.
   */
  startWorker(options: Omit<RelayOptions, "db" | "publisher" | "topics" | "schema"> = {}): Relay {
    const relay = new Relay({
      ...options,
      db: this.#db,
      schema: this.#schema,
      publisher: this.publisher(),
      topics: [this.topic],
    });
    relay.start();
    return relay;
  }
}

/**
 * A receiver for one webhook endpoint: verified, deduplicated through the inbox, the effect in the
 * mark's transaction. Serve it with an adapter: `receiver.fetch` (Web, Next.js, Hono's `c.req.raw`),
 * `receiver.node` (node:http), `receiver.express()`, `receiver.fastify`, `receiver.hono()`, `receiver.nest`.
 *
 *   const receiver = webhookReceiver({
 *     db,
 *     scheme: stripeScheme({ secret: process.env.STRIPE_WEBHOOK_SECRET! }),
 *     handler: async (event, { tx }) => { await tx.query("INSERT INTO ...", [...]); },
 *   });
 */
export function webhookReceiver<P = unknown>(options: WebhookReceiverOptions<P>): WebhookReceiver<P> {
  return new WebhookReceiver(options);
}
