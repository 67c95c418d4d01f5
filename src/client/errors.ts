/**
 * Every way a client call can end other than with a final answer, as typed errors.
 *
 * Each class has a `name`, a stable `code` (safe to match on across versions) and an `isXError` guard
 * that also works across realms and duplicated copies of the package (it checks `code`, not
 * `instanceof`). The errors that end a retry loop ("give-ups") share {@link GiveUpError}: they carry
 * the idempotency key, the number of attempts made, and the last response or error seen.
 */

import type { OperationState } from "./answer.ts";

/** Stable error codes. Match on these, not on messages. */
export const ClientErrorCode = {
  deadlineExceeded: "IDEM_DEADLINE_EXCEEDED",
  retryBudgetExhausted: "IDEM_RETRY_BUDGET_EXHAUSTED",
  circuitOpen: "IDEM_CIRCUIT_OPEN",
  attemptsExhausted: "IDEM_ATTEMPTS_EXHAUSTED",
  aborted: "IDEM_ABORTED",
  intentNotFound: "IDEM_INTENT_NOT_FOUND",
  intentConflict: "IDEM_INTENT_CONFLICT",
  intentHasNoRequest: "IDEM_INTENT_HAS_NO_REQUEST",
  unreplayableBody: "IDEM_UNREPLAYABLE_BODY",
  operationUncertain: "IDEM_OPERATION_UNCERTAIN",
  intentExpired: "IDEM_INTENT_EXPIRED",
  newKeyNotSafe: "IDEM_NEW_KEY_NOT_SAFE",
  failedFast: "IDEM_FAILED_FAST",
} as const;
/** One of the values of {@link ClientErrorCode}. */
export type ClientErrorCode = (typeof ClientErrorCode)[keyof typeof ClientErrorCode];

/** Base class of every error thrown by `idem/client`. */
export class IdemClientError extends Error {
  /** Always `"IdemClientError"`: the name logs and stack traces show. */
  override name = "IdemClientError";
  /** A stable code ({@link ClientErrorCode}) to check instead of the class. */
  readonly code: ClientErrorCode;
  constructor(code: ClientErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }
}

/** An error about one intent, named by `intentId`. */
export class IntentError extends IdemClientError {
  /** Always `"IntentError"`: the name logs and stack traces show. */
  override name = "IntentError";
  /** The intent the error is about. */
  readonly intentId: string;
  constructor(code: ClientErrorCode, intentId: string, message: string) {
    super(code, message);
    this.intentId = intentId;
  }
}

/** What a give-up error knows about the call it ended. */
export interface GiveUpDetails {
  /** The intent's id. */
  intentId: string;
  /** The idempotency key every attempt carried. */
  key: string;
  /** Attempts actually sent (0 when the call failed before the first one). */
  attempts: number;
  /**
   * The last response received, if the last attempt got one. Its body has been read into memory,
   * so it can be inspected (`await err.lastResponse.json()`) without holding a connection open.
   */
  lastResponse?: Response;
  /** The last network error or per-try timeout, if the last attempt got no response. */
  lastError?: unknown;
  /** The operation's state, as the last response reported it (problem body or header). */
  operationState?: OperationState;
  /** The last response said a new key cannot duplicate the operation (see `retryWithNewKey`). */
  safeNewKey?: boolean;
  /** The server's reference of the operation, for an operator. */
  operationRef?: string;
  /** Where the operation can be looked up (`client.status(intent)` asks it), when the server offers it. */
  lookupUrl?: string;
}

/**
 * A retry loop gave up. The outcome of the intent is UNKNOWN unless `lastResponse` says otherwise:
 * the intent stays pending in the store, and retrying it later with the same key is safe.
 */
export class GiveUpError extends IdemClientError {
  /** Always `"GiveUpError"`: the name logs and stack traces show. */
  override name = "GiveUpError";
  /** The intent's id (it stays pending in the store). */
  readonly intentId: string;
  /** The idempotency key every attempt carried: retry later with this one. */
  readonly key: string;
  /** Attempts actually sent (0 when the call failed before the first one). */
  readonly attempts: number;
  /** The last response, its body already read into memory (`await err.lastResponse.json()`). */
  readonly lastResponse?: Response;
  /** The last network error or per-try timeout, if the last attempt got no response. */
  readonly lastError?: unknown;
  /** The operation's state, as the last response reported it. */
  readonly operationState?: OperationState;
  /** The last response said a new key cannot duplicate the operation (see `retryWithNewKey`). */
  readonly safeNewKey?: boolean;
  /** The server's reference of the operation, for an operator. */
  readonly operationRef?: string;
  constructor(code: ClientErrorCode, message: string, details: GiveUpDetails, cause = details.lastError) {
    super(code, message, { cause });
    this.intentId = details.intentId;
    this.key = details.key;
    this.attempts = details.attempts;
    if (details.lastResponse) this.lastResponse = details.lastResponse;
    if (details.lastError !== undefined) this.lastError = details.lastError;
    if (details.operationState !== undefined) this.operationState = details.operationState;
    if (details.safeNewKey !== undefined) this.safeNewKey = details.safeNewKey;
    if (details.operationRef !== undefined) this.operationRef = details.operationRef;
  }
}

