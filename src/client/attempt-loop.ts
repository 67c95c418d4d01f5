/**
 * The attempt loop: sends one call's attempts until a final answer, an uncertain operation, or a
 * reason to give up, asking the breaker before each attempt and the budget before each retry.
 * What an outcome means is decided in `answer.ts`; what is written to the intent store, in
 * `ledger.ts`; this file only sequences them (as cockatiel's `RetryPolicy` sequences attempts
 * around an `ExecuteWrapper` that classifies them).
 *
 * Why the loop itself is hand-written rather than cockatiel's RetryPolicy: a retry here has to be
 * decided per HTTP response (problem fields, Retry-After that replaces the backoff, a per-try timeout
 * raised by the server's answer bound), must be refused *before* a wait that would outlast the
 * call's deadline, must ask a budget shared across calls, and must throw errors that carry the last
 * response. RetryPolicy decides from the result alone and always sleeps its backoff.
 *
 * Timeline of one call (D = the deadline, shared by everything below):
 *   the intent's write (if any) is awaited: nothing is sent before it is stored
 *   [count the attempt in the store (retries) -> breaker permit -> attempt (timer: per-try or D)
 *    -> classify (a problem body is read under the same timer)]
 *   2xx/3xx or an answer not to retry: mark the intent done, return it
 *   uncertain: mark the intent uncertain, throw OperationUncertainError
 *   otherwise: attempts left? the wait (Retry-After, else jitter) ends before D? a budget token
 *              (not needed after a lost reply or an in-flight 409; when refused after a per-try
 *              timeout, the server's operation lookup is asked instead, free: a finished operation's
 *              saved answer ends the call, one in progress is waited for)? then drop the failed
 *              body, sleep (cut short only by the caller), loop
 * Any "no" gives up (GiveUpError) and leaves the intent pending: its outcome may be unknown.
 *
 * The success path is kept lean on purpose (bench/client.ts measures it against plain fetch): one
 * async function and no closures per call, one clock read before the first attempt, no body read,
 * hook events built only when a hook is set.
 */

import {
  answerWithinMs,
  classifyNetworkError,
  isInFlight,
  isUncertain,
  OPERATION_STATE_HEADER,
  readAnswer,
  type ServerAnswer,
} from "./answer.ts";
import { fullJitterMs } from "./backoff.ts";
import type { BreakerPermit } from "./breaker.ts";
import type { Call } from "./call.ts";
import { CallDeadline, Cut } from "./deadline.ts";
import {
  AttemptsExhaustedError,
  CallAbortedError,
  CircuitOpenError,
  DeadlineExceededError,
  DeadlineReason,
  type GiveUpError,
  OperationUncertainError,
  RetryBudgetExhaustedError,
} from "./errors.ts";
import { type ClientHooks, emit } from "./events.ts";
import { FailedFastError } from "./fail-fast.ts";
import { toHeaderMap } from "./headers.ts";
import type { IntentLedger } from "./ledger.ts";
import { hooksOf, observeIntent } from "./observe.ts";
import { lookupUrlOf, readLookup } from "./operations.ts";
import { ANSWER_WITHIN_MARGIN_MS, type Settings } from "./options.ts";
import { retryAfterFrom } from "./retry-after.ts";

/** The longest the lookup asked after a refused retry holds its request (the server may cut it). */
const LOOKUP_WAIT_S = 10;

const NO_BREAKER: BreakerPermit = { success() {}, failure() {}, release() {} };

export class AttemptLoop {
  readonly #s: Settings;
  readonly #ledger: IntentLedger;

  constructor(settings: Settings, ledger: IntentLedger) {
    this.#s = settings;
    this.#ledger = ledger;
  }

