/**
 * Refunds through a Stripe-shaped API: `POST {url}/v1/refunds` with a form body (`charge`, `amount`,
 * `metadata[reason]`), `Idempotency-Key`, and a bearer secret key when given. The provider simulator
 * (`idem provider`, `startProvider`) takes the same request.
 */
import type { Refunder, RefundRequest, RefundResult } from "./compensate.ts";

/** Options of {@link httpRefunder}. */
export interface HttpRefunderOptions {
  /** Sent as `Authorization: Bearer <apiKey>`. Default: none. */
  apiKey?: string;
  /** Give up on one call after this long (a transient result). Default: 10,000 ms. */
  timeoutMs?: number;
  /** The fetch function. Default: the global `fetch`. */
  fetch?: typeof fetch;
}

/** A {@link Refunder} for a Stripe-shaped refunds API at `baseUrl`. */
export function httpRefunder(baseUrl: string, options: HttpRefunderOptions = {}): Refunder {
  const url = new URL("/v1/refunds", baseUrl);
  const fetchFn = options.fetch ?? fetch;
  return async (r: RefundRequest): Promise<RefundResult> => {
    const body = new URLSearchParams({ charge: r.chargeId, amount: String(r.amount), reason: r.reason });
    const headers: Record<string, string> = {
      "content-type": "application/x-www-form-urlencoded",
      "idempotency-key": r.idempotencyKey,
    };
    if (options.apiKey) headers.authorization = `Bearer ${options.apiKey}`;
    let res: Response;
    try {
      res = await fetchFn(url, {
        method: "POST",
        headers,
        body,
        signal: AbortSignal.any([r.signal, AbortSignal.timeout(options.timeoutMs ?? 10_000)]),
      });
    } catch (err) {
      return { kind: "transient", message: `no answer from the provider (${(err as Error).message})` };
    }
    const json = (await res.json().catch(() => undefined)) as
      | { id?: unknown; error?: { code?: unknown; message?: unknown } }
      | undefined;
    if (res.ok && typeof json?.id === "string") return { kind: "refunded", id: json.id };
    if (res.status === 408 || res.status === 409 || res.status === 429 || res.status >= 500) {
      return { kind: "transient", message: `the provider answered ${res.status}` };
    }
    const message = String(json?.error?.message ?? `HTTP ${res.status}`);
    return {
      kind: "rejected",
      message: `${res.status} ${String(json?.error?.code ?? "")}: ${message}`.trim(),
    };
  };
}
