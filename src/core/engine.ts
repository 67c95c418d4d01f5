import { IdemError, isIdemError, KeyMissingError } from "./errors.ts";
import { fieldsFingerprint, fingerprint, parseBody } from "./fingerprint.ts";
import { parseIdempotencyKey } from "./key.ts";
import { errorResponse, problemResponse } from "./problem.ts";
import {
  DEFAULT_REPLAYED_HEADERS,
  filterHeaders,
  isSaved,
  type SavePolicy,
  type StoredResponse,
} from "./response.ts";
import type { AtomicOutcome, AtomicStore, Claim, CompactSaved } from "./store.ts";

/** A request as the engine sees it; each HTTP adapter builds one from its framework's request. */
export interface IdemRequest {
  method: string;
  /** Path with query string. */
  path: string;
  header(name: string): string | null | undefined;
  body: Uint8Array;
}

export interface EngineOptions<Tx> extends SavePolicy {
  /** Where keys, saved responses and (in atomic mode) the work's transaction live. Required. */
  store: AtomicStore<Tx>;
  /** Answer 400 when a request has no `Idempotency-Key`. Default: `true`. */
  required?: boolean;
  /**
   * How requests are compared: by default SHA-256 over method, path and canonical body. Pass
   * `{ fields: ["amount_cents", "currency"] }` to compare selected body fields only, or a function.
   */
  fingerprint?: { fields: readonly string[] } | ((req: IdemRequest) => Uint8Array);
  /** Response headers replayed with a saved response. Default: `DEFAULT_REPLAYED_HEADERS`. Never Set-Cookie. */
  replayHeaders?: readonly string[];
  /** Called once per request with how it ended (for metrics and logs). Default: none. */
  onOutcome?: (event: OutcomeEvent) => void;
  /**
   * Compact storage for this route (atomic mode): save the status and the created resource's id instead
   * of the whole reply, and rebuild the reply from them on replay. Replays are then no longer byte for
   * byte: they are whatever `rebuild` makes of the resource now. Default: none (replies saved in full).
   */
  compact?: CompactOptions<Tx>;
}

/** How a route saves its replies in compact form and rebuilds them (see `EngineOptions.compact`). */
export interface CompactOptions<Tx> {
  /**
   * The id of the resource a saved reply created (e.g. the payment id), or undefined to save this
   * reply in full (e.g. a 402 decline that created nothing). Runs inside the work's transaction: if it
   * throws, the work rolls back.
   */
  id: (response: StoredResponse) => string | undefined;
  /**
   * The reply to replay for a key saved in compact form, from its status and resource id. Runs in the
   * replay's transaction (`tx`), so it may read the resource. The replay keeps the saved status and
   * only allow-listed headers, plus `Idempotent-Replayed: true`.
   */
  rebuild: (saved: CompactSaved, tx: Tx) => StoredResponse | Promise<StoredResponse>;
}

/** The result of reading a request: either a claim to run, an answer to send at once, or no key at all. */
export type Prepared =
  | { kind: "claim"; claim: Claim }
  | { kind: "answer"; response: StoredResponse }
  | { kind: "unkeyed" };

/** How a keyed request ended, for logs and metrics. */
export const Outcome = {
  /** The work ran and its answer was saved. */
  Executed: "executed",
  /** The work ran but its answer was not final (a 5xx, a late validation failure): nothing saved. */
  NotSaved: "not_saved",
  /** A saved answer was replayed. */
  Replayed: "replayed",
  /** 409: another request holds the key. */
  InFlight: "in_flight",
  /** 422: the key was used for a different request. */
  Mismatch: "mismatch",
  /** 400/401: no key, an invalid key, or no scope. */
  Invalid: "invalid",
  /** A transient failure (503) or a lost lease: nothing final saved, retry with the same key. */
  Retryable: "retryable",
  /** No key on a route where it is optional. */
  Unkeyed: "unkeyed",
} as const;
export type Outcome = (typeof Outcome)[keyof typeof Outcome];

export interface OutcomeEvent {
  outcome: Outcome;
  status: number;
  scope?: string;
  key?: string;
}

/** What `execute`/`settle` return: the response to send and how the request ended. */
export interface Settled {
  response: StoredResponse;
  outcome: Outcome;
  replayed: boolean;
  executed: boolean;
}

export const REPLAYED_HEADER = "idempotent-replayed";
export const EXPIRES_HEADER = "idempotency-expires";

/**
 * The protocol, framework-free: parse the key, fingerprint the request, run the work under a claim,
 * and turn every outcome into the response to send. Adapters only translate requests and responses.
 */
export class IdempotencyEngine<Tx> {
  readonly options: EngineOptions<Tx>;
  private readonly replayHeaders: readonly string[];
  constructor(options: EngineOptions<Tx>) {
    this.options = options;
    this.replayHeaders = options.replayHeaders ?? DEFAULT_REPLAYED_HEADERS;
  }

