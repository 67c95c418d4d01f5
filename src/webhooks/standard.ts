/**
 * Standard Webhooks (standardwebhooks.com; Svix, and idem's own `WebhookPublisher`):
 *
 *   webhook-id:        the event id (the same on every retry)
 *   webhook-timestamp: Unix seconds when signed
 *   webhook-signature: space-separated `v1,<base64 HMAC-SHA256>` and/or `v1a,<base64 Ed25519>` over
 *                      `<id>.<timestamp>.<body>`
 *
 * HMAC secrets are `whsec_<base64>` (any other string is used as UTF-8 bytes); Ed25519 public keys are
 * `whpk_<base64 of the 32-byte key>`. Give several during a rotation: one signature must match one key.
 */
import { createPublicKey, type KeyObject, verify } from "node:crypto";
import {
  checkTimestamp,
  matchesV1,
  secretBytes,
  WEBHOOK_HEADERS,
  WebhookVerificationError,
} from "../messaging/webhook.ts";
import {
  bodyText,
  jsonObject,
  required,
  type Secrets,
  secretList,
  stringField,
  type VerifiedWebhook,
  type WebhookInput,
  type WebhookScheme,
} from "./scheme.ts";

/** Options of {@link standardWebhooksScheme}. */
export interface StandardWebhooksOptions {
  /**
   * The signing secret(s): `whsec_...` for HMAC (`v1`), `whpk_...` for an Ed25519 public key (`v1a`),
   * mixed as you like. Several during a rotation. Required.
   */
  secret: Secrets;
  /** How far the signed timestamp may be from now, either way, in seconds. Default 300. */
  toleranceS?: number;
}

function ed25519Key(publicKey: string): KeyObject {
  const raw = Buffer.from(publicKey.slice(5), "base64");
  if (raw.length !== 32) throw new TypeError("a whpk_ key is the base64 of a 32-byte Ed25519 public key");
  return createPublicKey({
    key: { kty: "OKP", crv: "Ed25519", x: raw.toString("base64url") },
    format: "jwk",
  });
}

/** The Standard Webhooks scheme: HMAC `v1` and Ed25519 `v1a` signatures, several keys at once. */
export function standardWebhooksScheme(options: StandardWebhooksOptions): WebhookScheme {
  const list = secretList(options.secret, "standardWebhooksScheme");
  const isPublicKey = (s: string | Uint8Array): s is string => typeof s === "string" && s.startsWith("whpk_");
  const hmacKeys = list.filter((s) => !isPublicKey(s)).map(secretBytes);
  const publicKeys = list.filter(isPublicKey).map(ed25519Key);
  const toleranceS = options.toleranceS ?? 300;

  const signedBy = (id: string, ts: string, body: Uint8Array, header: string): boolean => {
    if (hmacKeys.length > 0 && matchesV1(hmacKeys, id, ts, body, header)) return true;
    if (publicKeys.length === 0) return false;
    const signed = Buffer.concat([Buffer.from(`${id}.${ts}.`), body]);
    for (const part of header.split(" ")) {
      const [version, value] = part.split(",", 2);
      if (version !== "v1a" || !value) continue;
      const signature = Buffer.from(value, "base64");
      if (signature.length === 64 && publicKeys.some((k) => verify(null, signed, k, signature))) return true;
    }
    return false;
  };

  return {
    name: "standard",
    verify(input: WebhookInput): VerifiedWebhook {
      const id = required(input, WEBHOOK_HEADERS.id);
      const ts = required(input, WEBHOOK_HEADERS.timestamp);
      const header = required(input, WEBHOOK_HEADERS.signature);
      checkTimestamp(ts, toleranceS, input.nowS);
      if (!signedBy(id, ts, input.body, header)) {
        throw new WebhookVerificationError("no webhook-signature matches the body with any of the secrets");
      }
      const payload = jsonObject(bodyText(input.body));
      const when = typeof payload.timestamp === "string" ? new Date(payload.timestamp) : null;
      return {
        id,
        type: stringField(payload, "type"),
        payload,
        createdAt: when && !Number.isNaN(when.getTime()) ? when : null,
        headers: { [WEBHOOK_HEADERS.id]: id, [WEBHOOK_HEADERS.timestamp]: ts },
      };
    },
  };
}
