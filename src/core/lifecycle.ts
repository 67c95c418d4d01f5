/**
 * The one request lifecycle every HTTP adapter delegates to (as AWS Powertools' idempotency
 * middlewares delegate to one IdempotencyHandler):
 *
 *   begin    read the key and the body ONCE into a canonical value (refusing ambiguous bodies), and
 *            fingerprint that value; answer 400/401 at once, or say how to run the request
 *   keyed    run the handler's work under the claim (atomic mode) and apply the save policy
 *   phases   hand the claim and the route's input to a phases runner
 *   unkeyed  run the work in a plain transaction (optional-key routes), under the same save policy
 *   failure  turn an error that escaped into the answer idem owes (503 when the database is down)
 *
 * The adapters only translate their framework's request into `IdemRequest` and the `StoredResponse`s
 * returned here back into their framework's response, and hand the same `body` value to the handler.
 * Every way a keyed request can end is decided here, in one place; a route's options are in
 * lifecycle-options.ts, bodies, problems and outcomes in their own files.
 */
import { NO_BODY, type RequestBody, readRequestBody } from "./body.ts";
import { isIdemError, KeyInFlightError, KeyMissingError, RetryableError } from "./errors.ts";
import { fieldsFingerprint, fingerprintRequest } from "./fingerprint.ts";
import { parseIdempotencyKey } from "./key.ts";
import type {
  CompactOptions,
  IdemRequest,
  LifecycleOptions,
  PhasesLifecycleOptions,
  PhasesRunnerLike,
} from "./lifecycle-options.ts";
import { lifecycleObserver } from "./observe.ts";
import { OPERATION_REF_HEADER, type OperationRefCodec, refsOf } from "./operation-ref.ts";
import {
  ANSWER_WITHIN_HEADER,
  EXPIRES_HEADER,
  Outcome,
  outcomeOfError,
  REPLAYED_HEADER,
  type Settled,
} from "./outcome.ts";
import {
  type ErrorContext,
  errorResponse,
  OPERATION_STATE_HEADER,
  type OperationFields,
  OUTCOME_UNKNOWN_RETRY,
  problemResponse,
} from "./problem.ts";
import { DEFAULT_REPLAYED_HEADERS, isSaved, type StoredResponse } from "./response.ts";
import { isConnectFailure, isDatabaseUnavailable } from "./sqlstate.ts";
import type { AtomicOutcome, AtomicStore, Claim, CompactSaved, HangUp, WorkResult } from "./store.ts";
import { storedValueError } from "./stored-errors.ts";
import { commit, endTx, rollback } from "./tx-end.ts";

type Inspectable = { inspect(scope: string, key: string): Promise<unknown> };
const canInspect = (store: unknown): store is Inspectable =>
  typeof (store as Partial<Inspectable> | null)?.inspect === "function";

/** The answer bound of a phases route when it sets none, in ms (docs/contract.md). */
export const DEFAULT_ANSWER_WITHIN_MS = 5_000;

/** A request read by `begin`: answered at once, or ready to run with or without a key. */
export type Begun =
  | { kind: "answer"; response: StoredResponse }
  | {
      kind: "keyed";
      claim: Claim;
      body: RequestBody;
      /** Whether the lifecycle's observer traces this request (telemetry installed and recording). */
      observed?: boolean;
    }
  | { kind: "unkeyed"; scope: string | undefined; body: RequestBody };
export type Keyed = Extract<Begun, { kind: "keyed" }>;
export type Unkeyed = Extract<Begun, { kind: "unkeyed" }>;

/** Per-run options: the client's hang-up and the route's replay check (`authorizeReplay`). */
export interface RunOptions {
  signal?: HangUp;
  /** Whether this caller may still see the key's saved answer (or have it resumed). Default: yes. */
  authorize?: () => boolean | Promise<boolean>;
}

const REPLAY_REFUSED = problemResponse(
  401,
  "unauthorized",
  "You may no longer see the answer saved under this Idempotency-Key.",
);

export class Lifecycle<Tx> {
  readonly options: LifecycleOptions<Tx>;
  /** A phases route's lifecycle: the runner does the work, so there is no atomic store. */
  static forPhases<Tx>(
    options: PhasesLifecycleOptions,
    answerWithinMs: number | undefined,
    /** The runner's store (`runner.store`), whose secret seals the operation references (`store.refs`). */
    store: unknown,
  ): Lifecycle<Tx> {
    // Never called: phases() uses the runner. It carries the runner's references.
    const noStore = { retentionMs: 0, refs: refsOf(store) } as AtomicStore<Tx>;
    return new Lifecycle<Tx>({ ...options, store: noStore, required: true }, { answerWithinMs });
  }

