/**
 * SHA-256 of a string in one call (`crypto.hash`, Node 20.12+: no Hash object, one UTF-8 conversion),
 * the same digest as `createHash` fed the same text. Asked for as a "binary" (latin1) string, one char
 * per byte, and copied into a pooled Buffer: faster than its own Buffer output, which Node 20 and 24
 * allocate outside the pool (docs/decisions/sha256-one-shot.md). Used per request by the fingerprint
 * and the key's lock id.
 */
import * as crypto from "node:crypto";

const oneShot = (crypto as { hash?: (algorithm: string, data: string, encoding: "binary") => string }).hash;

export function sha256(text: string): Buffer {
  return oneShot
    ? Buffer.from(oneShot("sha256", text, "binary"), "latin1")
    : crypto.createHash("sha256").update(text).digest();
}
