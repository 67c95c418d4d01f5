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
 * (24 h by default), then dropped (provider-charges.ts). A key reused after that is a new request.
 *
 * Faults, per request (`X-Fault: timeout|500|503|drop|decline`, `X-Latency-Ms: n`), scripted for the next
 * requests (`failNext`), or at random rates drawn from a seeded generator (same seed, same faults):
 *   timeout  the request is held without an answer until the client gives up; nothing is charged
 *   500/503  an error answer; nothing is charged
 *   drop     the charge IS made, then the connection is cut before the reply (a lost reply)
 *   late     the charge IS made, then the reply is held until the client gives up (a timeout after
 *            the provider charged)
 *   decline  the card is declined (final: 402)
 * (provider-faults.ts). This file is the server: its options, its routes and the charge itself.
 */
import { randomInt } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { createRng, type Rng } from "./prng.ts";
import { type Charge, ChargeBook } from "./provider-charges.ts";
import { FAULTS, FaultPlan, type FaultRates, type ProviderFault } from "./provider-faults.ts";
import {
  BODY_LIMIT,
  BodyTooLargeError,
  errorBody,
  holdUntilClosed,
  readBody,
  send,
  sleep,
} from "./provider-http.ts";
import { type Refund, RefundDesk } from "./provider-refunds.ts";
import {
  type ProviderWebhookOptions,
  type ProviderWebhooks,
  startWebhookSender,
} from "./provider-webhooks.ts";

export type { Charge } from "./provider-charges.ts";
export type { FaultRates, ProviderFault } from "./provider-faults.ts";

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

/** Start the simulator. Close it with `close()`. */
export async function startProvider(options: ProviderOptions = {}): Promise<Provider> {
  const rng: Rng = createRng(options.seed ?? randomInt(1, 2 ** 31));
  const declineAmounts = new Set(options.declineAmounts ?? []);
  const declineCards = new Set(options.declineCards ?? []);
  const hangMs = options.hangMs ?? 60_000;
  const faults = new FaultPlan(rng, options.faults, options.latencyMs);
  const clock = options.clock ?? Date.now;
  const book = new ChargeBook(options.retentionMs ?? 86_400_000, clock);
  let received = 0;
  let searchAvailable = true;
  const dedup = options.idempotency ?? true;
  const webhooks = options.webhooks ? startWebhookSender(options.webhooks) : undefined;
  const desk = new RefundDesk({ rng, clock, charges: () => book.live(), readBody, send });

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
    const fault = faults.next(req);
    const wait = faults.latency(req);
    if (wait > 0) await sleep(wait);

    if (fault === "timeout") {
      // Hold the request: the client times out. Nothing is charged.
      await holdUntilClosed(res, hangMs);
      res.destroy();
      return;
    }
    if (fault === "500" || fault === "503") {
      return send(res, Number(fault), errorBody("api_error", "unavailable", "The provider failed; retry."));
    }

    // The check and the creation run with no await in between, so concurrent repeats of a key
    // (Node runs one callback at a time) always find the first one's result.
    const params = JSON.stringify([amount, currency, card]);
    book.expire();
    const saved = dedupKey ? book.saved(dedupKey) : undefined;
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
      seq: book.nextSeq(),
      created: new Date(clock()).toISOString(),
    };
    book.add(charge);
    webhooks?.chargeMade(charge);
    const status = declined ? 402 : 200;
    const body = JSON.stringify(
      declined
        ? errorBody("card_error", "card_declined", "Your card was declined.", { charge: charge.id })
        : charge,
    );
    if (dedupKey) book.save(dedupKey, params, status, body);
    if (fault === "drop") {
      res.destroy(); // charged, but the reply is lost
      return;
    }
    if (fault === "late") {
      // Charged, but the reply comes after the client gave up (it never reads it).
      await holdUntilClosed(res, hangMs);
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
      book.expire();
      const data = book
        .live()
        .filter(
          (c) =>
            (!status || c.status === status) &&
            (!scope || c.idempotency_key?.startsWith(`${scope}:`)) &&
            (reference === null || c.reference === reference),
        );
      return send(res, 200, { data });
    }
    const one = /^\/v1\/charges\/([^/]+)$/.exec(path);
    if (req.method === "GET" && one) {
      book.expire();
      const c = book.live().find((x) => x.id === one[1]);
      return c
        ? send(res, 200, c)
        : send(res, 404, errorBody("invalid_request_error", "not_found", "No such charge."));
    }
    if (req.method === "POST" && path === "/_sim/faults") {
      const body = JSON.parse((await readBody(req)) || "{}") as {
        rates?: FaultRates;
        next?: ProviderFault[];
      };
      if (body.rates) faults.setRates(body.rates);
      if (body.next) faults.script(body.next.filter((f) => FAULTS.includes(f)));
      return send(res, 200, faults.state());
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
    book.reset();
    faults.reset();
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
      book.expire();
      return book.live().map((c) => ({ ...c }));
    },
    requests: () => received,
    refunds: () => desk.refunds(),
    setSearch(available) {
      searchAvailable = available;
    },
    setFaults(r) {
      faults.setRates(r);
    },
    failNext(...next) {
      faults.script(next);
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