  private readonly replayHeaders: readonly string[];
  /** The replayed headers as a lower-case set, Set-Cookie never in it (`filterHeaders`, made once). */
  private readonly replayed: ReadonlySet<string>;
  private readonly answerWithin: [string, string];
  private readonly phasesMode: boolean;
  private readonly answerWithinMs: number;
  /** Seals the operation references this route hands out (the store's, `refsOf`). */
  private readonly refs: OperationRefCodec;

  /**
   * `answerWithinMs`: a phases route's answer bound. Atomic routes publish the store's duplicate wait
   * (`lockTimeoutMs`, default 5 s), rounded up to whole seconds.
   */
  constructor(options: LifecycleOptions<Tx>, phases?: { answerWithinMs?: number }) {
    this.options = options;
    this.replayHeaders = options.replayHeaders ?? DEFAULT_REPLAYED_HEADERS;
    this.replayed = new Set(
      this.replayHeaders.map((h) => h.toLowerCase()).filter((h) => h !== "set-cookie" && h !== "set-cookie2"),
    );
    this.phasesMode = phases !== undefined;
    this.refs = refsOf(options.store);
    const ms = phases
      ? (phases.answerWithinMs ?? DEFAULT_ANSWER_WITHIN_MS)
      : (options.store.lockTimeoutMs ?? DEFAULT_ANSWER_WITHIN_MS);
    this.answerWithinMs = ms;
    this.answerWithin = [ANSWER_WITHIN_HEADER, String(Math.max(1, Math.ceil(ms / 1000)))];
  }

  /**
   * Read the key, then the body once, and fingerprint it. `scope` comes from authentication
   * (undefined: not authenticated). `body` is the raw bytes, or a value a framework parsed already.
   */
  begin(req: IdemRequest, scope: string | undefined, body: Uint8Array | RequestBody): Begun {
    let key: string | undefined;
    let read: RequestBody;
    try {
      key = parseIdempotencyKey(req.header("idempotency-key"));
      if (key === undefined && this.options.required !== false) throw new KeyMissingError();
      read =
        body instanceof Uint8Array ? readRequestBody(req.header("content-type"), body, this.options) : body;
    } catch (err) {
      if (!isIdemError(err)) throw err;
      return this.answerNow(errorResponse(err), scope, key);
    }
    if (key === undefined) return { kind: "unkeyed", scope, body: read };
    if (scope === undefined) {
      return this.answerNow(
        problemResponse(401, "unauthorized", "Authenticate before sending an idempotent request."),
        scope,
        key,
      );
    }
    const claim = { scope, key, fingerprint: this.fingerprintOf(req, read) };
    const observed = lifecycleObserver()?.begin(claim, req, this.options.traceContext) === true;
    return { kind: "keyed", claim, body: read, observed };
  }

  private answerNow(response: StoredResponse, scope: string | undefined, key: string | undefined): Begun {
    this.options.onOutcome?.({ outcome: Outcome.Invalid, status: response.status, scope, key });
    response.headers.push(this.answerWithin);
    return { kind: "answer", response };
  }

  private fingerprintOf(req: IdemRequest, body: RequestBody): Uint8Array {
    const f = this.options.fingerprint;
    if (typeof f === "function") return f(req, body);
    if (f) {
      const v = body.value;
      const fields = v !== null && typeof v === "object" && !(v instanceof Uint8Array) ? v : {};
      const picked: Record<string, unknown> = {};
      for (const name of f.fields) picked[name] = (fields as Record<string, unknown>)[name];
      return fieldsFingerprint(req.method, req.path, picked);
    }
    return fingerprintRequest(req.method, req.path, body);
  }

  /**
   * Run `work` under the claim (atomic mode). `work` gets the transaction and returns the handler's
   * response; the save policy decides whether it is saved (and the writes committed) or rolled back.
   * Errors thrown by `work` are rethrown after the rollback, so the framework's error handling still
   * applies; pass them to `failure` first.
   */
  keyed(begun: Keyed, work: (tx: Tx) => Promise<StoredResponse>, options: RunOptions = {}): Promise<Settled> {
    const compact = this.options.compact;
    const claim = begun.claim;
    const observer = begun.observed ? lifecycleObserver() : undefined;
    const toResult = (produced: StoredResponse): WorkResult => {
      if (!isSaved(produced.status, this.options)) return { response: produced, save: undefined };
      const save = {
        status: produced.status,
        headers: keepHeaders(produced.headers, this.replayed),
        body: produced.body,
      };
      const compactId = compact?.id(produced);
      return compactId === undefined ? { response: produced, save } : { response: produced, save, compactId };
    };
    const run = () =>
      this.options.store.atomic(
        claim,
        // A promise chain, not an async function: one layer fewer per keyed request.
        (tx) => Promise.resolve(observer ? observer.work(claim, () => work(tx)) : work(tx)).then(toResult),
        compact
          ? { signal: options.signal, rebuild: (saved, tx) => this.rebuild(compact, saved, tx) }
          : { signal: options.signal, speculate: this.options.effectsInTxOnly === true },
      );
    return this.settle(claim, observer ? () => observer.run(claim, "atomic", run) : run, options.authorize);
  }