  /** Run `call` (its headers final, its key set) after `written` (the intent's write) settles. */
  async run(call: Call, written: Promise<unknown> | undefined): Promise<Response> {
    if (written) {
      const stored = await written;
      if (stored) call.attach(stored as NonNullable<Call["record"]>); // create() resolves to the stored record
    }
    const s = this.#s;
    // The client's headers under the call's own (the call wins), then the key over both.
    const extra = s.headers;
    if (extra) {
      call.headers =
        typeof extra === "function"
          ? { ...toHeaderMap(await extra()), ...call.headers }
          : { ...extra, ...call.headers };
    }
    if (call.key !== undefined) call.headers[s.keyHeader] = s.quoteKey ? `"${call.key}"` : call.key;
    const opts = call.options;
    const maxAttempts = Math.max(1, opts.maxAttempts ?? s.maxAttempts);
    // Attempts answered "in flight" (409 with the in-flight type) do not count against maxAttempts:
    // the server is working on the key and paces the waits with Retry-After, and a key held by a
    // crashed worker frees only when its lease runs out, which can take longer than five waits. The
    // deadline still bounds them.
    let inFlightAnswers = 0;
    // With the default limit, attempts that never reached a server (connection refused: nothing was
    // sent, so nothing happened) do not count either: a service restarting for two seconds must not use
    // up the attempts of a call that has most of its deadline left. The deadline, the budget and the
    // breaker still bound them. A limit set explicitly counts every attempt.
    const freeUnreached = opts.maxAttempts === undefined && !s.maxAttemptsSet;
    let unreached = 0;
    // Whether an attempt may have reached the server (its reply lost, or not back before the per-try
    // timeout): from then on the outcome may be there, and a retry the budget or the breaker refuses
    // asks the server's operation lookup instead (`#ask`, a read: no new work), before giving up.
    let mayHaveArrived = false;
    let perTryMs = opts.perTryTimeoutMs ?? s.perTryMs;
    const deadlineMs = opts.deadlineMs ?? s.deadlineMs;
    const trace = observeIntent(call, s.on, s.breaker, s.budget); // undefined without an observer
    const on = trace ? trace.hooks : s.on;
    const fetchFn = s.fetch ?? globalThis.fetch;
    const breaker = s.breaker;
    const startedAt = Date.now();
    const deadline = new CallDeadline(deadlineMs, opts.signal, startedAt);

    s.budget?.recordRequest();
    const early = deadline.stopped(startedAt);
    if (early) return this.#giveUp(call, this.#stopped(call, early, deadlineMs));
    for (;;) {
      let attemptStart = startedAt;
      if (call.attempts > 0) {
        const counted = this.#ledger.beforeRetry(call);
        if (counted) await counted;
        attemptStart = Date.now();
        // A timer may fire a little late: never send an attempt that has no time left.
        if (deadline.remaining(attemptStart) === 0) {
          return this.#giveUp(call, this.#stopped(call, Cut.deadline, deadlineMs));
        }
      }
      const permit = breaker ? breaker.tryAcquire() : NO_BREAKER;
      if (!permit) {
        // A retry of a request the server may have done: its outcome may be known there (see below).
        const known = mayHaveArrived ? await this.#ask(call, deadline) : undefined;
        if (known instanceof Response) return this.#learned(call, known, startedAt, on);
        return this.#giveUp(
          call,
          new CircuitOpenError({ ...call.details(), retryInMs: breaker?.retryInMs() ?? 0 }),
        );
      }
      const attempt = ++call.attempts;
      const timer = deadline.attempt(perTryMs, attemptStart);
      const signal = timer.signal ?? null;
      let response: Response | undefined;
      let answer: ServerAnswer | undefined;
      let error: unknown;
      try {
        // Called through a local: a browser's fetch throws "Illegal invocation" when called as a
        // method of another object.
        const headers = trace ? trace.attempt(attempt, call) : call.headers;
        const body = call.body ?? null;
        response = await fetchFn(
          call.url,
          call.init === undefined
            ? { method: call.method, headers, body, signal }
            : { ...call.init, method: call.method, headers, body, signal },
        );
        // A problem's body is read under the attempt's timer, so a stalled body is cut like a stall.
        if (response.status >= 400) answer = await readAnswer(response);
      } catch (err) {
        if (response === undefined) error = err;
      }
      timer.done();
      call.lastAnswer = answer;

      if (response && (answer === undefined || !(isUncertain(answer) || s.shouldRetry(answer)))) {
        // A final answer, even if the deadline passed meanwhile: it is what happened.
        if (breaker?.failureStatuses.has(response.status)) permit.failure();
        else permit.success();
        if (on.attempt)
          emit(on.attempt, {
            ...this.#event(call, attempt, attemptStart, response, error),
            retryable: false,
          });
        const finished = this.#ledger.finish(call, response);
        if (finished) await finished;
        if (on.done) {
          emit(on.done, {
            ...call.info(),
            attempts: attempt,
            status: response.status,
            durationMs: Date.now() - startedAt,
            ...(answer?.operationState !== undefined && { operationState: answer.operationState }),
          });
        }
        return response;
      }
      if (response && answer && isUncertain(answer)) {
        permit.success(); // the server is up and answering
        if (on.attempt)
          emit(on.attempt, {
            ...this.#event(call, attempt, attemptStart, response, error),
            retryable: false,
          });
        call.lastResponse = response;
        return this.#uncertain(call, response);
      }
      const cut = timer.cut() ?? deadline.stopped();
      if (cut === Cut.caller || cut === Cut.deadline) {
        permit.release(); // cut short on our side: says nothing about the server
        if (response) {
          call.lastResponse = response; // a retryable answer that came in just as time ran out
          call.lastError = undefined;
        }
        return this.#giveUp(call, this.#stopped(call, cut, deadlineMs));
      }
      // Retries free of the budget: the server is up and the retry is cheap for it (a lost reply is
      // replayed; an in-flight key is answered from its row, at the pace its Retry-After asks).
      let free = false;
      if (response) {
        if (breaker?.failureStatuses.has(response.status)) permit.failure();
        else permit.success();
        free = answer !== undefined && isInFlight(answer);
        if (free) inFlightAnswers++;
      } else if (timer.cut() === undefined && classifyNetworkError(error) === "lost-reply") {
        permit.release(); // the server was reached; only this reply was lost
        free = true;
        mayHaveArrived = true;
      } else {
        // A per-try timeout: the request went out, and the server may have done it meanwhile.
        if (timer.cut() === Cut.perTry) mayHaveArrived = true;
        permit.failure(); // unreachable, or the per-try timeout
        if (freeUnreached && timer.cut() === undefined && classifyNetworkError(error) === "unreachable")
          unreached++;
      }
      if (on.attempt)
        emit(on.attempt, { ...this.#event(call, attempt, attemptStart, response, error), retryable: true });
      call.lastResponse = response;
      call.lastError = response ? undefined : error;

      if (s.failFast) {
        const waitMs = response ? retryAfterFrom(response) : undefined;
        return this.#giveUp(call, new FailedFastError({ ...call.details(), retryAfterMs: waitMs }));
      }
      if (attempt - inFlightAnswers - unreached >= maxAttempts) {
        return this.#giveUp(call, new AttemptsExhaustedError(call.details()));
      }
      const hint = response ? retryAfterFrom(response) : undefined;
      if (response) {
        // The server's answer bound: later attempts wait for it, plus a margin (the deadline still caps).
        const within = answerWithinMs(response.headers);
        if (within !== undefined) perTryMs = Math.max(perTryMs, within + ANSWER_WITHIN_MARGIN_MS);
      }
      const delayMs = hint ?? fullJitterMs(attempt, s.retry, s.random);
      if (delayMs > deadline.remaining()) {
        const err = new DeadlineExceededError({
          ...call.details(),
          reason: DeadlineReason.waitTooLong,
          waitMs: delayMs,
          deadlineMs,
        });
        return this.#giveUp(call, err);
      }
      if (!free && s.budget && !s.budget.tryRetry()) {
        // The attempt may have reached the server (its reply did not come in time): the outcome may be
        // there already. Asking for it is no new work, so the budget does not stand in its way.
        const known = mayHaveArrived ? await this.#ask(call, deadline) : undefined;
        if (known instanceof Response) return this.#learned(call, known, startedAt, on);
        if (known !== "in_progress") {
          return this.#giveUp(call, new RetryBudgetExhaustedError(call.details()));
        }
      }
      // The failed attempt's body is not needed: release its connection now.
      if (response) {
        await response.body?.cancel().catch(() => {});
        call.lastResponse = withoutBody(response);
      }
      if (on.wait) {
        emit(on.wait, {
          ...call.info(),
          attempt,
          delayMs,
          source: hint !== undefined ? "retry-after" : "backoff",
          ...(response ? { status: response.status } : { error }),
          ...(answer?.operationState !== undefined && { operationState: answer.operationState }),
        });
      }
      try {
        await deadline.sleep(delayMs);
      } catch {
        return this.#giveUp(call, this.#stopped(call, Cut.caller, deadlineMs));
      }
    }
  }

  /**
   * Ask the server's operation lookup what became of `call` (by its key, or the reference an answer
   * gave), holding the request until the operation finishes, within the deadline: its saved answer
   * when finished (as a replay gives it), `"in_progress"` while it runs, else undefined (unknown to
   * the server, no lookup there, or no answer). A read that does no work, so no budget token is spent.
   */
  async #ask(call: Call, deadline: CallDeadline): Promise<Response | "in_progress" | undefined> {
    const s = this.#s;
    if (s.operationsPath === false || call.key === undefined) return undefined;
    // Held by the server until the operation ends (a busy server may still be working on it), for
    // at most LOOKUP_WAIT_S, leaving a second or two of D for the answer to come back; cut at D.
    const left = deadline.remaining();
    if (left < 500) return undefined;
    const waitS = Math.max(0, Math.min(LOOKUP_WAIT_S, Math.floor(left / 1000) - 2));
    const url = lookupUrlOf(call.url, s.operationsPath, call.lastAnswer?.operationRef, waitS);
    const timer = deadline.attempt(left);
    try {
      const headers = { ...call.headers };
      delete headers["content-type"];
      const fetchFn = s.fetch ?? globalThis.fetch;
      const response = await fetchFn(url, { method: "GET", headers, signal: timer.signal ?? null });
      const known = await readLookup(response, url);
      if (known.finished || known.state === "uncertain") return response;
      await response.body?.cancel().catch(() => {});
      return known.state === "in_progress" ? "in_progress" : undefined;
    } catch {
      return undefined; // no answer: the call gives up as the budget says
    } finally {
      timer.done();
    }
  }

