/**
 * Hooks for logging and metrics. Every event names the intent and carries its idempotency key, so a
 * log line can be matched with the server's. A hook that throws is ignored: observing a call must
 * never change how it ends.
 */
import type { OperationState } from "./answer.ts";
import type { GiveUpError, OperationUncertainError } from "./errors.ts";

/** What every event says about its call. */
export interface CallInfo {
  /** The intent's id (absent for keyless calls: GET and other safe methods through the fetch wrapper). */
  intentId?: string;
  /** The idempotency key sent with the attempt (absent for keyless calls). */
  key?: string;
  /** The request's HTTP method. */
  method: string;
  /** The request's URL. */
  url: string;
}

/** After each attempt, whatever its outcome. */
export interface AttemptEvent extends CallInfo {
  /** 1-based, counted within this call. */
  attempt: number;
  /** How long the attempt took, in milliseconds. */
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
  /** How long the client waits before the next attempt, in milliseconds. */
  delayMs: number;
  /** Where the delay came from: the server's Retry-After, or exponential backoff with full jitter. */
  source: "retry-after" | "backoff";
  /** The failed attempt's response status, when a response arrived. */
  status?: number;
  /** The failed attempt's network error or timeout, when no response arrived. */
  error?: unknown;
  /** The operation's state, when the failed attempt's response reported one. */
  operationState?: OperationState;
}

/**
 * When a call ends without a final answer: given up (a `GiveUpError`, the intent stays pending) or
 * stopped on an uncertain operation (`OperationUncertainError`). `error.operationState` and
 * `error.operationRef` carry what the server said.
 */
export interface GiveUpEvent extends CallInfo {
  /** Attempts sent in this call. */
  attempts: number;
  /** The error the call ends with (also thrown to the caller). */
  error: GiveUpError | OperationUncertainError;
}

/** When a final answer arrives (2xx, or a final 4xx such as 402 or 422). */
export interface DoneEvent extends CallInfo {
  /** Attempts sent in this call. */
  attempts: number;
  /** The final answer's status. */
  status: number;
  /** The call's whole time, waits included, in milliseconds. */
  durationMs: number;
  /** The operation's state, when the answer was a problem that reported one. */
  operationState?: OperationState;
}

/** Listeners. Each is optional. Default: none. */
export interface ClientHooks {
  /** After each attempt. */
  attempt?: (event: AttemptEvent) => void;
  /** Before each wait between attempts. */
  wait?: (event: WaitEvent) => void;
  /** When a call ends without a final answer. */
  giveUp?: (event: GiveUpEvent) => void;
  /** When a final answer arrives. */
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
