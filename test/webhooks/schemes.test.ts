/**
 * The three signature schemes against the senders' own libraries: what they sign is accepted, and a
 * tampered body, a wrong secret, an old (or future) timestamp or a missing header is refused with a
 * reason the receiver turns into 400 or 401.
 */
import { describe, expect, it } from "vitest";
import { WebhookVerificationError } from "../../src/messaging/webhook.ts";
import { WebhookPayloadError } from "../../src/webhooks/errors.ts";
import { githubScheme } from "../../src/webhooks/github.ts";
import type { WebhookScheme } from "../../src/webhooks/scheme.ts";
import { standardWebhooksScheme } from "../../src/webhooks/standard.ts";
import { stripeScheme } from "../../src/webhooks/stripe.ts";
import {
  type Delivery,
  ed25519Signer,
  GITHUB_SECRET,
  githubDelivery,
  paymentIntentEvent,
  STANDARD_SECRET,
  STRIPE_SECRET,
  standardDelivery,
  stripeDelivery,
} from "./senders.ts";

const now = () => Math.floor(Date.now() / 1000);

function check(scheme: WebhookScheme, d: Delivery, nowS = now()) {
  const headers = new Headers(d.headers);
  return scheme.verify({
    header: (n) => headers.get(n) ?? undefined,
    body: new TextEncoder().encode(d.body),
    nowS,
  });
}

function reasonOf(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    if (err instanceof WebhookVerificationError) return err.reason;
    if (err instanceof WebhookPayloadError) return "payload";
    throw err;
  }
  return "accepted";
}

const tamper = (d: Delivery): Delivery => ({ ...d, body: d.body.replace("5000", "5001") });

describe("stripe scheme (signed by stripe.webhooks.generateTestHeaderString)", () => {
  const scheme = stripeScheme({ secret: STRIPE_SECRET });
  const event = paymentIntentEvent("evt_1", "pi_1", "succeeded", now());

  it("accepts Stripe's signature and reads the event id, type and creation time from the body", () => {
    const v = check(scheme, stripeDelivery(event));
    expect(v).toMatchObject({ id: "evt_1", type: "payment_intent.succeeded" });
    expect(v.createdAt?.getTime()).toBe((event.created as number) * 1000);
  });

  it("refuses a tampered body, a wrong secret, an old or future timestamp, a missing or broken header", () => {
    expect(reasonOf(() => check(scheme, tamper(stripeDelivery(event))))).toBe("signature");
    expect(reasonOf(() => check(scheme, stripeDelivery(event, { secret: "whsec_other" })))).toBe("signature");
    expect(reasonOf(() => check(scheme, stripeDelivery(event, { timestamp: now() - 301 })))).toBe(
      "timestamp",
    );
    expect(reasonOf(() => check(scheme, stripeDelivery(event, { timestamp: now() + 301 })))).toBe(
      "timestamp",
    );
    expect(reasonOf(() => check(scheme, { headers: {}, body: JSON.stringify(event) }))).toBe(
      "missing-header",
    );
    expect(reasonOf(() => check(scheme, { headers: { "stripe-signature": "t=1" }, body: "{}" }))).toBe(
      "malformed",
    );
  });

  it("takes either secret during a roll, and a header signed with both (old first)", () => {
    const rolled = stripeScheme({ secret: ["whsec_old", STRIPE_SECRET] });
    expect(check(rolled, stripeDelivery(event)).id).toBe("evt_1");
    expect(check(rolled, stripeDelivery(event, { secret: "whsec_old" })).id).toBe("evt_1");
    const both = stripeDelivery(event, { secret: "whsec_retired" });
    const mine = stripeDelivery(event).headers["stripe-signature"]!;
    both.headers["stripe-signature"] += `,${mine.split(",").find((p) => p.startsWith("v1="))}`;
    expect(check(stripeScheme({ secret: STRIPE_SECRET }), both).id).toBe("evt_1");
  });

  it("refuses a signed body without an event id as a bad payload, not as a bad signature", () => {
    expect(reasonOf(() => check(scheme, stripeDelivery({ type: "x" })))).toBe("payload");
  });
});

