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
 * Past `lockTimeoutMs`: 409 with Retry-After, as atomic mode. In one process, B waits in memory behind
 * A's call and then reads the replay. A statement that took the lock in the microseconds after A's
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
  problemResponse,
  SqlState,
  type StoredResponse,
  sqlStateOf,
  type WorkResult,
} from "../../core/index.ts";
import { type AtomicSql, atomicSql, type LookupRow, readLiveRow } from "../atomic/sql.ts";
import { type Db, jsonColumn, type Tx } from "../db.ts";
import { FinishedHints } from "../keys/finished-hints.ts";
import { KeysInFlight, keyIdOf } from "../keys/in-flight.ts";
import { replayOf } from "../keys/row.ts";
import { SharedReads } from "../keys/shared-reads.ts";
import { keyLockId, type PostgresStore } from "../store.ts";
import {
  CLAIM_RELATION,
  commonStatementSql,
  type StatementFound,
  type StatementRow,
  type StatementTable,
  statementSql,
  unkeyedSql,
} from "./sql.ts";

/** A route's one statement, as its handler gives it to `statement()`. */
export interface StatementSpec {
  /**
   * One INSERT, UPDATE or DELETE with RETURNING (or a MERGE ... RETURNING, PostgreSQL 17), that reads its
   * input `FROM idem_claim` (columns `scope`, `key`, `claim_id`): that relation has one row when this
   * request holds the key and none otherwise, so the statement does nothing for a duplicate. E.g.
   * `INSERT INTO payments (account, amount_cents, claim_id) SELECT $1, $2, claim_id FROM idem_claim
   *  RETURNING id, amount_cents`. A statement that returns rows without reading it fails (nothing kept).
   */
  sql: string;
  /** Its parameters, `$1..$n`. Default: none. */
  params?: readonly unknown[];
  /**
   * The saved (and sent) body: an SQL expression over one row the statement returned (its columns by
   * name, the row as `work`), cast to text. Default: `row_to_json(work)::text` (the row as JSON).
   */
  body?: string;
  /** The answer's status when this request holds the key. Default: 201. */
  status?: number;
  /** The answer's headers (the route's replay allow-list decides which are saved). Default: none. */
  headers?: Record<string, string>;
  /**
   * The answer when the statement returned no row (it changed nothing): sent, never saved, so a retry
   * runs the statement again. Default: 404 with a problem+json body.
   */
  empty?: { status: number; headers?: Record<string, string>; body?: string };
}

/** What `statement()` returns for the handler to return: the status and headers, and the body to come. */
export interface StatementReply {
  status: number;
  headers: Record<string, string>;
  /** Empty here: the body is built by the statement (the answer sent carries it). */
  body: string;
}

/** A single-statement route used in a way it cannot honour (the message says which, and what to do). */
export class StatementModeError extends Error {
  /** Always `"StatementModeError"`: the name logs and stack traces show. */
  override name = "StatementModeError";
}

/** The transaction a single-statement handler gets: it records the statement, and runs nothing. */
class StatementCapture implements Tx {
  spec: StatementSpec | undefined;
  readonly raw = undefined;
  query(): never {
    throw new StatementModeError(
      "in single-statement mode the handler runs no query: return statement(tx, { sql, params, body })",
    );
  }
  exec(): never {
    return this.query();
  }
  final(): never {
    return this.query();
  }
}

const DEFAULT_BODY = "row_to_json(work)";
/** The answer to a statement that returned no row, when the route gives none: 404 problem+json. */
const EMPTY: NonNullable<StatementSpec["empty"]> = (() => {
  const r = problemResponse(404, "not-found", "The statement changed nothing; nothing was saved.");
  return { status: r.status, headers: Object.fromEntries(r.headers), body: new TextDecoder().decode(r.body) };
})();

/**
 * The handler's answer on a single-statement route: hand the statement to the store (keyed requests)
 * or run it in `tx` (a request without a key on a `required: false` route). Return what it resolves to.
 */