  /**
   * Hand the claim and the route's input to a phases runner, with the route's answer bound (the runner
   * answers 409 in-flight when its external call outlasts it, and goes on in the background). With
   * `authorize`, a key that exists is checked before the runner may resume it (when the store can
   * `inspect` keys) and before its saved answer is replayed.
   */
  async phases<I>(
    begun: Keyed,
    runner: PhasesRunnerLike<I>,
    input: I,
    options: RunOptions = {},
  ): Promise<Settled> {
    const claim = begun.claim;
    const authorize = options.authorize;
    const store = runner.store;
    if (
      authorize &&
      canInspect(store) &&
      (await store.inspect(claim.scope, claim.key)) &&
      !(await authorize())
    ) {
      return this.refused(claim);
    }
    const run = () =>
      runner.run(claim, input, { signal: options.signal, answerWithinMs: this.answerWithinMs });
    const observer = begun.observed ? lifecycleObserver() : undefined;
    return this.settle(claim, observer ? () => observer.run(claim, "phases", run) : run, authorize);
  }

  /**
   * Run `work` for a request without a key in a plain transaction, under the same save policy as a
   * keyed request: its writes commit only when its answer is one a keyed request would save (2xx, the
   * `saveStatuses`, 5xx with `saveServerErrors`); otherwise they roll back and the answer is still sent.
   */
  async unkeyed<R extends { status: number }>(begun: Unkeyed, work: (tx: Tx) => Promise<R>): Promise<R> {
    const response = await endTx(
      this.options.store,
      async (tx) => {
        const r = await work(tx);
        return isSaved(r.status, this.options) ? commit(r) : rollback(r);
      },
      { scope: begun.scope },
    );
    this.options.onOutcome?.({ outcome: Outcome.Unkeyed, status: response.status, scope: begun.scope });
    return response;
  }

  /**
   * The answer idem owes for an error that escaped `keyed`/`phases`/`unkeyed` or the adapter (a body
   * too large, the database down before or after the handler ran), or undefined for an error that is
   * the application's to answer (the handler threw).
   */
  failure(err: unknown, begun?: Begun): StoredResponse | undefined {
    const keyed = begun?.kind === "keyed" ? begun.claim : undefined;
    let response: StoredResponse;
    const claimId = err instanceof KeyInFlightError ? err.claimId : undefined;
    if (isIdemError(err)) response = errorResponse(err, this.errorContext(keyed, this.phasesMode, claimId));
    else if (isDatabaseUnavailable(err)) {
      // Nothing can have committed when no connection was had; a connection lost later (even during
      // COMMIT) may have committed the claim: then say in_progress, and never that a new key is safe.
      const claimed = this.phasesMode || !isConnectFailure(err);
      response = errorResponse(unavailable(err), this.errorContext(keyed, claimed));
    } else {
      // A stored value that cannot be used (stored-errors.ts): the key is left as it is, never run again.
      const stored = storedValueError(err);
      if (!stored) return undefined;
      response = errorResponse(stored, this.errorContext(keyed, true, claimId));
    }
    if (begun?.kind !== "unkeyed") response.headers.push(this.answerWithin);
    if (keyed) response.headers.push(this.refHeader(keyed, claimId));
    return response;
  }

  /**
   * The 500 for a handler (or a phase) that threw something idem does not own: in atomic mode its
   * transaction rolled back, so nothing of it was kept, but what it did outside the transaction is
   * unknown (no new key); in phases mode the key may be claimed and unfinished. Retry with the same key.
   */
  internalError(begun?: Begun): StoredResponse {
    const keyed = begun?.kind === "keyed" ? begun.claim : undefined;
    const operation: OperationFields = this.phasesMode
      ? { ...OUTCOME_UNKNOWN_RETRY }
      : { operation_state: "none", retry_same_key: true, safe_new_key: false };
    if (keyed) operation.operation_ref = this.refs.encode(keyed.scope, keyed.key);
    const response = problemResponse(
      500,
      "internal-error",
      "The request failed and nothing was saved; a retry with the same Idempotency-Key runs it again.",
      { operation },
    );
    if (begun?.kind !== "unkeyed") response.headers.push(this.answerWithin);
    if (keyed) response.headers.push(this.refHeader(keyed));
    return response;
  }

