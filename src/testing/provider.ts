/**
 * A payment-provider simulator: an HTTP server that behaves like a card processor, for tests, demos and
 * benchmarks of code that charges cards exactly once.
 *
 *   POST /v1/charges   {"amount": 5000, "currency": "eur", "card": "4242", "reference": "acct:k1"}
 *       with `Idempotency-Key`
 *       200 the charge; a repeat of the key returns the same charge (`Idempotent-Replayed: true`);
 *       402 card declined (also remembered under the key); 422 the key was used with other parameters;
 *       400 a malformed request; 413 a body over 64 KiB. With `idempotency: false` the key is ignored:
 *       every request charges.
 *   GET  /v1/charges   every charge made, in order, with the idempotency key it received
 *                      (`?scope=acct_1`: only those whose key is `acct_1:...`)
 *   GET  /v1/charges?reference=acct:k1   the charges made with that reference (your own id for the
 *       payment): how a caller finds out, after a lost reply, whether a provider WITHOUT idempotency
 *       keys charged. `setSearch(false)` makes it answer 503 (the search is down).
 *   GET  /v1/charges/:id
 *   /v1/refunds, /v1/reports/charges   refunds (keyed) and the charges report: provider-refunds.ts
 *   POST /_sim/faults  {"rates": {...}, "next": ["timeout", ...]}   change the faults at run time
 *   POST /_sim/reset   forget every charge and key
 *
 * Like a real provider, it forgets: an idempotency key and the charge it made are kept `retentionMs`
 * (24 h by default, as Stripe keeps keys), then dropped, so a simulator that runs for months holds the
 * last day's charges, not every charge it ever made. A key reused after that is a new request.
 *
 * Faults, per request (`X-Fault: timeout|500|503|drop|decline`, `X-Latency-Ms: n`), scripted for the next
 * requests (`failNext`), or at random rates drawn from a seeded generator (same seed, same faults):
 *   timeout  the request is held without an answer until the client gives up; nothing is charged
 *   500/503  an error answer; nothing is charged
 *   drop     the charge IS made, then the connection is cut before the reply (a lost reply)
 *   late     the charge IS made, then the reply is held until the client gives up (a timeout after
 *            the provider charged)
 *   decline  the card is declined (final: 402)
 */
import { randomInt } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { createRng, type Rng } from "./prng.ts";
import { type Refund, RefundDesk } from "./provider-refunds.ts";
import {
  type ProviderWebhookOptions,
  type ProviderWebhooks,
  startWebhookSender,
} from "./provider-webhooks.ts";

/** A fault the simulator can apply to one charge request (`failNext`, or the `X-Fault` header). */
export type ProviderFault = "timeout" | "500" | "503" | "drop" | "late" | "decline";
const FAULTS: readonly ProviderFault[] = ["timeout", "500", "503", "drop", "late", "decline"];

/** Probabilities (0..1) of each random fault per charge request. */
export interface FaultRates {
  /** No answer until the client gives up; nothing is charged. */
  timeout?: number;
  /** 500 or 503, half each. */
  error?: number;
  /** The connection is cut after the charge is made. */
  drop?: number;
  /** The card is declined. */
  decline?: number;
}

/** Options of `startProvider`. */
export interface ProviderOptions {
  /** Port to listen on. Default: 0 (any free port). */
  port?: number;
  /** Address to listen on. Default: `"127.0.0.1"`. */
  host?: string;
  /**
   * Seed of the generator behind random faults, latencies and charge ids: the same seed gives the same
   * run. Default: a random seed (a restarted simulator must not hand out charge ids it gave before).
   */
  seed?: number;
  /** Amounts (in minor units) that are always declined. Default: none. */
  declineAmounts?: readonly number[];
  /** Card numbers (or tokens) that are always declined. Default: none. */
  declineCards?: readonly string[];
  /** Added latency per charge request in ms: a number, or `[min, max]` drawn per request. Default: 0. */
  latencyMs?: number | readonly [number, number];
  /** Random fault rates. Default: none. */
  faults?: FaultRates;
  /** The longest a `timeout` fault holds a request before cutting it. Default: 60,000 ms. */
  hangMs?: number;
  /**
   * Whether a repeated `Idempotency-Key` returns the first result. `false` models a provider without
   * idempotency keys: every request charges, and the only way to learn what happened to a lost reply
   * is to search by `reference`. Default: true.
   */
  idempotency?: boolean;
  /**
   * How long an idempotency key and its charge are remembered (and listed) after the charge was made.
   * A repeat of the key after that charges again, as with a real provider. Default: 86,400,000 (24 h).
   */
  retentionMs?: number;
  /** The clock that ages keys and charges (for tests). Default: `Date.now`. */
  clock?: () => number;
  /** Send charge webhooks (at least once, reordered, duplicated) to a receiver. Default: none. */
  webhooks?: ProviderWebhookOptions;
}

