/**
 * Single-statement mode: for a route whose work is one SQL statement, the key's claim, the work and the
 * saved reply are ONE autocommitted statement (sql.ts). One round trip and no transaction to hold, with
 * atomic mode's guarantees: the work runs once under concurrent duplicates, a crash leaves nothing
 * half-done (it is one statement), another request under the key is 422, the saved reply is replayed
 * byte for byte through the same code (keys/row.ts `replayOf`), and the row is an ordinary key row
 * (inspection, retention by partitions, the operation lookup, admin).
 *
 * It is an `AtomicStore`, so every adapter's `idempotency()` mounts it: the handler validates, then
 * returns `statement(tx, { sql, params, body })` instead of running queries itself. The handler runs
 * first, with a `tx` that only records the statement; the store then sends it (the reply's status and
 * allow-listed headers come from the handler's answer, its body from the SQL). So the handler runs for
 * every request, a duplicate's or a replay's too: it must have no effect of its own (validation only).
 *
 * Timeline of two duplicates A and B in two processes:
 *   A: statement: no live row, try-lock taken, work, key row inserted, COMMIT (lock released)
 *   B: statement while A runs: no live row (A not committed), try-lock refused -> no work, "busy"
 *   B: sleeps (no connection held), sends the statement again: A's row is live -> replay
 * The waits are the key gate's (keys/gate.ts), as in every mode: past `lockTimeoutMs`, 409 with
 * Retry-After; in one process, B waits in memory behind A's call and then reads the replay. A statement that took the lock in the microseconds after A's
 * commit but with a snapshot from before it runs the work and fails on the unique index (23505, its
 * work rolled back with it): B then reads again and replays.
 *
 * Not with a sealer: the reply is built in SQL, which cannot seal it (AES-GCM in this process), so a
 * sealed store is refused (`StatementModeError`) rather than saving a reply in clear.
 */
import {
  type AtomicOutcome,
  type AtomicRunOptions,
  type AtomicStore,
  type Claim,
  isMissingPartition,
  KeyInFlightError,
  type KeyInspection,
  type OperationRefCodec,
  SqlState,
  type StoredResponse,
  sqlStateOf,
  type WorkResult,
} from "../../core/index.ts";
import { type Db, jsonColumn, type Tx } from "../db.ts";
import { KeyGate, type Pass } from "../keys/gate.ts";
import { keyIdOf } from "../keys/in-flight.ts";
import { keyLockId } from "../keys/lock.ts";
import { type LookupRow, type LookupSql, lookupSql, readLiveRow } from "../keys/lookup.ts";
import { expiryOf, replayOf } from "../keys/row.ts";
import { SharedReads } from "../keys/shared-reads.ts";
import type { KeyStore } from "../keys/table.ts";
import {
  checkSpec,
  DEFAULT_BODY,
  emptyAnswer,
  notOfThePlaceholder,
  StatementCapture,
  StatementModeError,
  type StatementSpec,
} from "./spec.ts";
import type { StatementFound, StatementRow } from "./sql.ts";
import { type BuiltText, StatementTexts } from "./texts.ts";

export { StatementModeError, type StatementReply, type StatementSpec, statement } from "./spec.ts";

/** One call of the store as it passes the key gate: the route's statement under a claim. */
interface StatementCall {
  readonly claim: Claim;
  readonly spec: StatementSpec;
  /** The answer's status and headers (its body comes from the statement), and what is saved. */
  readonly response: StoredResponse;
  readonly save: StoredResponse;
  /** The statement's texts and parameters, made at the first attempt. */
  built?: BuiltText;
  params?: unknown[];
  /** The common statement's text ("" once the full one goes out). */
  common: string;
  /** The full statement goes out: the common one declined, or met an expired row. */
  whole: boolean;
  /** The partitions were made again once (a missing one at the insert). */
  remade: boolean;
}

/**
 * Single-statement mode over a `PostgresStore`'s keys table (any `KeyStore`): pass it as a route's `store`, and answer
 * with `statement(tx, ...)` from the handler.
 *
 *   const payments = new SingleStatementStore(store);
 *   http.createServer(idempotency(async (req, { tx, scope, body }) => statement(tx, {
 *     sql: `INSERT INTO payments (account, amount_cents, claim_id)
 *           SELECT $1, $2, claim_id FROM idem_claim RETURNING id::text, amount_cents`,
 *     params: [scope, body.amount_cents],
 *     headers: { "content-type": "application/json" },
 *   }), { store: payments, scope: accountOf }));
 */
