/**
 * Every error idem throws or answers with. Each has a stable `code` (also the last segment of the
 * problem `type` URI on HTTP), a `status` when it maps to an HTTP answer, and keeps its `cause`.
 */
export const ProblemCode = {
  KeyMissing: "idempotency-key-missing",
  KeyInvalid: "idempotency-key-invalid",
  KeyInFlight: "idempotency-key-in-flight",
  KeyMismatch: "idempotency-key-mismatch",
  LeaseLost: "idempotency-lease-lost",
  Retryable: "retryable-failure",
  OperationUncertain: "operation-uncertain",
  AmbiguousBody: "ambiguous-body",
  InvalidBody: "invalid-body",
  BodyTooLarge: "body-too-large",
  Unauthorized: "unauthorized",
  NotFound: "not-found",
  StoredValueUnreadable: "stored-value-unreadable",
} as const;
/** One of the stable error codes of {@link ProblemCode}. */
export type ProblemCode = (typeof ProblemCode)[keyof typeof ProblemCode];

/** The base of every error idem answers with: a stable `code` and the HTTP `status` it maps to. */
export class IdemError extends Error {
  /** Always `"IdemError"`: the name logs and stack traces show. */
  override name = "IdemError";
  /** A stable code: one of {@link ProblemCode} for idem's own errors, the problem's `type` ends with it. */
  readonly code: ProblemCode | string;
  /** The HTTP status this error is answered with, when it reaches a client. */
  readonly status: number;
  constructor(code: ProblemCode | string, status: number, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.status = status;
  }
}

/** The request has no `Idempotency-Key` header on a route that requires one. */
export class KeyMissingError extends IdemError {
  /** Always `"KeyMissingError"`: the name logs and stack traces show. */
  override name = "KeyMissingError";
  constructor() {
    super(
      ProblemCode.KeyMissing,
      400,
      "This endpoint requires an Idempotency-Key header (a UUID is recommended).",
    );
  }
}

/** The `Idempotency-Key` header is not 1..255 visible ASCII characters (bare or as a quoted sf-string). */
export class KeyInvalidError extends IdemError {
  /** Always `"KeyInvalidError"`: the name logs and stack traces show. */
  override name = "KeyInvalidError";
  constructor(reason: string) {
    super(ProblemCode.KeyInvalid, 400, `The Idempotency-Key header is invalid: ${reason}.`);
  }
}

/** Another request with the same key is still being processed. Retry after `retryAfterSeconds`. */
export class KeyInFlightError extends IdemError {
  /** Always `"KeyInFlightError"`: the name logs and stack traces show. */
  override name = "KeyInFlightError";
  /** When to retry with the same key, in seconds (the answer's `Retry-After`). */
  readonly retryAfterSeconds: number;
  /** The claim in progress (`keys.claim_id`), when the thrower knows it: named by the answer's reference. */
  readonly claimId?: string | null;
  constructor(retryAfterSeconds: number, claimId?: string | null) {
    super(
      ProblemCode.KeyInFlight,
      409,
      "A request with this Idempotency-Key is still in progress; retry with the same key later.",
    );
    this.retryAfterSeconds = retryAfterSeconds;
    if (claimId) this.claimId = claimId;
  }
}

/** The key was used before for a different request (another method, path or body). */
export class KeyMismatchError extends IdemError {
  /** Always `"KeyMismatchError"`: the name logs and stack traces show. */
  override name = "KeyMismatchError";
  constructor() {
    super(
      ProblemCode.KeyMismatch,
      422,
      "This Idempotency-Key was already used with a different request; use a new key for a new request.",
    );
  }
}

/** This worker's lease on a key was taken over by another worker: it must stop and write nothing. */
export class LeaseLostError extends IdemError {
  /** Always `"LeaseLostError"`: the name logs and stack traces show. */
  override name = "LeaseLostError";
  constructor() {
    super(
      ProblemCode.LeaseLost,
      409,
      "Our lease on this key expired and another worker took over; stopping.",
    );
  }
}

/** A failure whose outcome may change on a retry (a provider timeout, a 5xx). Nothing final was saved. */
export class RetryableError extends IdemError {
  /** Always `"RetryableError"`: the name logs and stack traces show. */
  override name = "RetryableError";
  /** When to retry with the same key, in seconds (the answer's `Retry-After`). Default 1. */
  readonly retryAfterSeconds: number;
  constructor(message: string, options?: { cause?: unknown; retryAfterSeconds?: number }) {
    super(ProblemCode.Retryable, 503, message, options);
    this.retryAfterSeconds = options?.retryAfterSeconds ?? 1;
  }
}

/**
 * An external call started and its outcome cannot be established (the lease expired after the call
 * began and there is no way to look it up, a provider timeout with no lookup, a key in needs_review).
 * Never retried automatically, with either key: `operationRef` goes to a person.
 */
export class OperationUncertainError extends IdemError {
  /** Always `"OperationUncertainError"`: the name logs and stack traces show. */
  override name = "OperationUncertainError";
  /** The opaque reference of the key row (sealed by the store's `refs`), for `idem keys inspect --ref`. */
  readonly operationRef: string;
  constructor(operationRef: string, message?: string, options?: { cause?: unknown }) {
    super(
      ProblemCode.OperationUncertain,
      409,
      message ??
        "This operation started a call to another system whose outcome is unknown; do not retry it, with this key or a new one: give the operation_ref to support.",
      options,
    );
    this.operationRef = operationRef;
  }
}

/** The body can be read more than one way (a repeated form field, a duplicate JSON key): 400, nothing claimed. */
export class AmbiguousBodyError extends IdemError {
  /** Always `"AmbiguousBodyError"`: the name logs and stack traces show. */
  override name = "AmbiguousBodyError";
  constructor(detail: string) {
    super(ProblemCode.AmbiguousBody, 400, detail);
  }
}

/** The body is not what its Content-Type says (invalid JSON or UTF-8): 400, nothing claimed. */
export class InvalidBodyError extends IdemError {
  /** Always `"InvalidBodyError"`: the name logs and stack traces show. */
  override name = "InvalidBodyError";
  constructor(detail: string) {
    super(ProblemCode.InvalidBody, 400, detail);
  }
}

/** Whether `e` is one of idem's errors (an {@link IdemError}). */
export const isIdemError = (e: unknown): e is IdemError => e instanceof IdemError;
export const isKeyInFlightError = (e: unknown): e is KeyInFlightError => e instanceof KeyInFlightError;
export const isKeyMismatchError = (e: unknown): e is KeyMismatchError => e instanceof KeyMismatchError;
export const isLeaseLostError = (e: unknown): e is LeaseLostError => e instanceof LeaseLostError;
export const isOperationUncertainError = (e: unknown): e is OperationUncertainError =>
  e instanceof OperationUncertainError;
export const isRetryableError = (e: unknown): e is RetryableError => e instanceof RetryableError;

/**
 * What a handler's statements reject with on a route with `effectsInTxOnly` when its key turned out to
 * be taken (a retry, or a duplicate from another process): they were sent with the claim and are rolled
 * back, and the key's own answer is given instead of the handler's. Let it propagate.
 */
export class AbandonedWorkError extends Error {
  /** Always `"AbandonedWorkError"`: the name logs and stack traces show. */
  override name = "AbandonedWorkError";
  constructor() {
    super("this request's key was already taken: its statements were rolled back and its answer is not used");
  }
}
