/**
 * The completer: finishes keys that were abandoned mid-way (the worker crashed and the client never
 * retried), so that a payment whose provider charge went through still reaches done, with its local
 * rows and outbox events. It resumes each key exactly as a retry would: through the key's own runner,
 * with the input stored at the claim, taking the lease the usual way (so it never races a live worker).
 *
 * Run it periodically (`idem complete`, or a timer in the service).
 */
import { type AtomicOutcome, isKeyInFlightError, isLeaseLostError, isRetryableError } from "../core/index.ts";
import type { PhasesRunner } from "./phases.ts";
import type { PostgresStore } from "./store.ts";

export interface CompleteOptions {
  /** The store holding the keys. Required. */
  store: PostgresStore;
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

export type CompleteResult =
  | "completed" // resumed and finished now (a final answer saved, or a non-final one with the lease freed)
  | "replayed" // someone finished it between our scan and our turn
  | "in-flight" // a worker holds a live lease on it again
  | "retryable" // a transient failure; the lease was freed and the next run tries again
  | "lost" // our lease was taken over while we worked
  | "failed" // the runner threw something else (the lease was freed)
  | "no-runner" // no runner with the key's runner name was given
  | "pending"; // dry run

export interface CompleteReport {
  /** Unfinished keys found (with a free or expired lease). */
  found: number;
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
}

export async function complete(options: CompleteOptions): Promise<CompleteReport> {
  const { store } = options;
  const byName = new Map<string, PhasesRunner<any, any>>();
  const list = Array.isArray(options.runners)
    ? (options.runners as ReadonlyArray<PhasesRunner<any, any>>)
    : Object.values(options.runners);
  for (const r of list) byName.set(r.name, r);

  const now = store.clock();
  const oldest = now - store.retentionMs;
  const s = store.schema;
  // Served by the partial index keys_unfinished: only rows still in progress are ever scanned.
  const { rows } = await store.db.query<Abandoned>(
    `SELECT scope, key, fingerprint, runner, request, recovery_point
       FROM ${s}.keys
      WHERE recovery_point <> 'done' AND NOT marker
        AND updated_at <= $1::timestamptz
        AND (lease_until IS NULL OR lease_until <= $2::timestamptz)
        AND bucket >= $3 AND created_at > $4::timestamptz
      ORDER BY updated_at
      LIMIT $5`,
    [
      new Date(now - (options.olderThanMs ?? 60_000)).toISOString(),
      new Date(now).toISOString(),
      store.partitions.bucketOf(oldest),
      new Date(oldest).toISOString(),
      Math.max(1, Math.floor(options.limit ?? 100)),
    ],
  );

  const counts: Record<CompleteResult, number> = {
    completed: 0,
    replayed: 0,
    "in-flight": 0,
    retryable: 0,
    lost: 0,
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
        const out: AtomicOutcome = await runner.run(claim, row.request);
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