export class SingleStatementStore<S extends KeyStore = KeyStore> implements AtomicStore<Tx> {
  readonly retentionMs: number;
  readonly lockTimeoutMs: number;
  /** The lookups of keys in flight, shared by the replays that come meanwhile (shared-reads.ts). */
  private readonly reads = new SharedReads<LookupRow | undefined>();
  /** The statements' texts, per route statement (texts.ts). */
  private readonly texts: StatementTexts;
  /** The key gate every call passes (keys/gate.ts): this mode is its attempt. */
  private readonly gate: KeyGate<StatementCall, AtomicOutcome>;
  private lookupsBuilt: { timeKey: string; sql: LookupSql } | undefined;
  /**
   * Until when (this process's estimate of the database's clock: a hint) statements go out whole: the
   * common statement last declined (the database's now was in a partition's first `boundaryOverlapMs`,
   * or this process's estimate of it was off).
   */
  private declinedUntil = 0;

  constructor(readonly store: S) {
    if (store.sealer) {
      throw new StatementModeError(
        "single-statement mode builds the saved reply in SQL, which cannot seal it: use atomic mode with a sealing store",
      );
    }
    if (store.distributed) {
      throw new StatementModeError(
        "single-statement mode assumes one PostgreSQL node (its lock and boundary marker): on Citus use atomic mode",
      );
    }
    this.retentionMs = store.retentionMs;
    this.lockTimeoutMs = store.lockTimeoutMs;
    this.texts = new StatementTexts(store);
    this.gate = new KeyGate<StatementCall, AtomicOutcome>({
      boundMs: () => this.lockTimeoutMs,
      now: () => store.estimatedNowMs(),
      replay: async (call) => (await this.readKey(call.claim)) ?? undefined,
      attempt: (call) => this.attempt(call),
    });
  }

  get db(): Db {
    return this.store.db;
  }

  /** The store's operation references (`PostgresStore.refs`). */
  get refs(): OperationRefCodec {
    return this.store.refs;
  }

  inspect(scope: string, key: string): Promise<KeyInspection | undefined> {
    return this.store.inspect(scope, key);
  }

  transaction<T>(work: (tx: Tx) => Promise<T>): Promise<T> {
    return this.store.transaction(work);
  }

  /**
   * Run the handler (`work`) with a recording `tx`, then its statement under the claim. A handler that
   * answers without a statement (a validation error) saves nothing; the key's live row, if any, still
   * answers first (a replay, 422).
   */
  async atomic(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    options: AtomicRunOptions<Tx> = {},
  ): Promise<AtomicOutcome> {
    if (options.rebuild) {
      throw new StatementModeError("single-statement mode saves whole replies: a route cannot be `compact`");
    }
    const capture = new StatementCapture();
    const result = await work(capture);
    const spec = capture.spec;
    if (!spec) return this.withoutStatement(claim, result.response);
    if (!result.save) {
      throw new StatementModeError(
        `status ${result.response.status} is not saved by this route: a single statement's answer must be final`,
      );
    }
    if (result.compactId !== undefined) {
      throw new StatementModeError("single-statement mode saves whole replies: a route cannot be `compact`");
    }
    if (options.signal?.aborted) return unsaved(result.response);
    // The handler's answer carried a placeholder body: what a framework derived from it (its length, an
    // ETag) would be wrong for the body the statement builds, sent and saved.
    const response = { ...result.response, headers: result.response.headers.filter(notOfThePlaceholder) };
    const save = { ...result.save, headers: result.save.headers.filter(notOfThePlaceholder) };
    return this.run(claim, spec, response, save);
  }

  /**
   * The store-level call: run `spec` under `claim` and say what happened (`AtomicOutcome`), without an
   * HTTP adapter. `status` and `headers` are the answer's (all headers are saved).
   */
  runStatement(claim: Claim, spec: StatementSpec): Promise<AtomicOutcome> {
    checkSpec(spec);
    const headers = Object.entries(spec.headers ?? {}).map(
      ([k, v]) => [k.toLowerCase(), v] as [string, string],
    );
    const response = { status: spec.status ?? 201, headers, body: new Uint8Array() };
    return this.run(claim, spec, response, response);
  }

  private run(
    claim: Claim,
    spec: StatementSpec,
    response: StoredResponse,
    save: StoredResponse,
  ): Promise<AtomicOutcome> {
    return this.gate.pass({ claim, spec, response, save, common: "", whole: false, remade: false });
  }

