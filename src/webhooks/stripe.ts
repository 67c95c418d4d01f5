/**
 * Stripe's scheme: `Stripe-Signature: t=<Unix seconds>,v1=<hex HMAC-SHA256>[,v1=...]` over
 * `<t>.<body>`, keyed by the endpoint's secret as it is written (`whsec_...`, used as UTF-8 bytes, not
 * decoded). While an endpoint's secret is rolled Stripe signs with both, so the header carries two
 * `v1`; the receiver may hold both too. The event id is the body's `id` (`evt_...`): the same in every
 * retry of the event.
 */
import { createHmac } from "node:crypto";
import { checkTimestamp, sameBytes, WebhookVerificationError } from "../messaging/webhook.ts";
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

/** Options of {@link stripeScheme}. */
export interface StripeSchemeOptions {
  /** The endpoint's signing secret(s), `whsec_...`: the old and the new one during a roll. Required. */
  secret: Secrets;
  /** How far `t` may be from now, either way, in seconds. Default 300 (as Stripe's libraries). */
  toleranceS?: number;
}

/** Stripe's `Stripe-Signature` scheme, several secrets at once. */
export function stripeScheme(options: StripeSchemeOptions): WebhookScheme {
  const keys = secretList(options.secret, "stripeScheme").map((s) => Buffer.from(s));
  const toleranceS = options.toleranceS ?? 300;
  return {
    name: "stripe",
    verify(input: WebhookInput): VerifiedWebhook {
      const header = required(input, "stripe-signature");
      let t: string | undefined;
      const given: Buffer[] = [];
      for (const part of header.split(",")) {
        const eq = part.indexOf("=");
        const k = part.slice(0, eq).trim();
        const v = part.slice(eq + 1).trim();
        if (k === "t") t = v;
        else if (k === "v1" && /^[0-9a-f]{64}$/i.test(v)) given.push(Buffer.from(v, "hex"));
      }
      if (t === undefined || given.length === 0) {
        throw new WebhookVerificationError(
          "the Stripe-Signature header has no t= or no v1= signature",
          "malformed",
        );
      }
      checkTimestamp(t, toleranceS, input.nowS);
      const signed = keys.some((key) => {
        const expected = createHmac("sha256", key).update(`${t}.`).update(input.body).digest();
        return given.some((g) => sameBytes(g, expected));
      });
      if (!signed)
        throw new WebhookVerificationError("no v1 signature matches the body with any of the secrets");
      const payload = jsonObject(bodyText(input.body));
      const created = payload.created;
      return {
        id: stringField(payload, "id"),
        type: stringField(payload, "type"),
        payload,
        createdAt: typeof created === "number" && Number.isFinite(created) ? new Date(created * 1000) : null,
        headers: { "stripe-event-id": String(payload.id) },
      };
    },
  };
}