/** A charge as the simulator stores and returns it (Stripe-like fields). */
export interface Charge {
  /** The charge's id, e.g. `ch_...`. */
  id: string;
  /** The amount in minor units (cents). */
  amount: number;
  /** ISO 4217 currency, lower case. */
  currency: string;
  /** The card (or token) charged, when one was given. */
  card: string | null;
  /** The `Idempotency-Key` the provider received, or null. */
  idempotency_key: string | null;
  /** The caller's own reference for the payment (searchable), or null. */
  reference: string | null;
  /** Whether it went through or was declined. */
  status: "succeeded" | "failed";
  /** Why it was declined (e.g. `card_declined`); null when it succeeded. */
  failure_code: string | null;
  /** Order of creation, from 1. */
  seq: number;
  /** When it was made (ISO 8601). */
  created: string;
}

/** A running simulator (`startProvider`): its address, its charges, and its fault controls. */
export interface Provider {
  /** Base URL, e.g. `http://127.0.0.1:43817`. */
  url: string;
  /** The port it listens on. */
  port: number;
  /** The charges made (succeeded and declined) within the retention, in order. */
  charges(): Charge[];
  /** Charge requests received (including repeats and faulted ones). */
  requests(): number;
  /** Replace the random fault rates. */
  setFaults(rates: FaultRates): void;
  /** Apply these faults to the next charge requests, one each, before any random ones. */
  failNext(...faults: ProviderFault[]): void;
  /** Make the search by reference answer 503 (`false`), or work again (`true`). */
  setSearch(available: boolean): void;
  /** The refunds made (`POST /v1/refunds`), in order. */
  refunds(): Refund[];
  /** Forget every charge, refund, key and scripted fault (the generator keeps going). */
  reset(): void;
  /** Stop listening. */
  close(): Promise<void>;
  /** The charge webhooks' sender, when `webhooks` was given. */
  webhooks?: ProviderWebhooks;
}

interface Saved {
  params: string;
  status: number;
  body: string;
  /** When the key was first used (the simulator's clock). */
  at: number;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** The largest request body the simulator reads; a larger one is answered 413. */
const BODY_LIMIT = 64 * 1024;
class BodyTooLargeError extends Error {}

/**
 * The request's body as text, at most `limit` bytes. Read with the stream's events rather than
 * `for await`: the async iterator costs a promise and a callback per chunk and showed in the
 * simulator's profile under the phases bench.
 */
function readBody(req: IncomingMessage, limit = BODY_LIMIT): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size <= limit) chunks.push(chunk);
      else reject(new BodyTooLargeError()); // the rest is read and dropped: the answer can still go out
    });
    req.on("end", () =>
      resolve(chunks.length === 1 ? chunks[0]!.toString("utf8") : Buffer.concat(chunks).toString("utf8")),
    );
    req.on("error", reject);
  });
}