export async function statement(tx: Tx, spec: StatementSpec): Promise<StatementReply> {
  checkSpec(spec);
  const status = spec.status ?? 201;
  const headers = spec.headers ?? {};
  if (tx instanceof StatementCapture) {
    if (tx.spec) throw new StatementModeError("a single-statement handler calls statement() once");
    tx.spec = spec;
    return { status, headers, body: "" };
  }
  const params = spec.params ?? [];
  const { rows } = await tx.query<{ body: string | null }>(
    unkeyedSql(spec.sql, spec.body ?? DEFAULT_BODY),
    params,
  );
  if (rows.length === 0) {
    const e = spec.empty ?? EMPTY;
    return { status: e.status, headers: e.headers ?? {}, body: e.body ?? "" };
  }
  return { status, headers, body: rows[0]!.body ?? "" };
}

/** Statements checked already, with their parameter count (a route sends the same text each time). */
const checked = new Map<string, number>();
function checkSpec(spec: StatementSpec): void {
  if (checked.get(spec?.sql) === (spec.params?.length ?? 0)) return;
  if (typeof spec?.sql !== "string" || !new RegExp(`\\b${CLAIM_RELATION}\\b`).test(spec.sql)) {
    throw new StatementModeError(
      `a single statement must read its input FROM ${CLAIM_RELATION} (one row when this request holds the key), e.g. INSERT INTO t (a, claim_id) SELECT $1, claim_id FROM ${CLAIM_RELATION} RETURNING id`,
    );
  }
  const n = spec.params?.length ?? 0;
  let max = 0;
  for (const m of spec.sql.matchAll(/\$(\d+)/g)) max = Math.max(max, Number(m[1]));
  if (max > n) {
    throw new StatementModeError(`the statement reads $${max} but is given ${n} parameters`);
  }
  if (checked.size >= 1_000) checked.clear();
  checked.set(spec.sql, n);
}

