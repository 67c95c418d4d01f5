/**
 * GitHub's scheme: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`, the delivery's GUID in
 * `X-GitHub-Delivery` (kept by a redelivery: what the inbox deduplicates on) and the event in
 * `X-GitHub-Event` (the type is `<event>.<action>` when the body has an action, e.g. `issues.opened`).
 *
 * GitHub signs no timestamp, so an old delivery replayed intact cannot be told from a retry by its
 * signature: the inbox's mark absorbs it while the mark is kept (`sweepInbox`'s retention).
 * A webhook set to `application/x-www-form-urlencoded` sends the JSON in a `payload` field: both work.
 */
import { createHmac } from "node:crypto";
import { sameBytes, WebhookVerificationError } from "../messaging/webhook.ts";
import { WebhookPayloadError } from "./errors.ts";
import {
  bodyText,
  jsonObject,
  required,
  type Secrets,
  secretList,
  type VerifiedWebhook,
  type WebhookInput,
  type WebhookScheme,
} from "./scheme.ts";

/** Options of {@link githubScheme}. */
export interface GithubSchemeOptions {
  /** The webhook's secret(s): the old and the new one while you change it. Required. */
  secret: Secrets;
}

/** GitHub's `X-Hub-Signature-256` scheme, several secrets at once. */
export function githubScheme(options: GithubSchemeOptions): WebhookScheme {
  const keys = secretList(options.secret, "githubScheme").map((s) => Buffer.from(s));
  return {
    name: "github",
    verify(input: WebhookInput): VerifiedWebhook {
      const id = required(input, "x-github-delivery");
      const event = required(input, "x-github-event");
      const header = required(input, "x-hub-signature-256");
      const hex = /^sha256=([0-9a-f]{64})$/i.exec(header.trim())?.[1];
      if (!hex)
        throw new WebhookVerificationError("X-Hub-Signature-256 is not sha256=<64 hex digits>", "malformed");
      const given = Buffer.from(hex, "hex");
      const signed = keys.some((key) =>
        sameBytes(given, createHmac("sha256", key).update(input.body).digest()),
      );
      if (!signed)
        throw new WebhookVerificationError(
          "X-Hub-Signature-256 does not match the body with any of the secrets",
        );
      const text = bodyText(input.body);
      let json = text;
      if ((input.header("content-type") ?? "").startsWith("application/x-www-form-urlencoded")) {
        const field = new URLSearchParams(text).get("payload");
        if (field === null) throw new WebhookPayloadError("the form-encoded body has no payload field");
        json = field;
      }
      const payload = jsonObject(json);
      const action = typeof payload.action === "string" && payload.action ? `.${payload.action}` : "";
      return {
        id,
        type: `${event}${action}`,
        payload,
        createdAt: null,
        headers: { "x-github-delivery": id, "x-github-event": event },
      };
    },
  };
}