/** Why a {@link DeadlineExceededError} was raised. */
export const DeadlineReason = {
  /** The deadline passed during an attempt or a wait. */
  elapsed: "elapsed",
  /** The next wait (a server's Retry-After, or the backoff) would have ended after the deadline. */
  waitTooLong: "wait-too-long",
} as const;
/** One of the values of {@link DeadlineReason}. */
export type DeadlineReason = (typeof DeadlineReason)[keyof typeof DeadlineReason];

/** The call's single deadline is spent, or the next wait would outlast it (so we did not start it). */
export class DeadlineExceededError extends GiveUpError {
  /** Always `"DeadlineExceededError"`: the name logs and stack traces show. */
  override name = "DeadlineExceededError";
  /** Whether the deadline passed or the next wait would have outlasted it. */
  readonly reason: DeadlineReason;
  /** The wait that was refused, when `reason` is `"wait-too-long"`. */
  readonly waitMs?: number;
  constructor(details: GiveUpDetails & { reason: DeadlineReason; waitMs?: number; deadlineMs: number }) {
    super(
      ClientErrorCode.deadlineExceeded,
      details.reason === DeadlineReason.waitTooLong
        ? `Gave up after ${details.attempts} attempt(s): the next wait (${Math.round(details.waitMs ?? 0)} ms) would outlast the ${details.deadlineMs} ms deadline`
        : `Gave up after ${details.attempts} attempt(s): the ${details.deadlineMs} ms deadline passed`,
      details,
    );
    this.reason = details.reason;
    if (details.waitMs !== undefined) this.waitMs = details.waitMs;
  }
}

/** The client's shared retry budget had no token for another retry. */
export class RetryBudgetExhaustedError extends GiveUpError {
  /** Always `"RetryBudgetExhaustedError"`: the name logs and stack traces show. */
  override name = "RetryBudgetExhaustedError";
  constructor(details: GiveUpDetails) {
    super(
      ClientErrorCode.retryBudgetExhausted,
      `Gave up after ${details.attempts} attempt(s): the retry budget is spent`,
      details,
    );
  }
}

/** The circuit breaker is open (or half-open with every probe slot taken): the attempt was not sent. */
export class CircuitOpenError extends GiveUpError {
  /** Always `"CircuitOpenError"`: the name logs and stack traces show. */
  override name = "CircuitOpenError";
  /** Milliseconds until the breaker lets a probe through (0 when it is half-open). */
  readonly retryInMs: number;
  constructor(details: GiveUpDetails & { retryInMs: number }) {
    super(
      ClientErrorCode.circuitOpen,
      `Gave up after ${details.attempts} attempt(s): the circuit is open (next probe in ${Math.max(0, Math.round(details.retryInMs))} ms)`,
      details,
    );
    this.retryInMs = details.retryInMs;
  }
}

/** Every allowed attempt was used and none got a final answer. */
export class AttemptsExhaustedError extends GiveUpError {
  /** Always `"AttemptsExhaustedError"`: the name logs and stack traces show. */
  override name = "AttemptsExhaustedError";
  constructor(details: GiveUpDetails) {
    const last = details.lastResponse ? `HTTP ${details.lastResponse.status}` : describe(details.lastError);
    super(
      ClientErrorCode.attemptsExhausted,
      `Gave up after ${details.attempts} attempt(s); the last one ended with ${last}`,
      details,
    );
  }
}

/** The caller's `AbortSignal` fired. `cause` is the signal's reason. */
export class CallAbortedError extends GiveUpError {
  /** Always `"CallAbortedError"`: the name logs and stack traces show. */
  override name = "CallAbortedError";
  constructor(details: GiveUpDetails & { reason: unknown }) {
    super(
      ClientErrorCode.aborted,
      `Aborted by the caller after ${details.attempts} attempt(s)`,
      details,
      details.reason,
    );
  }
}