  /**
   * One attempt: the statement sent (again, at once, when it declined, met an expired row, or a
   * partition had to be made), and what it found: the saved reply, the key's live row (read apart),
   * a statement that changed nothing, or the key held elsewhere (busy).
   */
  private async attempt(call: StatementCall): Promise<Pass<AtomicOutcome>> {
    const { claim, spec } = call;
    const built = call.built ?? this.prepare(call);
    const params = call.params!;
    for (;;) {
      let row: StatementRow | undefined;
      try {
        const text = call.whole ? built.text : call.common;
        row = (await this.store.db.query<StatementRow>(text, params)).rows[0]!;
      } catch (err) {
        if (sqlStateOf(err) === SqlState.UniqueViolation) {
          // A duplicate committed after this statement's snapshot (the boundary marker or the key row met
          // it): nothing of this statement was kept; its row answers. No live row: the common statement
          // met an expired row of the key (the full one replaces it: sent next), or the violation was the
          // route statement's own (its table's unique index), an error of the route.
          const answer = await this.readKey(claim);
          if (answer === undefined) {
            if (call.whole) throw err;
            call.whole = true;
            continue;
          }
          if (answer) return answered(answer);
        } else {
          if (!isMissingPartition(err) || call.remade) throw err;
          // The database's now moved past the partitions made so far: make them, and send it again
          // (one statement: its work was rolled back with it).
          call.remade = true;
          await this.store.ensurePartitions();
          continue;
        }
      }
      const [locked, live, savedStatus, savedMs, savedClaimId, , declined] = row
        ? jsonColumn<StatementFound>(row.found)
        : NOTHING_FOUND;
      if (savedStatus != null) {
        const body = encoder.encode(row!.saved_body ?? "");
        return answered({
          kind: "executed",
          response: { status: call.response.status, headers: call.response.headers, body },
          saved: true,
          expiresAt: expiryOf(this.store, { created_at: new Date(savedMs!) }),
          claimId: savedClaimId,
        });
      }
      // The key's live row answers (read apart: a replay, 422); not finished, or gone since: as busy.
      if (live) return READ;
      if (declined) {
        // The common statement declined (no lock taken, no work): a row made now needs a marker, or the
        // partitions it named miss one. The full statement answers, for the rest of a marker's window.
        this.declinedUntil = this.store.estimatedNowMs() + this.store.boundaryOverlapMs;
        call.whole = true;
        continue;
      }
      // Claimed, and the statement returned no row: it changed nothing, and nothing was saved.
      if (locked) return answered(unsaved(emptyAnswer(spec)));
      // Busy: the key is held by a statement (or a transaction of atomic mode) in progress elsewhere.
      return BUSY;
    }
  }

  /** The call's texts and parameters, and whether its first statement goes out whole. */
  private prepare(call: StatementCall): BuiltText {
    const { claim, spec, save } = call;
    const own = spec.params ?? [];
    const built = this.texts.of(spec.sql, own.length, spec.body ?? DEFAULT_BODY);
    call.built = built;
    call.params = own.concat(
      claim.scope,
      claim.key,
      claim.fingerprint,
      keyLockId(claim.scope, claim.key),
      save.status,
      JSON.stringify(save.headers),
    );
    // The common statement first (no marker, the key row a plain INSERT), unless it declined lately.
    const now = this.store.estimatedNowMs();
    call.whole = this.declinedUntil > now;
    call.common = call.whole ? "" : this.texts.commonOf(built, now);
    return built;
  }

  /** A handler that answered without its statement: the key's live row answers first, if there is one. */
  private async withoutStatement(claim: Claim, response: StoredResponse): Promise<AtomicOutcome> {
    const answer = await this.readKey(claim);
    if (answer === null) throw new KeyInFlightError(RETRY_AFTER_S);
    return answer ?? unsaved(response);
  }

  /**
   * The key's live row read alone: its replay (or 422, 409 in review), null when it is not finished,
   * undefined when there is none.
   */
  private async readKey(claim: Claim): Promise<AtomicOutcome | null | undefined> {
    const store = this.store;
    const row = await readLiveRow(
      this.reads,
      store.db,
      this.lookups(),
      store.estimatedNowMs(),
      keyIdOf(claim),
      claim,
    );
    if (!row) return undefined;
    return replayOf(store, claim, row) ?? null;
  }

  /**
   * The lookups, built once per time shift: every replay reads them, and the driver finds its prepared
   * name by the text (a string built per call would be hashed again each time).
   */
  private lookups(): LookupSql {
    const t = this.store.dbTime;
    if (this.lookupsBuilt?.timeKey === t.key) return this.lookupsBuilt.sql;
    const sql = lookupSql(this.store.schema, t);
    this.lookupsBuilt = { timeKey: t.key, sql };
    return sql;
  }
}

/** What a statement that failed (and was read apart) found. */
const NOTHING_FOUND: StatementFound = [false, false, null, null, null, null, false];

const BUSY: Pass<AtomicOutcome> = { kind: "busy" };
const READ: Pass<AtomicOutcome> = { kind: "read" };

/** The key's answer for this call, remembered as finished when it is (a replay, or saved). */
function answered(out: AtomicOutcome): Pass<AtomicOutcome> {
  const finished = out.kind === "replayed" || out.saved;
  return {
    kind: "answer",
    value: out,
    finished,
    expiresAtMs: finished ? out.expiresAt.getTime() : undefined,
  };
}

const encoder = new TextEncoder();

function unsaved(response: StoredResponse): AtomicOutcome {
  return { kind: "executed", response, saved: false, expiresAt: new Date() };
}

/** The Retry-After of a 409 for a key still in flight (the key gate's). */
const RETRY_AFTER_S = 1;
