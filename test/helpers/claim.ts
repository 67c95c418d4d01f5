import { type Claim, fingerprint } from "../../src/core/index.ts";

/** The claim a JSON POST /v1/payments with `body` makes under (scope, key), as the adapters build it. */
export function paymentClaim(scope: string, key: string, body: string): Claim {
  return {
    scope,
    key,
    fingerprint: fingerprint({
      method: "POST",
      path: "/v1/payments",
      contentType: "application/json",
      body: new TextEncoder().encode(body),
    }),
  };
}