/**
 * The server answered `operation_state: "uncertain"`: an external call started and whether it took
 * effect cannot be established. The client does not retry it (with this key or a new one) and
 * marks the intent `uncertain`. Hand `operationRef` to a person (`idem keys inspect --ref ...`); once a
 * person has settled it, `lookupUrl` (what `client.status(intent)` asks) gives the outcome.
 * Not a {@link GiveUpError}: resending later is not the fix.
 */
export class OperationUncertainError extends IdemClientError {
  /** Always `"OperationUncertainError"`: the name logs and stack traces show. */
  override name = "OperationUncertainError";
  /** The intent's id (marked uncertain in the store). */
  readonly intentId: string;
  /** The idempotency key its attempts carried. */
  readonly key: string;
  /** Attempts sent in this call. */
  readonly attempts: number;
  /** Always `"uncertain"` (here so that every give-up event's error carries a state). */
  readonly operationState: OperationState = "uncertain";
  /** The server's reference of the operation (empty when the server sent none). */
  readonly operationRef: string;
  /**
   * Where to ask what became of the operation without sending it again (`GET`, with the same
   * credentials; `client.status(intent)` does it), when the server offers the lookup.
   */
  readonly lookupUrl?: string;
  /** The uncertain answer itself (body read into memory). */
  readonly lastResponse?: Response;
  constructor(details: GiveUpDetails) {
    super(
      ClientErrorCode.operationUncertain,
      `The server cannot establish whether intent ${JSON.stringify(details.intentId)} took effect` +
        `${details.operationRef ? ` (operation ${details.operationRef})` : ""}; not retried: a person must look`,
    );
    this.intentId = details.intentId;
    this.key = details.key;
    this.attempts = details.attempts;
    this.operationRef = details.operationRef ?? "";
    if (details.lookupUrl !== undefined) this.lookupUrl = details.lookupUrl;
    if (details.lastResponse) this.lastResponse = details.lastResponse;
  }
}

/**
 * The intent's key has outlived the server's retention (its `Idempotency-Expires`, or the intent's
 * age past `keyRetentionMs` when no answer said): the server would take the key as new and could
 * run the operation again, so nothing was sent. Find out what happened another way, then
 * `abandon()` the intent (or begin a new one if it never took effect).
 */
export class IntentExpiredError extends IntentError {
  /** Always `"IntentExpiredError"`: the name logs and stack traces show. */
  override name = "IntentExpiredError";
  /** When the key expired (ISO 8601). */
  readonly expiresAt: string;
  constructor(intentId: string, expiresAt: string) {
    super(
      ClientErrorCode.intentExpired,
      intentId,
      `Intent ${JSON.stringify(intentId)}: its key expired on the server at ${expiresAt}; not sent, since the server would take it as new`,
    );
    this.expiresAt = expiresAt;
  }
}

/** `retryWithNewKey` on an intent whose last answer did not say `safe_new_key: true`. */
export class NewKeyNotSafeError extends IntentError {
  /** Always `"NewKeyNotSafeError"`: the name logs and stack traces show. */
  override name = "NewKeyNotSafeError";
  constructor(intentId: string) {
    super(
      ClientErrorCode.newKeyNotSafe,
      intentId,
      `Intent ${JSON.stringify(intentId)}: the server never said a new key is safe (safe_new_key), so a new key could duplicate it`,
    );
  }
}

/** `resume(id)` or `request(id, ...)` named an intent the store does not have. */
export class IntentNotFoundError extends IntentError {
  /** Always `"IntentNotFoundError"`: the name logs and stack traces show. */
  override name = "IntentNotFoundError";
  constructor(intentId: string) {
    super(
      ClientErrorCode.intentNotFound,
      intentId,
      `No intent with id ${JSON.stringify(intentId)} in the store`,
    );
  }
}

/**
 * The intent is already bound to a different request (method, URL or body). One intent is one side
 * effect: a new request needs a new intent (a server would answer 422 to the reused key anyway).
 */
export class IntentConflictError extends IntentError {
  /** Always `"IntentConflictError"`: the name logs and stack traces show. */
  override name = "IntentConflictError";
  constructor(intentId: string, what: string) {
    super(
      ClientErrorCode.intentConflict,
      intentId,
      `Intent ${JSON.stringify(intentId)} was begun for another request (${what} differs); begin a new intent`,
    );
  }
}

/** `resume(id)` on an intent that never recorded a request (it was begun but nothing was sent). */
export class IntentHasNoRequestError extends IntentError {
  /** Always `"IntentHasNoRequestError"`: the name logs and stack traces show. */
  override name = "IntentHasNoRequestError";
  constructor(intentId: string) {
    super(
      ClientErrorCode.intentHasNoRequest,
      intentId,
      `Intent ${JSON.stringify(intentId)} has no recorded request to resume; call request() with it`,
    );
  }
}