/**
 * Single-statement mode over a `PostgresStore`'s keys table: pass it as a route's `store`, and answer
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
export class SingleStatementStore implements AtomicStore<Tx> {
  readonly retentionMs: number;
  readonly lockTimeoutMs: number;
  /** This process's calls in progress by (scope, key): a duplicate here waits for it in memory. */
  private readonly inFlight = new KeysInFlight();
  /** Keys this process saw finished (by this process's clock: a hint; the lookup decides). */
  private readonly finished = new FinishedHints();
  /** The lookups of keys in flight, shared by the replays that come meanwhile (shared-reads.ts). */
  private readonly reads = new SharedReads<LookupRow | undefined>();
  /**
   * The built statements by route statement, then body expression: looked up with the route's own
   * strings (constants, whose hashes V8 keeps), not with a key concatenated per request.
   */
  private readonly texts = new Map<string, Map<string, BuiltText>>();
  private textCount = 0;
  private atomicBuilt: { timeKey: string; sql: AtomicSql } | undefined;
  /**
   * Until when (this process's clock: a hint) statements go out whole: the common statement last
   * declined (the database's now was in a partition's first `boundaryOverlapMs`, or this process's
   * estimate of it was off).
   */
  private declinedUntil = 0;

  constructor(readonly store: PostgresStore) {
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

  private async run(
    claim: Claim,
    spec: StatementSpec,
    response: StoredResponse,
    save: StoredResponse,
  ): Promise<AtomicOutcome> {
    const id = keyIdOf(claim);
    // A key this process saw finished is read with the lookup alone: no statement, no wait.
    const until = this.finished.get(id);
    if (until !== undefined) {
      if (until > Date.now()) {
        const answer = await this.replayOf(claim);
        if (answer) return answer;
      }
      this.finished.forget(id);
    }
    const deadline = Date.now() + this.lockTimeoutMs;
    // A duplicate in this process waits for the call in progress (atomic mode's queue): a finished
    // key's waiters read the replay at once, in one shared read; otherwise the first one takes the key.
    let ours = false;
    while (this.inFlight.has(id)) {
      const woken = await this.inFlight.wait(id, deadline);
      if (woken === "timeout") throw new KeyInFlightError(RETRY_AFTER_S);
      if (woken === "yours") {
        ours = true;
        break;
      }
      const answer = await this.replayOf(claim);
      if (answer) return answer;
    }
    if (!ours) this.inFlight.enter(id);
    let finished = false;
    try {
      const out = await this.loop(claim, spec, response, save, deadline);
      finished = out.kind === "replayed" || out.saved;
      if (finished) this.finished.remember(id, out.expiresAt.getTime());
      return out;
    } finally {
      this.inFlight.leave(id, finished);
    }
  }

  private async loop(
    claim: Claim,
    spec: StatementSpec,
    response: StoredResponse,
    save: StoredResponse,
    deadline: number,
  ): Promise<AtomicOutcome> {
    const own = spec.params ?? [];
    const built = this.textOf(spec.sql, own.length, spec.body ?? DEFAULT_BODY);
    const params = own.concat(
      claim.scope,
      claim.key,
      claim.fingerprint,
      keyLockId(claim.scope, claim.key),
      save.status,
      JSON.stringify(save.headers),
    );
    let remade = false;
    // The common statement first (no marker, the key row a plain INSERT), unless it declined lately.
    let whole = this.declinedUntil > Date.now();
    const common = whole ? "" : this.commonOf(built);
    for (let pause = 5; ; pause = Math.min(pause * 2, 100)) {
      let row: StatementRow | undefined;
      try {
        row = (await this.store.db.query<StatementRow>(whole ? built.text : common, params)).rows[0]!;
      } catch (err) {
        if (sqlStateOf(err) === SqlState.UniqueViolation) {
          // A duplicate committed after this statement's snapshot (the boundary marker or the key row met
          // it): nothing of this statement was kept; its row answers. No live row: the common statement
          // met an expired row of the key (the full one replaces it: sent next), or the violation was the
          // route statement's own (its table's unique index), an error of the route.
          const answer = await this.replayOf(claim);
          if (answer === undefined) {
            if (whole) throw err;
            whole = true;
            continue;
          }
          if (answer) return answer;
        } else {
          if (!isMissingPartition(err) || remade) throw err;
          // The database's now moved past the partitions made so far: make them, and send it again
          // (one statement: its work was rolled back with it).
          remade = true;
          await this.store.ensurePartitions();
          continue;
        }
      }
      const [locked, live, savedStatus, savedMs, savedClaimId, , declined] = row
        ? jsonColumn<StatementFound>(row.found)
        : NOTHING_FOUND;
      if (savedStatus != null) {
        const body = encoder.encode(row!.saved_body ?? "");
        return {
          kind: "executed",
          response: { status: response.status, headers: response.headers, body },
          saved: true,
          expiresAt: new Date(savedMs! + this.retentionMs),
          claimId: savedClaimId,
        };
      }
      if (live) {
        // The key's live row answers (read apart: a replay, 422); not finished, or gone since: wait.
        const answer = await this.replayOf(claim);
        if (answer) return answer;
      } else if (declined) {
        // The common statement declined (no lock taken, no work): a row made now needs a marker, or the
        // partitions it named miss one. The full statement answers, for the rest of a marker's window.
        this.declinedUntil = Date.now() + this.store.boundaryOverlapMs;
        whole = true;
        continue;
      } else if (locked) {
        // Claimed, and the statement returned no row: it changed nothing, and nothing was saved.
        const e = spec.empty ?? EMPTY;
        const headers = Object.entries(e.headers ?? {}).map(
          ([k, v]) => [k.toLowerCase(), v] as [string, string],
        );
        return unsaved({ status: e.status, headers, body: encoder.encode(e.body ?? "") });
      }
      // Busy: the key is held by a statement (or a transaction of atomic mode) in progress elsewhere.
      const left = deadline - Date.now();
      if (left <= 0) throw new KeyInFlightError(RETRY_AFTER_S);
      await new Promise((r) => setTimeout(r, Math.min(left, pause * (0.5 + Math.random()))));
    }
  }

  /** A handler that answered without its statement: the key's live row answers first, if there is one. */
  private async withoutStatement(claim: Claim, response: StoredResponse): Promise<AtomicOutcome> {
    const answer = await this.replayOf(claim);
    if (answer === null) throw new KeyInFlightError(RETRY_AFTER_S);
    return answer ?? unsaved(response);
  }

  /**
   * The key's live row read alone: its replay (or 422, 409 in review), null when it is not finished,
   * undefined when there is none.
   */
  private async replayOf(claim: Claim): Promise<AtomicOutcome | null | undefined> {
    const store = this.store;
    const row = await readLiveRow(
      this.reads,
      store.db,
      this.atomicStatements(),
      store.estimatedNowMs(),
      keyIdOf(claim),
      claim,
    );
    if (!row) return undefined;
    return replayOf(this.store, claim, row) ?? null;
  }

  /**
   * Atomic mode's statements, built once per time shift: every replay reads their lookup, and the
   * driver finds its prepared name by the text (a string built per call would be hashed again each time).
   */
  private atomicStatements(): AtomicSql {
    const t = this.store.dbTime;
    if (this.atomicBuilt?.timeKey === t.key) return this.atomicBuilt.sql;
    const sql = atomicSql(this.store.schema, t);
    this.atomicBuilt = { timeKey: t.key, sql };
    return sql;
  }

  /**
   * The common statement, naming the partitions this process's estimate of the database's time puts the
   * lookup's window in: built again when they move on (a partition boundary, twice per partition).
   */
  private commonOf(built: BuiltText): string {
    const { lo, hi } = built.table.dbTime.rangeAround(this.store.estimatedNowMs());
    const c = built.common;
    if (c?.lo === lo && c.hi === hi) return c.text;
    const text = commonStatementSql(built.table, built.sql, built.n, built.body, { lo, hi });
    built.common = { lo, hi, text };
    return text;
  }

  /** The statements' texts, built once per route statement (and again when the store's time shift moved). */
  private textOf(sql: string, n: number, body: string): BuiltText {
    const time = this.store.dbTime;
    let bodies = this.texts.get(sql);
    const hit = bodies?.get(body);
    if (hit && hit.n === n && hit.timeKey === time.key) return hit;
    const table = {
      schema: this.store.schema,
      dbTime: time,
      boundaryOverlapMs: this.store.boundaryOverlapMs,
    };
    const built: BuiltText = {
      n,
      timeKey: time.key,
      text: statementSql(table, sql, n, body),
      table,
      sql,
      body,
      common: undefined,
    };
    if (this.textCount >= MAX_TEXTS) {
      this.texts.clear();
      this.textCount = 0;
      bodies = undefined;
    }
    if (!bodies) {
      bodies = new Map();
      this.texts.set(sql, bodies);
    }
    if (!hit) this.textCount++;
    bodies.set(body, built);
    return built;
  }
}

/** A route's built statements: for `n` route parameters, at the store's time shift `timeKey`. */
interface BuiltText {
  n: number;
  timeKey: string;
  /** The full statement (sql.ts `statementSql`). */
  text: string;
  /** The common case's (sql.ts `commonStatementSql`), for the partitions it was built for. */
  common: { lo: number; hi: number; text: string } | undefined;
  /** Its table, route statement and body expression. */
  table: StatementTable;
  sql: string;
  body: string;
}

/** What a statement that failed (and was read apart) found. */
const NOTHING_FOUND: StatementFound = [false, false, null, null, null, null, false];

const encoder = new TextEncoder();

/** Whether a header is not derived from the body (Content-Length, ETag: a framework's, of the placeholder). */
function notOfThePlaceholder([name]: readonly [string, string]): boolean {
  const n = name.toLowerCase();
  return n !== "content-length" && n !== "etag";
}

function unsaved(response: StoredResponse): AtomicOutcome {
  return { kind: "executed", response, saved: false, expiresAt: new Date() };
}

/** The Retry-After of a 409 for a key still in flight (atomic mode's). */
const RETRY_AFTER_S = 1;

/** How many distinct route statements a store keeps built. */
const MAX_TEXTS = 256;
