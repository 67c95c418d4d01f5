/**
 * The completer: finishes keys that were abandoned mid-way (the worker crashed and the client never
 * retried), so that a payment whose provider charge went through still reaches done, with its local
 * rows and outbox events. It resumes each key exactly as a retry would: through the key's own runner,
 * with the input stored at the claim, taking the lease the usual way (so it never races a live worker).
 *
 * Run it periodically (`idem complete`, or a timer in the service).
 */
import {
  type AtomicOutcome,
  isKeyInFlightError,
  isLeaseLostError,
  isOperationUncertainError,
  isRetryableError,
  openJson,
  type Sealer,
  sealContext,
} from "../../core/index.ts";
import { traced } from "../../core/observe.ts";
import { type KeyTable, type PhasesRunner, type ShardedKeyTables, tablesOf } from "../phases/index.ts";

/** Options of {@link complete}. */
export interface CompleteOptions {
  /** The store holding the keys: a `PostgresStore`, or a `ShardedStore` (every shard is scanned). Required. */
  store: KeyTable | ShardedKeyTables;
  /** The runners that may own unfinished keys, matched by `name`. Keys of unknown runners are skipped. */
  runners: ReadonlyArray<PhasesRunner<any, any>> | Record<string, PhasesRunner<any, any>>;
  /**
   * Only keys with no activity for this long, in ms: leave recent ones to the clients' own retries.
   * Default: 60,000.
   */
  olderThanMs?: number;
  /** At most this many keys per call (the oldest first). Default: 100. */
  limit?: number;
  /** How many keys are resumed at the same time. Default: 4. */
  concurrency?: number;
  /** List what would be resumed without running anything. Default: false. */
  dryRun?: boolean;
}

/** What {@link complete} did with one key. */
export type CompleteResult =
  | "completed" // resumed and finished now (a final answer saved, or a non-final one with the lease freed)
  | "replayed" // someone finished it between our scan and our turn
  | "in-flight" // a worker holds a live lease on it again
  | "retryable" // a transient failure; the lease was freed and the next run tries again
  | "lost" // our lease was taken over while we worked
  | "needs-review" // its outcome cannot be established: it now waits for a person (idem keys list)
  | "failed" // the runner threw something else (the lease was freed)
  | "no-runner" // no runner with the key's runner name was given
  | "pending"; // dry run

/** What one {@link complete} run found and did. */
export interface CompleteReport {
  /** Unfinished keys found (with a free or expired lease). */
  found: number;
  /** One entry per key handled: where it was (`point`, its recovery point) and what was done. */
  results: Array<{
    scope: string;
    key: string;
    runner: string | null;
    point: string;
    result: CompleteResult;
    /** The final status, for completed keys. */
    status?: number;
    error?: string;
  }>;
  /** Count per result. */
  counts: Record<CompleteResult, number>;
}

interface Abandoned {
  scope: string;
  key: string;
  fingerprint: Uint8Array;
  runner: string | null;
  request: unknown;
  recovery_point: string;
  updated_at: Date;
  /** The sealer of the table the row was found in (its stored input may be sealed). */
  sealer: Sealer | undefined;
}

/**
 * Finish abandoned keys once (see the module's notes): the oldest unfinished keys with no activity for
 * `olderThanMs` are resumed through their runners, `concurrency` at a time. Run it periodically.
 */
export function complete(options: CompleteOptions): Promise<CompleteReport> {
  return traced(
    "idem.complete",
    { "idem.complete.dry_run": options.dryRun === true },
    () => run(options),
    (r) => ({
      "idem.complete.found": r.found,
      "idem.complete.completed": r.counts.completed,
      "idem.complete.needs_review": r.counts["needs-review"],
    }),
  );
}

async function run(options: CompleteOptions): Promise<CompleteReport> {
  const { store } = options;
  const byName = new Map<string, PhasesRunner<any, any>>();
  const list = Array.isArray(options.runners)
    ? (options.runners as ReadonlyArray<PhasesRunner<any, any>>)
    : Object.values(options.runners);
  for (const r of list) byName.set(r.name, r);

  const limit = Math.max(1, Math.floor(options.limit ?? 100));
  const rows: Abandoned[] = [];
  for (const table of tablesOf(store))
    rows.push(...(await scan(table, options.olderThanMs ?? 60_000, limit)));
  rows.sort((a, b) => a.updated_at.getTime() - b.updated_at.getTime());
  rows.splice(limit);

  const counts: Record<CompleteResult, number> = {
    completed: 0,
    replayed: 0,
    "in-flight": 0,
    retryable: 0,
    lost: 0,
    "needs-review": 0,
    failed: 0,
    "no-runner": 0,
    pending: 0,
  };
  const results: CompleteReport["results"] = [];

  const resume = async (row: Abandoned) => {
    const base = { scope: row.scope, key: row.key, runner: row.runner, point: row.recovery_point };
    const runner = row.runner ? byName.get(row.runner) : undefined;
    let entry: CompleteReport["results"][number];
    if (!runner) entry = { ...base, result: "no-runner" };
    else if (options.dryRun) entry = { ...base, result: "pending" };
    else {
      try {
        const claim = { scope: row.scope, key: row.key, fingerprint: new Uint8Array(row.fingerprint) };
        // The key resumes with its stored input whatever is passed; no answer bound: there is no
        // client to answer early.
        const input = openJson(row.sealer, row.request, sealContext(row.scope, row.key, "request"));
        const out: AtomicOutcome = await runner.run(claim, input, {
          answerWithinMs: Number.POSITIVE_INFINITY,
        });
        entry = {
          ...base,
          result: out.kind === "replayed" ? "replayed" : "completed",
          status: out.response.status,
        };
      } catch (err) {
        const result: CompleteResult = isKeyInFlightError(err)
          ? "in-flight"
          : isRetryableError(err)
            ? "retryable"
            : isLeaseLostError(err)
              ? "lost"
              : isOperationUncertainError(err)
                ? "needs-review"
                : "failed";
        entry = { ...base, result, error: String((err as Error)?.message ?? err) };
      }
    }
    counts[entry.result]++;
    results.push(entry);
  };

  const queue = [...rows];
  const workers = Array.from({ length: Math.max(1, options.concurrency ?? 4) }, async () => {
    for (let row = queue.shift(); row; row = queue.shift()) await resume(row);
  });
  await Promise.all(workers);
  return { found: rows.length, results, counts };
}

/** The unfinished keys of one table whose lease is free or expired, idle for `olderThanMs`. */
async function scan(table: KeyTable, olderThanMs: number, limit: number): Promise<Abandoned[]> {
  const t = table.dbTime;
  // Served by the partial index keys_unfinished: only rows still in progress are ever scanned. Keys in
  // review wait for a person, never for the completer. Idle and expired by the database's clock (the
  // lease is checked again, in SQL, when the key is resumed).
  const { rows } = await table.db.query<Omit<Abandoned, "sealer">>(
    `SELECT scope, key, fingerprint, runner, request, recovery_point, updated_at
       FROM ${table.schema}.keys
      WHERE recovery_point <> 'done' AND NOT marker AND needs_review_at IS NULL
        AND updated_at <= ${t.now} - $1::float8 * interval '1 millisecond'
        AND (lease_until IS NULL OR lease_until <= ${t.now})
        AND bucket >= ${t.oldestBucket} AND created_at > ${t.oldest}
      ORDER BY updated_at
      LIMIT $2`,
    [olderThanMs, limit],
  );
  return rows.map((r) => ({ ...r, updated_at: new Date(r.updated_at), sealer: table.sealer }));
}
