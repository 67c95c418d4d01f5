/**
 * What idem answers when a key's stored values cannot be used, in one place for the lifecycle and the
 * operation lookup: the answer's error, or undefined for any other error.
 *
 *   altered     a sealed value that fails authentication (altered, truncated, moved from another row):
 *               no key will ever open it, so no retry can help and none is asked for: 500
 *               `stored-value-unreadable`, `operation_state: uncertain`, a person looks (the ref)
 *   key-missing a value sealed with a key this instance lacks (a rotation rolling out): another
 *               instance, or this one once configured, opens it: 503 with Retry-After, same key
 *   damaged     a finished key's saved answer that is unusable (a row altered): the work is done and
 *               never run again, the reply never sent: 503 with Retry-After 60
 */
import { IdemError, ProblemCode, RetryableError } from "./errors.ts";
import { DamagedReplyError } from "./response.ts";
import { SealedValueError } from "./sealing.ts";

/** The error to answer for a stored value that cannot be used, or undefined when `err` is not one. */
export function storedValueError(err: unknown): IdemError | undefined {
  if (err instanceof SealedValueError && err.reason === "altered") {
    return new IdemError(
      ProblemCode.StoredValueUnreadable,
      500,
      "A stored value of this key was altered and no encryption key can open it: do not retry, with this key or another; give the operation_ref to support.",
      { cause: err },
    );
  }
  if (err instanceof SealedValueError) {
    return new RetryableError(
      "A saved value of this key cannot be opened here (an encryption key this instance lacks); retry with the same key.",
      { cause: err, retryAfterSeconds: 1 },
    );
  }
  if (err instanceof DamagedReplyError) {
    return new RetryableError(
      `The saved answer of this key is damaged (${err.message}) and is not sent; the work is not run again.`,
      { cause: err, retryAfterSeconds: 60 },
    );
  }
  return undefined;
}
