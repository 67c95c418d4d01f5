/**
 * Hooks for logging and metrics. Every event names the intent and carries its idempotency key, so a
 * log line can be matched with the server's. A hook that throws is ignored: observing a call must
 * never change how it ends.
 */
import type { OperationState } from "./answer.ts";
import type { GiveUpError, OperationUncertainError } from "./errors.ts";

export interface CallInfo {
  /** The intent's id (absent for keyless calls: GET and other safe methods through the fetch wrapper). */
  intentId?: string;
  /** The idempotency key sent with the attempt (absent for keyless calls). */
  key?: string;
  method: string;
  url: string;
}

/** After each attempt, whatever its outcome. */
export interface AttemptEvent extends CallInfo {
  /** 1-based, counted within this call. */
  attempt: number;
  durationMs: number;
  /** The response status, when a response arrived. */
  status?: number;
  /** The network error or per-try timeout, when no response arrived. */
  error?: unknown;
  /** Whether this outcome may change on a retry (a final answer is not retryable). */
  retryable: boolean;
  /** The operation's state, when the response reported one (problem body or header). */
  operationState?: OperationState;
}

/** Before each wait between attempts. */
export interface WaitEvent extends CallInfo {
  /** The attempt that just failed. */
  attempt: number;
  delayMs: number;
  /** Where the delay came from: the server's Retry-After, or exponential backoff with full jitter. */
  source: "retry-after" | "backoff";
  status?: number;
  error?: unknown;
  operationState?: OperationState;
}

/**
 * When a call ends without a final answer: given up (a `GiveUpError`, the intent stays pending) or
 * stopped on an uncertain operation (`OperationUncertainError`). `error.operationState` and
 * `error.operationRef` carry what the server said.
 */
export interface GiveUpEvent extends CallInfo {
  attempts: number;
  error: GiveUpError | OperationUncertainError;
}

/** When a final answer arrives (2xx, or a final 4xx such as 402 or 422). */
export interface DoneEvent extends CallInfo {
  attempts: number;
  status: number;
  durationMs: number;
  /** The operation's state, when the answer was a problem that reported one. */
  operationState?: OperationState;
}

/** Listeners. Each is optional. Default: none. */
export interface ClientHooks {
  attempt?: (event: AttemptEvent) => void;
  wait?: (event: WaitEvent) => void;
  giveUp?: (event: GiveUpEvent) => void;
  done?: (event: DoneEvent) => void;
}

export function emit<E>(listener: ((event: E) => void) | undefined, event: E): void {
  if (!listener) return;
  try {
    listener(event);
  } catch {
    // ignored on purpose (see above)
  }
}
