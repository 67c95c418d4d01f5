/**
 * How a scope and an idempotency key appear in exported telemetry: never as they are (a key may be
 * guessable or carry a client's data, a scope is an account id), but as a short hash by default, a
 * prefix, or not at all. `configureTelemetry({ keys: ... })` from `idem/observability` chooses; and
 * whether the W3C baggage of a request's context is stored with the events it writes (never, unless
 * `configureTelemetry({ baggageInEvents: true })`: baggage is the caller's, and an event outlives the
 * request and reaches other services).
 */

/** `"hash"`: the first 16 hex digits of SHA-256 (default); `{ prefix: n }`: the first n characters; `"omit"`. */
export type KeyForm = "hash" | "omit" | { prefix: number };

/** Options of {@link configureTelemetry}. */
export interface TelemetryOptions {
  /** How scopes and keys are exported. Default `"hash"`. */
  keys?: KeyForm;
  /**
   * Store the request context's W3C baggage with the outbox events it writes (and pass it on to the
   * broker), beside the trace context. Default `false`: only `traceparent` and `tracestate` go.
   */
  baggageInEvents?: boolean;
}

let form: KeyForm = "hash";
let eventBaggage = false;

/** Choose how idem exports scopes and keys in span attributes, and what events carry (process-wide). */
export function configureTelemetry(options: TelemetryOptions): void {
  if (options.keys !== undefined) form = options.keys;
  if (options.baggageInEvents !== undefined) eventBaggage = options.baggageInEvents;
}

/** Whether events carry the request context's baggage (`TelemetryOptions.baggageInEvents`). */
export function baggageInEvents(): boolean {
  return eventBaggage;
}

type Hasher = { createHash(alg: string): { update(s: string): { digest(enc: string): string } } };
let crypto: Hasher | null | undefined;

function hasher(): Hasher | null {
  if (crypto === undefined) {
    const proc = (globalThis as { process?: { getBuiltinModule?: (id: string) => unknown } }).process;
    crypto = (proc?.getBuiltinModule?.("node:crypto") as Hasher | undefined) ?? null;
  }
  return crypto;
}

/** `value` in the configured exportable form, or undefined when it is not to be exported. */
export function exportable(value: string | undefined): string | undefined {
  if (value === undefined || form === "omit") return undefined;
  if (typeof form === "object") return value.slice(0, Math.max(0, form.prefix));
  const h = hasher();
  return h ? h.createHash("sha256").update(value).digest("hex").slice(0, 16) : undefined;
}

/** The attributes naming a key: `idem.scope` and `idem.key`, in the exportable form. */
export function keyAttributes(scope: string | undefined, key: string | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  const s = exportable(scope);
  const k = exportable(key);
  if (s !== undefined) out["idem.scope"] = s;
  if (k !== undefined) out["idem.key"] = k;
  return out;
}
