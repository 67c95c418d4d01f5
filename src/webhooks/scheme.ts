/**
 * What a signature scheme is to the receiver: it checks a delivery (headers and the raw body, before
 * anything parses it) and names the event: its id (what the inbox deduplicates on), its type, and when
 * the sender created it. The three schemes are in standard.ts, stripe.ts and github.ts.
 *
 * Why `node:crypto` and not the providers' own libraries: each check is an HMAC-SHA256 (or an Ed25519
 * verify) and a constant-time comparison, a dozen lines. The `stripe` package is 23 MB unpacked (the
 * whole API client) for those lines and takes one secret at a time; `standardwebhooks` computes HMACs
 * in JavaScript (fast-sha256) and has no Ed25519 (`v1a`); `@octokit/webhooks-methods` is small but
 * async and one secret too. With `node:crypto` the three share one way of handling several secrets
 * during a rotation, run in OpenSSL, and add no dependency for users. Node, Bun and Deno have
 * `node:crypto` (Workers with `nodejs_compat`). The tests sign with the official libraries, so the
 * schemes are checked against the senders' own code.
 */
import { WebhookVerificationError } from "../messaging/webhook.ts";
import { WebhookPayloadError } from "./errors.ts";

/** A delivery as a scheme sees it. */
export interface WebhookInput {
  /** A request header by lower-case name (the first value when repeated), or undefined. */
  header(name: string): string | undefined;
  /** The body's bytes, exactly as received. */
  body: Uint8Array;
  /** Now, in Unix seconds (the receiver's `now` option), for timestamp tolerance. */
  nowS: number;
}

/** A delivery that checked out, and the event it carries. */
export interface VerifiedWebhook {
  /** The event's id: the same in every delivery of the event (what the inbox deduplicates on). */
  id: string;
  /** The event's type, e.g. `"payment_intent.succeeded"` or GitHub's `"issues.opened"`. */
  type: string;
  /** The body, parsed (JSON, or GitHub's form-encoded `payload`). */
  payload: unknown;
  /** When the sender created the event, when the scheme says (Stripe `created`, Standard `timestamp`). */
  createdAt: Date | null;
  /** The headers worth keeping with a parked event (id, type, timestamp; never the signature). */
  headers: Record<string, string>;
}

/** A signature scheme: `standardWebhooksScheme`, `stripeScheme`, `githubScheme`, or your own. */
export interface WebhookScheme {
  /** Short name, e.g. `"stripe"`: the inbox consumer's default name is `webhook:<name>`. */
  readonly name: string;
  /**
   * Check the delivery and read its event; throw `WebhookVerificationError` (401 or 400 by its
   * `reason`) or `WebhookPayloadError` (400). Runs before anything parses the body.
   */
  verify(input: WebhookInput): VerifiedWebhook;
}

/** A secret, or several at once (during a rotation: the old and the new, either one may sign). */
export type Secrets = string | Uint8Array | readonly (string | Uint8Array)[];

/** The secrets as a non-empty list; a TypeError naming the scheme when there is none. */
export function secretList(secrets: Secrets | undefined, scheme: string): (string | Uint8Array)[] {
  const list: (string | Uint8Array)[] =
    secrets === undefined
      ? []
      : typeof secrets === "string" || secrets instanceof Uint8Array
        ? [secrets]
        : [...secrets];
  if (list.length === 0 || list.some((s) => s.length === 0)) {
    throw new TypeError(
      `${scheme}: give the signing secret (secret: "..." or an array of them during a rotation)`,
    );
  }
  return list;
}

/** The header, or a `WebhookVerificationError` (400) naming it. */
export function required(input: WebhookInput, name: string): string {
  const value = input.header(name);
  if (!value) throw new WebhookVerificationError(`the ${name} header is missing`, "missing-header");
  return value;
}

const decoder = new TextDecoder("utf-8", { fatal: true });

/** The body as UTF-8 text (a `WebhookPayloadError` when it is not). */
export function bodyText(body: Uint8Array): string {
  try {
    return decoder.decode(body);
  } catch (err) {
    throw new WebhookPayloadError("the webhook body is not UTF-8 text", { cause: err });
  }
}

/** The body parsed as a JSON object (a `WebhookPayloadError` when it is not one). */
export function jsonObject(text: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new WebhookPayloadError("the webhook body is not JSON", { cause: err });
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new WebhookPayloadError("the webhook body is not a JSON object");
  }
  return value as Record<string, unknown>;
}

/** A non-empty string field of the payload, or a `WebhookPayloadError` naming it. */
export function stringField(payload: Record<string, unknown>, field: string): string {
  const value = payload[field];
  if (typeof value !== "string" || value.length === 0) {
    throw new WebhookPayloadError(`the webhook body has no "${field}" string`);
  }
  return value;
}