function send(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

function errorBody(type: string, code: string, message: string, extra: Record<string, unknown> = {}) {
  return { error: { type, code, message, ...extra } };
}

/** Start the simulator. Close it with `close()`. */
export async function startProvider(options: ProviderOptions = {}): Promise<Provider> {
  const rng: Rng = createRng(options.seed ?? randomInt(1, 2 ** 31));
  const declineAmounts = new Set(options.declineAmounts ?? []);
  const declineCards = new Set(options.declineCards ?? []);
  const hangMs = options.hangMs ?? 60_000;
  let rates: FaultRates = { ...options.faults };
  let scripted: ProviderFault[] = [];
  const retentionMs = options.retentionMs ?? 86_400_000;
  if (!(retentionMs > 0)) throw new RangeError(`retentionMs must be a positive number, got ${retentionMs}`);
  const clock = options.clock ?? Date.now;
  // Charges in order of creation from `head` on (those before it have expired), with their times;
  // keys in a Map, whose order is also that of creation: both expire from the front.
  let charges: Charge[] = [];
  let madeAt: number[] = [];
  let head = 0;
  let seq = 0;
  let byKey = new Map<string, Saved>();
  let received = 0;
  let searchAvailable = true;
  const dedup = options.idempotency ?? true;
  const webhooks = options.webhooks ? startWebhookSender(options.webhooks) : undefined;

  const latency = (req: IncomingMessage): number => {
    const header = Number(req.headers["x-latency-ms"]);
    if (Number.isFinite(header) && header >= 0) return header;
    const l = options.latencyMs ?? 0;
    if (typeof l === "number") return l;
    return l[0] + rng.int(l[1] - l[0] + 1);
  };

  /** Forget the keys and charges past retention. */
  const expire = (): void => {
    const cutoff = clock() - retentionMs;
    while (head < charges.length && madeAt[head]! <= cutoff) head++;
    if (head > 1_024 && head * 2 > charges.length) {
      charges = charges.slice(head);
      madeAt = madeAt.slice(head);
      head = 0;
    }
    for (const [key, saved] of byKey) {
      if (saved.at > cutoff) break;
      byKey.delete(key);
    }
  };
  const live = (): Charge[] => (head === 0 ? charges : charges.slice(head));
  const desk = new RefundDesk({ rng, clock, charges: live, readBody, send });

  const faultFor = (req: IncomingMessage): ProviderFault | undefined => {
    const h = String(req.headers["x-fault"] ?? "").trim();
    if (FAULTS.includes(h as ProviderFault)) return h as ProviderFault;
    const next = scripted.shift();
    if (next) return next;
    // One draw per fault kind, in a fixed order, so a seed gives the same sequence of faults.
    if (rng.chance(rates.timeout ?? 0)) return "timeout";
    if (rng.chance(rates.error ?? 0)) return rng.chance(0.5) ? "500" : "503";
    if (rng.chance(rates.drop ?? 0)) return "drop";
    if (rng.chance(rates.decline ?? 0)) return "decline";
    return undefined;
  };

  async function createCharge(req: IncomingMessage, res: ServerResponse): Promise<void> {
    received++;
    let input: { amount?: unknown; currency?: unknown; card?: unknown; reference?: unknown };
    try {
      input = JSON.parse(await readBody(req));
    } catch (e) {
      return e instanceof BodyTooLargeError
        ? send(
            res,
            413,
            errorBody("invalid_request_error", "body_too_large", `The body is over ${BODY_LIMIT} bytes.`),
          )
        : send(res, 400, errorBody("invalid_request_error", "invalid_json", "The body is not JSON."));
    }
    const { amount, currency } = input;
    const card = input.card === undefined || input.card === null ? null : String(input.card);
    const reference = typeof input.reference === "string" && input.reference ? input.reference : null;
    if (typeof amount !== "number" || !Number.isInteger(amount) || amount <= 0) {
      return send(
        res,
        400,
        errorBody("invalid_request_error", "invalid_amount", "amount: a positive integer."),
      );
    }
    if (typeof currency !== "string" || !/^[a-z]{3}$/.test(currency)) {
      return send(res, 400, errorBody("invalid_request_error", "invalid_currency", "currency: like eur."));
    }
    const keyHeader = req.headers["idempotency-key"];
    const key = typeof keyHeader === "string" && keyHeader.length > 0 ? keyHeader : null;
    const dedupKey = dedup ? key : null;
    const fault = faultFor(req);
    const wait = latency(req);
    if (wait > 0) await sleep(wait);

    if (fault === "timeout") {
      // Hold the request: the client times out. Nothing is charged.
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, hangMs);
        res.once("close", () => {
          clearTimeout(t);
          resolve();
        });
      });
      res.destroy();
      return;
    }
    if (fault === "500" || fault === "503") {
      return send(res, Number(fault), errorBody("api_error", "unavailable", "The provider failed; retry."));
    }

    // The check and the creation run with no await in between, so concurrent repeats of a key
    // (Node runs one callback at a time) always find the first one's result.
    const params = JSON.stringify([amount, currency, card]);
    expire();
    const saved = dedupKey ? byKey.get(dedupKey) : undefined;
    if (saved) {
      if (saved.params !== params) {
        return send(
          res,
          422,
          errorBody("idempotency_error", "key_reused", "This key was used with other parameters."),
        );
      }
      if (fault === "drop") return void res.destroy();
      return send(res, saved.status, saved.body, { "idempotent-replayed": "true" });
    }
    const declined = fault === "decline" || declineAmounts.has(amount) || (card && declineCards.has(card));
    const charge: Charge = {
      id: `ch_${rng.hex(24)}`,
      amount,
      currency,
      card,
      idempotency_key: key,
      reference,
      status: declined ? "failed" : "succeeded",
      failure_code: declined ? "card_declined" : null,
      seq: ++seq,
      created: new Date(clock()).toISOString(),
    };
    charges.push(charge);
    madeAt.push(clock());
    webhooks?.chargeMade(charge);
    const status = declined ? 402 : 200;
    const body = JSON.stringify(
      declined
        ? errorBody("card_error", "card_declined", "Your card was declined.", { charge: charge.id })
        : charge,
    );
    if (dedupKey) byKey.set(dedupKey, { params, status, body, at: clock() });
    if (fault === "drop") {
      res.destroy(); // charged, but the reply is lost
      return;
    }
    if (fault === "late") {
      // Charged, but the reply comes after the client gave up (it never reads it).
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, hangMs);
        res.once("close", () => {
          clearTimeout(t);
          resolve();
        });
      });
      if (!res.destroyed) send(res, status, body);
      return;
    }
    send(res, status, body);
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    // The charge itself without parsing a URL (it is every request of a load).
    if (req.method === "POST" && req.url === "/v1/charges") return createCharge(req, res);
    const url = new URL(req.url ?? "/", "http://provider");
    const path = url.pathname;
    if (req.method === "POST" && path === "/v1/charges") return createCharge(req, res);
    if (req.method === "GET" && path === "/v1/charges") {
      const status = url.searchParams.get("status");
      // ?scope=<scope>: only the charges whose key is `<scope>:...` (one account's, never another's).
      const scope = url.searchParams.get("scope");
      const reference = url.searchParams.get("reference");
      if (reference !== null && !searchAvailable) {
        return send(res, 503, errorBody("api_error", "search_unavailable", "Search is down; retry."));
      }
      expire();
      const data = live().filter(
        (c) =>
          (!status || c.status === status) &&
          (!scope || c.idempotency_key?.startsWith(`${scope}:`)) &&
          (reference === null || c.reference === reference),
      );
      return send(res, 200, { data });
    }
    const one = /^\/v1\/charges\/([^/]+)$/.exec(path);
    if (req.method === "GET" && one) {
      expire();
      const c = live().find((x) => x.id === one[1]);
      return c
        ? send(res, 200, c)
        : send(res, 404, errorBody("invalid_request_error", "not_found", "No such charge."));
    }
    if (req.method === "POST" && path === "/_sim/faults") {
      const body = JSON.parse((await readBody(req)) || "{}") as {
        rates?: FaultRates;
        next?: ProviderFault[];
      };
      if (body.rates) rates = { ...body.rates };
      if (body.next) scripted.push(...body.next.filter((f) => FAULTS.includes(f)));
      return send(res, 200, { rates, next: scripted });
    }
    if (req.method === "POST" && path === "/_sim/reset") {
      reset();
      return send(res, 200, { ok: true });
    }
    if (await desk.handle(req, res, url)) return;
    send(res, 404, errorBody("invalid_request_error", "not_found", `No route for ${req.method} ${path}.`));
  }

  function reset(): void {
    desk.reset();
    charges = [];
    madeAt = [];
    head = 0;
    seq = 0;
    byKey = new Map();
    scripted = [];
    received = 0;
    searchAvailable = true;
  }

  const server: Server = createServer((req, res) => {
    handle(req, res).catch((err) => {
      if (!res.headersSent) send(res, 500, errorBody("api_error", "internal", String(err?.message ?? err)));
      else res.destroy();
    });
  });
  server.keepAliveTimeout = 30_000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, options.host ?? "127.0.0.1", () => resolve());
  });
  const address = server.address() as AddressInfo;
  const host = address.family === "IPv6" ? `[${address.address}]` : address.address;
  return {
    url: `http://${host}:${address.port}`,
    port: address.port,
    charges: () => {
      expire();
      return live().map((c) => ({ ...c }));
    },
    requests: () => received,
    refunds: () => desk.refunds(),
    setSearch(available) {
      searchAvailable = available;
    },
    setFaults(r) {
      rates = { ...r };
    },
    failNext(...faults) {
      scripted.push(...faults);
    },
    reset,
    webhooks,
    close() {
      webhooks?.close();
      return new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
    },
  };
}
