/**
 * A client for the provider simulator (and any Stripe-like charges API) that sorts every result into the
 * three kinds a phases runner must tell apart:
 *   charged    the charge exists (new, or the one an earlier attempt with this key made)
 *   declined   a final business answer: save it, replay it, never retry it
 *   rejected   a final refusal of the request itself (400, 422 key reused with other parameters)
 *   transient  nothing is known: a timeout, a 5xx, a dropped connection. Retry with the SAME key.
 */
import { Agent, request } from "node:http";
import type { Charge, ProviderFault } from "./provider.ts";

/** How a charge request ended: charged, declined (final), rejected (a bad request), or transient. */
export type ChargeResult =
  | { kind: "charged"; charge: Charge; replayed: boolean }
  | { kind: "declined"; code: string; message: string; chargeId: string | null }
  | { kind: "rejected"; status: number; code: string; message: string }
  | { kind: "transient"; reason: "timeout" | "server-error" | "network" | "aborted"; status?: number };

/** A charge to make (`chargeProvider`). */
export interface ChargeRequest {
  /** The amount in minor units (cents). */
  amount: number;
  /** ISO 4217 currency. */
  currency: string;
  /** The card number or token; the simulator declines chosen ones. */
  card?: string;
  /** Sent as `Idempotency-Key`: derive it from your own key (a phase's `ctx.idempotencyKey`). */
  idempotencyKey?: string;
  /**
   * Your own id for the payment, stored with the charge and searchable (`findCharges`): what a provider
   * without idempotency keys offers instead. Use `ctx.idempotencyKey`.
   */
  reference?: string;
  /** Give up after this long (a transient result). Default: 10,000 ms: keep it well under the lease. */
  timeoutMs?: number;
  /** Abort early (e.g. a phase's `ctx.signal`: the lease was lost). */
  signal?: AbortSignal;
  /** Ask the simulator for a fault on this request (`X-Fault`). */
  fault?: ProviderFault;
}

const agent = new Agent({ keepAlive: true, maxSockets: 256 });

/** `POST {url}/v1/charges` as `request` options, parsed once per provider URL (a URL per call shows). */
const chargeTargets = new Map<string, { protocol: string; host: string; port: string; path: string }>();
function chargeTarget(url: string) {
  let t = chargeTargets.get(url);
  if (!t) {
    const u = new URL("/v1/charges", url);
    t = {
      protocol: u.protocol,
      host: u.hostname.replace(/^\[(.*)\]$/, "$1"),
      port: u.port,
      path: u.pathname,
    };
    if (chargeTargets.size > 100) chargeTargets.clear();
    chargeTargets.set(url, t);
  }
  return t;
}

/** `POST {url}/v1/charges`, classified. Never throws for HTTP or network failures. */
export function chargeProvider(url: string, req: ChargeRequest): Promise<ChargeResult> {
  const body = JSON.stringify({
    amount: req.amount,
    currency: req.currency,
    card: req.card ?? null,
    ...(req.reference ? { reference: req.reference } : {}),
  });
  const target = chargeTarget(url);
  return new Promise<ChargeResult>((resolve) => {
    let settled = false;
    const done = (r: ChargeResult) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      req.signal?.removeEventListener("abort", onAbort);
      resolve(r);
    };
    const headers: Record<string, string> = {
      "content-type": "application/json",
      "content-length": String(Buffer.byteLength(body)),
    };
    if (req.idempotencyKey) headers["idempotency-key"] = req.idempotencyKey;
    if (req.fault) headers["x-fault"] = req.fault;
    const r = request({ ...target, method: "POST", headers, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", () => done({ kind: "transient", reason: "network" }));
      res.on("aborted", () => done({ kind: "transient", reason: "network" }));
      res.on("end", () => {
        const status = res.statusCode ?? 0;
        let json: any;
        try {
          json = JSON.parse(Buffer.concat(chunks).toString("utf8"));
        } catch {
          json = undefined;
        }
        if (status >= 200 && status < 300 && json?.id) {
          done({
            kind: "charged",
            charge: json as Charge,
            replayed: res.headers["idempotent-replayed"] === "true",
          });
        } else if (status === 402) {
          done({
            kind: "declined",
            code: String(json?.error?.code ?? "card_declined"),
            message: String(json?.error?.message ?? "declined"),
            chargeId: json?.error?.charge ?? null,
          });
        } else if (status === 408 || status === 409 || status === 429 || status >= 500 || status === 0) {
          done({ kind: "transient", reason: "server-error", status });
        } else {
          done({
            kind: "rejected",
            status,
            code: String(json?.error?.code ?? "rejected"),
            message: String(json?.error?.message ?? `HTTP ${status}`),
          });
        }
      });
    });
    const timer = setTimeout(() => {
      done({ kind: "transient", reason: "timeout" });
      r.destroy();
    }, req.timeoutMs ?? 10_000);
    const onAbort = () => {
      done({ kind: "transient", reason: "aborted" });
      r.destroy();
    };
    r.on("error", () => done({ kind: "transient", reason: "network" }));
    if (req.signal?.aborted) return onAbort();
    req.signal?.addEventListener("abort", onAbort, { once: true });
    r.end(body);
  });
}

/**
 * `GET {url}/v1/charges?reference=...`: the charges made with this reference, oldest first. Throws
 * when the provider cannot answer (a 5xx, a timeout): then nobody can tell yet whether it charged.
 */
export async function findCharges(
  url: string,
  reference: string,
  options: { timeoutMs?: number; signal?: AbortSignal } = {},
): Promise<Charge[]> {
  const target = new URL("/v1/charges", url);
  target.searchParams.set("reference", reference);
  const timeout = AbortSignal.timeout(options.timeoutMs ?? 5_000);
  const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
  const res = await fetch(target, { signal });
  if (!res.ok) throw new Error(`the provider's search answered HTTP ${res.status}`);
  return ((await res.json()) as { data: Charge[] }).data;
}

/** `GET {url}/v1/charges`: every charge the provider made (with `scope`, only that scope's). */
export async function listCharges(url: string, options: { scope?: string } = {}): Promise<Charge[]> {
  const target = new URL("/v1/charges", url);
  if (options.scope) target.searchParams.set("scope", options.scope);
  const res = await fetch(target);
  if (!res.ok) throw new Error(`GET /v1/charges: HTTP ${res.status}`);
  return ((await res.json()) as { data: Charge[] }).data;
}