describe("Standard Webhooks scheme (signed by standardwebhooks' Webhook.sign)", () => {
  const payload = { type: "invoice.paid", timestamp: new Date().toISOString(), data: { amount: 5000 } };

  it("accepts v1 and reads the id from webhook-id and the type from the body", () => {
    const v = check(standardWebhooksScheme({ secret: STANDARD_SECRET }), standardDelivery("msg_1", payload));
    expect(v).toMatchObject({ id: "msg_1", type: "invoice.paid" });
    expect(v.createdAt?.toISOString()).toBe(payload.timestamp);
  });

  it("refuses a tampered body, a wrong secret, an old timestamp and missing headers", () => {
    const scheme = standardWebhooksScheme({ secret: STANDARD_SECRET });
    const d = standardDelivery("msg_1", payload);
    expect(reasonOf(() => check(scheme, tamper(d)))).toBe("signature");
    expect(reasonOf(() => check(standardWebhooksScheme({ secret: "whsec_b3RoZXI=" }), d))).toBe("signature");
    const old = standardDelivery("msg_1", payload, { at: new Date(Date.now() - 600_000) });
    expect(reasonOf(() => check(scheme, old))).toBe("timestamp");
    const { "webhook-id": _, ...noId } = d.headers;
    expect(reasonOf(() => check(scheme, { ...d, headers: noId }))).toBe("missing-header");
  });

  it("accepts an Ed25519 (v1a) signature with the whpk_ public key, and refuses it with another key", () => {
    const signer = ed25519Signer();
    const ts = now();
    const body = JSON.stringify(payload);
    const d: Delivery = {
      headers: {
        "webhook-id": "msg_2",
        "webhook-timestamp": String(ts),
        "webhook-signature": signer.sign("msg_2", ts, body),
      },
      body,
    };
    expect(check(standardWebhooksScheme({ secret: signer.publicKey }), d).id).toBe("msg_2");
    expect(reasonOf(() => check(standardWebhooksScheme({ secret: ed25519Signer().publicKey }), d))).toBe(
      "signature",
    );
    expect(
      reasonOf(() =>
        check(
          standardWebhooksScheme({ secret: signer.publicKey }),
          tamper({ ...d, body: body.replace("5000", "5000 ") }),
        ),
      ),
    ).toBe("signature");
    // Mixed keys (HMAC being replaced by Ed25519): either signature is enough.
    const mixed = standardWebhooksScheme({ secret: [STANDARD_SECRET, signer.publicKey] });
    expect(check(mixed, d).id).toBe("msg_2");
    expect(check(mixed, standardDelivery("msg_3", payload)).id).toBe("msg_3");
  });

  it("accepts a header carrying the old and the new secret's signatures (a sender mid-rotation)", () => {
    const a = standardDelivery("msg_4", payload, { secret: "whsec_b2xkLXNlY3JldA==" });
    const b = standardDelivery("msg_4", payload);
    const both = {
      ...a,
      headers: {
        ...a.headers,
        "webhook-signature": `${a.headers["webhook-signature"]} ${b.headers["webhook-signature"]}`,
      },
    };
    expect(check(standardWebhooksScheme({ secret: STANDARD_SECRET }), both).id).toBe("msg_4");
  });
});

describe("GitHub scheme (signed by @octokit/webhooks-methods' sign)", () => {
  const scheme = githubScheme({ secret: GITHUB_SECRET });
  const payload = { action: "opened", issue: { number: 1347 } };

  it("accepts GitHub's signature; the id is X-GitHub-Delivery and the type <event>.<action>", async () => {
    const v = check(scheme, await githubDelivery("72d3162e-cc78-11e3-81ab-4c9367dc0958", "issues", payload));
    expect(v).toMatchObject({
      id: "72d3162e-cc78-11e3-81ab-4c9367dc0958",
      type: "issues.opened",
      createdAt: null,
    });
  });

  it("refuses a tampered body, a wrong secret and missing headers", async () => {
    const d = await githubDelivery("d-1", "issues", payload);
    expect(reasonOf(() => check(scheme, { ...d, body: d.body.replace("1347", "1348") }))).toBe("signature");
    const forged = { ...d.headers, "x-hub-signature-256": `sha256=${"ab".repeat(32)}` };
    expect(reasonOf(() => check(scheme, { ...d, headers: forged }))).toBe("signature");
    expect(
      reasonOf(() => check(scheme, { ...d, headers: { ...d.headers, "x-hub-signature-256": "sha1=00" } })),
    ).toBe("malformed");
    const wrong = await githubDelivery("d-1", "issues", payload, "another secret");
    expect(reasonOf(() => check(scheme, wrong))).toBe("signature");
    const { "x-github-delivery": _, ...noId } = d.headers;
    expect(reasonOf(() => check(scheme, { ...d, headers: noId }))).toBe("missing-header");
  });

  it("reads a form-encoded delivery's payload field", async () => {
    const json = JSON.stringify(payload);
    const body = new URLSearchParams({ payload: json }).toString();
    const { sign } = await import("@octokit/webhooks-methods");
    const d: Delivery = {
      headers: {
        "content-type": "application/x-www-form-urlencoded",
        "x-github-delivery": "d-2",
        "x-github-event": "issues",
        "x-hub-signature-256": await sign(GITHUB_SECRET, body),
      },
      body,
    };
    expect(check(scheme, d)).toMatchObject({ id: "d-2", type: "issues.opened" });
  });
});
