/**
 * Webhooks: each outbox event is POSTed to a URL, signed so the receiver can tell it came from us and
 * was not altered or replayed later.
 *
 * The signature follows the Standard Webhooks scheme (standardwebhooks.com), so receivers can verify it
 * with that project's libraries in many languages, or with {@link verifyWebhook}:
 *
 *   webhook-id:        the event id (the same on every retry and every republish: deduplicate on it)
 *   webhook-timestamp: Unix seconds when signed
 *   webhook-signature: v1,<base64 HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>
 *
 * It is a few lines of `node:crypto`, so it is written here rather than adding a dependency. The body
 * is `{"type", "timestamp", "data"}` with the event's payload as `data`.
 *
 * Each publish is one attempt per event (with the event id also as the Idempotency-Key). Retrying is
 * the relay's job alone: a failed row is retried with backoff and finally parked. A second retry
 * layer in here would multiply the requests a struggling receiver gets, and hold a batch (and the
 * events queued behind it) for the length of its retries.
 */
import { createHmac, timingSafeEqual } from "node:crypto";
import { errorOf, type OutboxMessage, type Publisher, type PublishOutcome } from "./types.ts";

/** The Standard Webhooks headers every delivery carries: id, timestamp and signature. */
export const WEBHOOK_HEADERS = {
  id: "webhook-id",
  timestamp: "webhook-timestamp",
  signature: "webhook-signature",
} as const;

/** The secret's bytes: a `whsec_<base64>` secret (the Standard Webhooks format) is decoded, any other string is UTF-8. */
export function secretBytes(secret: string | Uint8Array): Buffer {
  if (typeof secret !== "string") return Buffer.from(secret);
  return secret.startsWith("whsec_") ? Buffer.from(secret.slice(6), "base64") : Buffer.from(secret, "utf8");
}

function sign(key: Buffer, id: string, timestamp: number | string, body: string | Uint8Array): string {
  return createHmac("sha256", key).update(`${id}.${timestamp}.`).update(body).digest("base64");
}

/** The three headers for one delivery of `body` under event id `id`. */
export function signWebhook(
  secret: string | Uint8Array,
  id: string,
  body: string,
  timestamp: number = Math.floor(Date.now() / 1000),
): Record<string, string> {
  return {
    [WEBHOOK_HEADERS.id]: id,
    [WEBHOOK_HEADERS.timestamp]: String(timestamp),
    [WEBHOOK_HEADERS.signature]: `v1,${sign(secretBytes(secret), id, timestamp, body)}`,
  };
}

/** Why a delivery was refused: a header missing, one malformed, the signature, or the timestamp's age. */
export type WebhookRejection = "missing-header" | "malformed" | "signature" | "timestamp";

/** A delivery's signature or timestamp does not check out (`verifyWebhook`, and `idem/webhooks`). */
export class WebhookVerificationError extends Error {
  /** Always `"WebhookVerificationError"`: the name logs and stack traces show. */
  override readonly name = "WebhookVerificationError";
  /** Always `"IDEM_WEBHOOK_INVALID"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_WEBHOOK_INVALID";
  /** Why it was refused (`"signature"` when not said). */
  readonly reason: WebhookRejection;
  constructor(message: string, reason: WebhookRejection = "signature", options?: { cause?: unknown }) {
    super(message, options);
    this.reason = reason;
  }
}

/**
 * A signed timestamp (Unix seconds, as sent) checked against `nowS`: within `toleranceS` either way,
 * else {@link WebhookVerificationError}. Replays of an old delivery are refused by this, not by a
 * signature (which a replay carries intact).
 */
export function checkTimestamp(value: string, toleranceS: number, nowS: number): number {
  const timestamp = /^[0-9]{1,12}$/.test(value) ? Number(value) : Number.NaN;
  if (!Number.isSafeInteger(timestamp)) {
    throw new WebhookVerificationError(
      `webhook timestamp ${JSON.stringify(value)} is not Unix seconds`,
      "malformed",
    );
  }
  if (Math.abs(nowS - timestamp) > toleranceS) {
    throw new WebhookVerificationError(
      `webhook timestamp ${timestamp} is ${nowS - timestamp} s from now: outside the tolerated window of ${toleranceS} s`,
      "timestamp",
    );
  }
  return timestamp;
}

/** Whether two byte strings are equal, in time that depends on their length only. */
export function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}

/**
 * Whether one of the space-separated `v1,<base64>` signatures of a Standard Webhooks header is the
 * HMAC of `<id>.<timestamp>.<body>` under one of `keys` (several during a rotation, on either side).
 */
export function matchesV1(
  keys: readonly Buffer[],
  id: string,
  timestamp: string,
  body: string | Uint8Array,
  header: string,
): boolean {
  const given = header
    .split(" ")
    .map((s) => s.split(",", 2))
    .filter(([version, value]) => version === "v1" && value)
    .map(([, value]) => Buffer.from(value!, "base64"));
  if (given.length === 0) return false;
  return keys.some((key) => {
    const expected = Buffer.from(sign(key, id, timestamp, body), "base64");
    return given.some((g) => sameBytes(g, expected));
  });
}