  /** Read the key and fingerprint. `scope` comes from authentication (undefined: not authenticated). */
  prepare(req: IdemRequest, scope: string | undefined): Prepared {
    let key: string | undefined;
    try {
      key = parseIdempotencyKey(req.header("idempotency-key"));
      if (key === undefined) {
        if (this.options.required === false) return { kind: "unkeyed" };
        throw new KeyMissingError();
      }
    } catch (err) {
      if (isIdemError(err)) {
        this.options.onOutcome?.({ outcome: Outcome.Invalid, status: err.status, scope });
        return { kind: "answer", response: errorResponse(err) };
      }
      throw err;
    }
    if (scope === undefined) {
      this.options.onOutcome?.({ outcome: Outcome.Invalid, status: 401, key });
      return {
        kind: "answer",
        response: problemResponse(401, "unauthorized", "Authenticate before sending an idempotent request."),
      };
    }
    return { kind: "claim", claim: { scope, key, fingerprint: this.fingerprintOf(req) } };
  }

  private fingerprintOf(req: IdemRequest): Uint8Array {
    const f = this.options.fingerprint;
    if (typeof f === "function") return f(req);
    if (f) {
      const parsed = parseBody(req.header("content-type"), req.body) ?? {};
      const picked: Record<string, unknown> = {};
      for (const name of f.fields) picked[name] = parsed[name];
      return fieldsFingerprint(req.method, req.path, picked);
    }
    return fingerprint({
      method: req.method,
      path: req.path,
      contentType: req.header("content-type"),
      body: req.body,
    });
  }

  /**
   * Run `work` under the claim. `work` gets the transaction and returns the handler's response; the
   * engine decides whether it is saved. Returns the response to send (an error, a replay, or the
   * handler's own response with idem's headers added). Errors thrown by `work` are rethrown after the
   * rollback, so the framework's error handling still applies.
   */
  async execute(
    claim: Claim,
    work: (tx: Tx) => Promise<StoredResponse>,
    options: { signal?: AbortSignal } = {},
  ): Promise<Settled> {
    const compact = this.options.compact;
    return this.settle(claim, () =>
      this.options.store.atomic(
        claim,
        async (tx) => {
          const produced = await work(tx);
          if (!isSaved(produced.status, this.options)) return { response: produced, save: undefined };
          const save = {
            status: produced.status,
            headers: this.savedHeaders(produced.headers),
            body: produced.body,
          };
          const compactId = compact?.id(produced);
          return compactId === undefined
            ? { response: produced, save }
            : { response: produced, save, compactId };
        },
        compact ? { ...options, rebuild: (saved, tx) => this.rebuild(compact, saved, tx) } : options,
      ),
    );
  }

  /** A compact key's replay: rebuilt by the route, with the saved status and allow-listed headers only. */
  private async rebuild(compact: CompactOptions<Tx>, saved: CompactSaved, tx: Tx): Promise<StoredResponse> {
    const r = await compact.rebuild(saved, tx);
    return { status: saved.status, headers: this.savedHeaders(r.headers), body: r.body };
  }

  /**
   * Turn the outcome of any runner (atomic mode above, or a phases runner) into the response to send:
   * replays get `Idempotent-Replayed: true`, saved answers the key's expiry, and idem's errors (422,
   * 409 with `Retry-After`, a retryable 503) become problem responses. Other errors are rethrown.
   */
  async settle(claim: Claim, run: () => Promise<AtomicOutcome>): Promise<Settled> {
    const settled = await this.settleOutcome(run);
    this.options.onOutcome?.({
      outcome: settled.outcome,
      status: settled.response.status,
      scope: claim.scope,
      key: claim.key,
    });
    return settled;
  }

  private async settleOutcome(run: () => Promise<AtomicOutcome>): Promise<Settled> {
    try {
      const outcome = await run();
      if (outcome.kind === "replayed") {
        const r = outcome.response;
        return {
          response: {
            status: r.status,
            headers: [
              ...r.headers,
              [REPLAYED_HEADER, "true"],
              [EXPIRES_HEADER, outcome.expiresAt.toUTCString()],
            ],
            body: r.body,
          },
          outcome: Outcome.Replayed,
          replayed: true,
          executed: false,
        };
      }
      const r = outcome.response;
      const headers = outcome.saved
        ? [...r.headers, [EXPIRES_HEADER, outcome.expiresAt.toUTCString()] as [string, string]]
        : r.headers;
      return {
        response: { status: r.status, headers, body: r.body },
        outcome: outcome.saved ? Outcome.Executed : Outcome.NotSaved,
        replayed: false,
        executed: true,
      };
    } catch (err) {
      if (err instanceof IdemError) {
        const outcome =
          err.status === 409 && err.code !== "idempotency-lease-lost"
            ? Outcome.InFlight
            : err.status === 422
              ? Outcome.Mismatch
              : Outcome.Retryable;
        return { response: errorResponse(err), outcome, replayed: false, executed: false };
      }
      throw err;
    }
  }

  /** The headers of a response as they will be saved (allow-listed, never Set-Cookie). */
  savedHeaders(headers: Iterable<[string, string]>): Array<[string, string]> {
    return filterHeaders(headers, this.replayHeaders);
  }
}