  /** What the lookup said: the saved answer ends the call as a replay would; uncertain, as such. */
  async #learned(call: Call, response: Response, startedAt: number, on: ClientHooks): Promise<Response> {
    if (response.headers.get(OPERATION_STATE_HEADER) === "uncertain") return this.#uncertain(call, response);
    const finished = this.#ledger.finish(call, response);
    if (finished) await finished;
    if (on.done) {
      emit(on.done, {
        ...call.info(),
        attempts: call.attempts,
        status: response.status,
        durationMs: Date.now() - startedAt,
      });
    }
    return response;
  }

  #event(call: Call, attempt: number, startedAt: number, response: Response | undefined, error: unknown) {
    const state = call.lastAnswer?.operationState;
    return {
      ...call.info(),
      attempt,
      durationMs: Date.now() - startedAt,
      ...(response ? { status: response.status } : { error }),
      ...(state !== undefined && { operationState: state }),
    };
  }

  /** The error for a call stopped by its caller or its deadline. */
  #stopped(call: Call, cut: Cut, deadlineMs: number): GiveUpError {
    return cut === Cut.caller
      ? new CallAbortedError({ ...call.details(), reason: call.options.signal?.reason })
      : new DeadlineExceededError({ ...call.details(), reason: DeadlineReason.elapsed, deadlineMs });
  }

  /** Mark the intent uncertain and throw: never retried, with either key. */
  async #uncertain(call: Call, response: Response): Promise<never> {
    const written = this.#ledger.uncertain(call, response);
    if (written) await written;
    const details = { ...call.details(), lastResponse: await buffer(response) };
    const path = this.#s.operationsPath;
    // Where to ask once a person has settled it (by reference when the server gave one, else by key).
    if (path !== false) details.lookupUrl = lookupUrlOf(call.url, path, details.operationRef);
    const error = new OperationUncertainError(details);
    emit(hooksOf(call, this.#s.on).giveUp, { ...call.info(), attempts: call.attempts, error });
    throw error;
  }

  /** Record the attempts and what the server said (the intent stays pending), report, then throw or return. */
  async #giveUp(call: Call, error: GiveUpError): Promise<Response> {
    const written = this.#ledger.giveUp(call);
    if (written) await written;
    const last = error.lastResponse;
    const on = hooksOf(call, this.#s.on);
    // Only a response whose body is still there is handed back as the answer; one whose body was
    // discarded before a wait (deadline, abort or open circuit during a later step) only informs.
    if (last?.body && this.#s.giveUpWithResponse && !(error instanceof CallAbortedError)) {
      emit(on.giveUp, { ...call.info(), attempts: call.attempts, error });
      return last;
    }
    if (last?.body && !last.bodyUsed) {
      // Read the body into memory so the error can be inspected later without pinning a connection.
      Object.defineProperty(error, "lastResponse", { value: await buffer(last), enumerable: true });
    }
    emit(on.giveUp, { ...call.info(), attempts: call.attempts, error });
    throw error;
  }
}

/** The same status and headers with an empty body (for responses whose body was discarded). */
function withoutBody(response: Response): Response {
  return new Response(null, {
    status: response.status,
    statusText: response.statusText,
    headers: response.headers,
  });
}

async function buffer(response: Response): Promise<Response> {
  let bytes: ArrayBuffer | null = null;
  try {
    bytes = await response.arrayBuffer();
  } catch {
    // The body could not be read (e.g. the deadline cut it): keep status and headers.
  }
  return new Response(bytes, {
    status: response.status,
    statusText: response.statusText,
    headers: response.headers,
  });
}