/** The request body cannot be sent twice (a stream, FormData) or stored; pass a string or bytes. */
export class UnreplayableBodyError extends IdemClientError {
  /** Always `"UnreplayableBodyError"`: the name logs and stack traces show. */
  override name = "UnreplayableBodyError";
  constructor(kind: string) {
    super(
      ClientErrorCode.unreplayableBody,
      `A ${kind} body cannot be replayed on retry or persisted with the intent; pass a string, URLSearchParams, Blob or bytes`,
    );
  }
}

/** A network error in a few words (its name and system code), for messages. */
export function describe(error: unknown): string {
  if (error instanceof Error) {
    const code = (error.cause as { code?: unknown } | undefined)?.code;
    return typeof code === "string" ? `${error.name} (${code})` : error.name;
  }
  return String(error);
}

export function hasCode(error: unknown, codes: readonly string[]): boolean {
  return (
    typeof error === "object" &&
    error !== null &&
    codes.includes((error as { code?: unknown }).code as string) &&
    error instanceof Error
  );
}

const allCodes: readonly string[] = Object.values(ClientErrorCode);
const giveUpCodes: readonly string[] = [
  ClientErrorCode.deadlineExceeded,
  ClientErrorCode.retryBudgetExhausted,
  ClientErrorCode.circuitOpen,
  ClientErrorCode.attemptsExhausted,
  ClientErrorCode.aborted,
  ClientErrorCode.failedFast,
];

// The guards check the error's `code` (and that it is an Error), not its class, so they hold across
// two copies of idem in one bundle.
/** Whether `e` is an `IdemClientError` (by its code). */
export const isIdemClientError = (e: unknown): e is IdemClientError => hasCode(e, allCodes);
/** Whether `e` is a `GiveUpError` (by its code). */
export const isGiveUpError = (e: unknown): e is GiveUpError => hasCode(e, giveUpCodes);
/** Whether `e` is a `DeadlineExceededError` (by its code). */
export const isDeadlineExceededError = (e: unknown): e is DeadlineExceededError =>
  hasCode(e, [ClientErrorCode.deadlineExceeded]);
/** Whether `e` is a `RetryBudgetExhaustedError` (by its code). */
export const isRetryBudgetExhaustedError = (e: unknown): e is RetryBudgetExhaustedError =>
  hasCode(e, [ClientErrorCode.retryBudgetExhausted]);
/** Whether `e` is a `CircuitOpenError` (by its code). */
export const isCircuitOpenError = (e: unknown): e is CircuitOpenError =>
  hasCode(e, [ClientErrorCode.circuitOpen]);
/** Whether `e` is an `AttemptsExhaustedError` (by its code). */
export const isAttemptsExhaustedError = (e: unknown): e is AttemptsExhaustedError =>
  hasCode(e, [ClientErrorCode.attemptsExhausted]);
/** Whether `e` is a `CallAbortedError` (by its code). */
export const isCallAbortedError = (e: unknown): e is CallAbortedError =>
  hasCode(e, [ClientErrorCode.aborted]);
/** Whether `e` is an `IntentNotFoundError` (by its code). */
export const isIntentNotFoundError = (e: unknown): e is IntentNotFoundError =>
  hasCode(e, [ClientErrorCode.intentNotFound]);
/** Whether `e` is an `IntentConflictError` (by its code). */
export const isIntentConflictError = (e: unknown): e is IntentConflictError =>
  hasCode(e, [ClientErrorCode.intentConflict]);
/** Whether `e` is an `IntentHasNoRequestError` (by its code). */
export const isIntentHasNoRequestError = (e: unknown): e is IntentHasNoRequestError =>
  hasCode(e, [ClientErrorCode.intentHasNoRequest]);
/** Whether `e` is an `OperationUncertainError` (by its code). */
export const isOperationUncertainError = (e: unknown): e is OperationUncertainError =>
  hasCode(e, [ClientErrorCode.operationUncertain]);
/** Whether `e` is an `IntentExpiredError` (by its code). */
export const isIntentExpiredError = (e: unknown): e is IntentExpiredError =>
  hasCode(e, [ClientErrorCode.intentExpired]);
/** Whether `e` is a `NewKeyNotSafeError` (by its code). */
export const isNewKeyNotSafeError = (e: unknown): e is NewKeyNotSafeError =>
  hasCode(e, [ClientErrorCode.newKeyNotSafe]);
/** Whether `e` is an `UnreplayableBodyError` (by its code). */
export const isUnreplayableBodyError = (e: unknown): e is UnreplayableBodyError =>
  hasCode(e, [ClientErrorCode.unreplayableBody]);