  /**
   * `claimed`: whether the key row may exist unfinished. An idem error in atomic mode rolled the claim back
   * with the work; a phases key may stay claimed and unfinished.
   */
  private errorContext(claim: Claim | undefined, claimed: boolean, claimId?: string | null): ErrorContext {
    if (!claim) return {};
    return { ref: this.refs.encode(claim.scope, claim.key, claimId), claimed };
  }

  /** The header every keyed answer carries: its operation (the claim, when known), for the lookup. */
  private refHeader(claim: { scope: string; key: string }, claimId?: string | null): [string, string] {
    return [OPERATION_REF_HEADER, this.refs.encode(claim.scope, claim.key, claimId)];
  }

  /** A compact key's replay: rebuilt by the route, with the saved status and allow-listed headers only. */
  private async rebuild(compact: CompactOptions<Tx>, saved: CompactSaved, tx: Tx): Promise<StoredResponse> {
    const r = await compact.rebuild(saved, tx);
    return { status: saved.status, headers: keepHeaders(r.headers, this.replayed), body: r.body };
  }

  private refused(claim: Claim): Settled {
    const response = { ...REPLAY_REFUSED, headers: [...REPLAY_REFUSED.headers, this.answerWithin] };
    return this.report(claim, { response, outcome: Outcome.Invalid, replayed: false, executed: false });
  }

  private report(claim: Claim, settled: Settled): Settled {
    lifecycleObserver()?.settled(claim, settled);
    this.options.onOutcome?.({
      outcome: settled.outcome,
      status: settled.response.status,
      scope: claim.scope,
      key: claim.key,
    });
    return settled;
  }

  /**
   * Turn a runner's outcome into the response to send: replays get `Idempotent-Replayed: true`, saved
   * answers the key's expiry, every answer the route's bound, and idem's errors (422, 409 with
   * `Retry-After`, 503) problem responses with the contract's fields. Other errors are rethrown.
   */
  private async settle(
    claim: Claim,
    run: () => Promise<AtomicOutcome>,
    authorize: RunOptions["authorize"],
  ): Promise<Settled> {
    let outcome: AtomicOutcome;
    try {
      outcome = await run();
    } catch (err) {
      const response = this.failure(err, { kind: "keyed", claim, body: NO_BODY });
      if (!response) throw err;
      return this.report(claim, { response, outcome: outcomeOfError(err), replayed: false, executed: false });
    }
    const r = outcome.response;
    if (outcome.kind === "replayed") {
      if (authorize && !(await authorize())) return this.refused(claim);
      const headers: Array<[string, string]> = [
        ...r.headers,
        [REPLAYED_HEADER, "true"],
        [EXPIRES_HEADER, httpDate(outcome.expiresAt)],
        this.answerWithin,
        this.refHeader(claim, outcome.claimId),
      ];
      if (r.status >= 400 && r.status < 500) addStateHeader(headers);
      return this.report(claim, {
        response: { status: r.status, headers, body: r.body },
        outcome: Outcome.Replayed,
        replayed: true,
        executed: false,
      });
    }
    const headers = [...r.headers, this.answerWithin, this.refHeader(claim, outcome.claimId)];
    if (outcome.saved) {
      headers.push([EXPIRES_HEADER, httpDate(outcome.expiresAt)]);
      if (r.status >= 400 && r.status < 500) addStateHeader(headers);
    }
    return this.report(claim, {
      response: { status: r.status, headers, body: r.body },
      outcome: outcome.saved ? Outcome.Executed : Outcome.NotSaved,
      replayed: false,
      executed: true,
    });
  }
}

/** `filterHeaders` with the allow-list made a set once per route. */
function keepHeaders(
  headers: Iterable<[string, string]>,
  allowed: ReadonlySet<string>,
): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  for (const [name, value] of headers) {
    const n = name.toLowerCase();
    if (allowed.has(n)) out.push([n, value]);
  }
  return out;
}

/** `date.toUTCString()`, formatted once per second (keys saved in the same second expire in the same one). */
let lastSecond = Number.NaN;
let lastDate = "";
function httpDate(date: Date): string {
  const second = Math.floor(date.getTime() / 1000);
  if (second !== lastSecond) {
    lastDate = date.toUTCString();
    lastSecond = second;
  }
  return lastDate;
}

function unavailable(cause: unknown): RetryableError {
  return new RetryableError("The database is unavailable; nothing was done. Retry with the same key.", {
    cause,
    retryAfterSeconds: 1,
  });
}

/** A saved 4xx is a final "not applied": say so, unless the answer already states it itself. */
function addStateHeader(headers: Array<[string, string]>): void {
  if (!headers.some(([name]) => name.toLowerCase() === OPERATION_STATE_HEADER)) {
    headers.push([OPERATION_STATE_HEADER, "failed_not_applied"]);
  }
}
