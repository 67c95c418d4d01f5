/**
 * How a scope and an idempotency key appear in exported telemetry: never as they are (a key may be
 * guessable or carry a client's data, a scope is an account id), but as a short hash by default, a
 * prefix, or not at all. `configureTelemetry({ keys: ... })` from `idem/observability` chooses.
 */

/** `"hash"`: the first 16 hex digits of SHA-256 (default); `{ prefix: n }`: the first n characters; `"omit"`. */
export type KeyForm = "hash" | "omit" | { prefix: number };

/** Options of {@link configureTelemetry}. */
export interface TelemetryOptions {
  /** How scopes and keys are exported. Default `"hash"`. */
  keys?: KeyForm;
}

let form: KeyForm = "hash";

/** Choose how idem exports scopes and keys in span attributes (process-wide). */
export function configureTelemetry(options: TelemetryOptions): void {
  if (options.keys !== undefined) form = options.keys;
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

/** The attributes naming a key: `idempotency.scope` and `idempotency.key`, in the exportable form. */
export function keyAttributes(scope: string | undefined, key: string | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  const s = exportable(scope);
  const k = exportable(key);
  if (s !== undefined) out["idempotency.scope"] = s;
  if (k !== undefined) out["idempotency.key"] = k;
  return out;
}
