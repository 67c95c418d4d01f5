/**
 * The operation reference: an opaque string that names one key row, handed to clients in problem
 * responses (`operation_ref`) so that a person can look the operation up (`idem keys inspect --ref`).
 * Clients must treat it as opaque; only idem decodes it. It carries nothing the caller does not already
 * know (their own scope and key), so it is safe to show to them.
 */
const PREFIX = "op_";

/** The operation reference of the key `key` in `scope` (`op_` and an opaque encoding). */
export function encodeOperationRef(scope: string, key: string): string {
  return PREFIX + Buffer.from(JSON.stringify([scope, key]), "utf8").toString("base64url");
}

/** The scope and key an operation reference names, or undefined when it is not one of ours. */
export function decodeOperationRef(ref: string): { scope: string; key: string } | undefined {
  if (!ref.startsWith(PREFIX)) return undefined;
  try {
    const v: unknown = JSON.parse(Buffer.from(ref.slice(PREFIX.length), "base64url").toString("utf8"));
    if (Array.isArray(v) && v.length === 2 && typeof v[0] === "string" && typeof v[1] === "string") {
      return { scope: v[0], key: v[1] };
    }
  } catch {
    // not ours
  }
  return undefined;
}