/**
 * For receivers: check a delivery's signature and age against the raw body (as received, before any
 * JSON parsing). Returns the event id and the parsed body; throws {@link WebhookVerificationError}.
 * `toleranceS` bounds how old (or how far in the future) the timestamp may be. Default 300 s.
 * (`idem/webhooks` does this and more: several secrets, Ed25519, Stripe and GitHub, and the inbox.)
 */
export function verifyWebhook(
  secret: string | Uint8Array,
  headers: Headers | Record<string, string | string[] | undefined>,
  rawBody: string,
  options: { toleranceS?: number; nowS?: number } = {},
): { id: string; timestamp: number; body: { type: string; timestamp: string; data: unknown } } {
  const get = (name: string): string | undefined => {
    if (headers instanceof Headers) return headers.get(name) ?? undefined;
    const v = headers[name] ?? headers[name.toLowerCase()];
    return Array.isArray(v) ? v[0] : v;
  };
  const id = get(WEBHOOK_HEADERS.id);
  const ts = get(WEBHOOK_HEADERS.timestamp);
  const sigs = get(WEBHOOK_HEADERS.signature);
  if (!id || !ts || !sigs)
    throw new WebhookVerificationError(
      "missing webhook-id, -timestamp or -signature header",
      "missing-header",
    );
  const timestamp = checkTimestamp(
    ts,
    options.toleranceS ?? 300,
    options.nowS ?? Math.floor(Date.now() / 1000),
  );
  // Several space-separated signatures may be sent (e.g. during a secret rotation): one must match.
  if (!matchesV1([secretBytes(secret)], id, ts, rawBody, sigs)) {
    throw new WebhookVerificationError("webhook signature does not match");
  }
  return { id, timestamp, body: JSON.parse(rawBody) };
}

/** Options of {@link WebhookPublisher}. `url` and `secret` are required. */
export interface WebhookPublisherOptions {
  /** Where to POST: one URL, or one per message (e.g. per subscriber, from the topic). */
  url: string | ((m: OutboxMessage) => string);
  /** The signing secret shared with the receiver: `whsec_<base64>` or any string. */
  secret: string | Uint8Array;
  /** Time for one request, until the response headers arrive. Default 10,000 ms. */
  timeoutMs?: number;
  /** The fetch function. Default: the global `fetch`. */
  fetch?: (url: string, init: RequestInit) => Promise<Response>;
  /** Requests in flight at once within a batch. Default 16. */
  concurrency?: number;
  /** Extra headers on every request (e.g. a user agent). Default: none. */
  headers?: Record<string, string>;
}

/** Publishes each outbox event as a signed HTTP POST. */
export class WebhookPublisher implements Publisher {
  /** Always `"webhook"`: the publisher's name in logs and metrics. */
  readonly name = "webhook";
  readonly #options: WebhookPublisherOptions;
  readonly #key: Buffer;

  constructor(options: WebhookPublisherOptions) {
    this.#options = options;
    this.#key = secretBytes(options.secret);
    if (this.#key.length === 0) throw new TypeError("WebhookPublisher needs a non-empty secret");
  }

  /** POST each message to its URL (`url`), signed; one outcome per message. */
  async publish(messages: readonly OutboxMessage[]): Promise<PublishOutcome[]> {
    const outcomes: PublishOutcome[] = new Array(messages.length);
    let next = 0;
    const worker = async () => {
      while (next < messages.length) {
        const i = next++;
        outcomes[i] = await this.#send(messages[i]!);
      }
    };
    await Promise.all(
      Array.from({ length: Math.min(this.#options.concurrency ?? 16, messages.length) }, worker),
    );
    return outcomes;
  }

  async #send(m: OutboxMessage): Promise<PublishOutcome> {
    const url = typeof this.#options.url === "function" ? this.#options.url(m) : this.#options.url;
    const body = `{"type":${JSON.stringify(m.type)},"timestamp":${JSON.stringify(m.createdAt.toISOString())},"data":${m.body}}`;
    const timestamp = Math.floor(Date.now() / 1000);
    const headers: Record<string, string> = {
      ...this.#options.headers,
      ...m.headers,
      "content-type": "application/json",
      [WEBHOOK_HEADERS.id]: m.id,
      "idempotency-key": m.id,
      [WEBHOOK_HEADERS.timestamp]: String(timestamp),
      [WEBHOOK_HEADERS.signature]: `v1,${sign(this.#key, m.id, timestamp, body)}`,
    };
    const fetchFn = this.#options.fetch ?? fetch;
    try {
      const res = await fetchFn(url, {
        method: "POST",
        headers,
        body,
        signal: AbortSignal.timeout(this.#options.timeoutMs ?? 10_000),
      });
      await res.body?.cancel().catch(() => {});
      if (res.ok) return { ok: true };
      return { ok: false, error: new Error(`webhook ${url} answered ${res.status}`) };
    } catch (err) {
      return { ok: false, error: new Error(`webhook ${url}: ${errorOf(err).message}`) };
    }
  }

  /** Nothing to close (each delivery is its own request). */
  async close(): Promise<void> {}
}
