/**
 * The service's background upkeep: retention (drop expired partitions, hourly) and the completer
 * (finish payments whose clients never came back, every 30 s). Each instance may run them; both are
 * safe to run concurrently. Inbox dedup marks are kept a week (their partitions dropped after): far
 * past any redelivery.
 */
import { sweepInbox } from "idem/messaging";
import {
  complete,
  type Db,
  PartitionMissingError,
  type PhasesRunner,
  type PostgresStore,
} from "idem/postgres";
import type { Logger } from "pino";
import type { Metrics } from "./observability.ts";

export function startUpkeep(o: {
  db: Db;
  store: PostgresStore;
  /** The phases runners the completer finishes keys of; none: no completer. */
  runners: PhasesRunner<any, any>[];
  metrics: Metrics;
  logger: Logger;
}): { stop(): void } {
  const { db, store, runners, metrics, logger } = o;
  const sweep = setInterval(
    () =>
      Promise.all([store.sweep(), sweepInbox(db, { retentionMs: 7 * 24 * 3_600_000 })]).catch((err) =>
        err instanceof PartitionMissingError || err?.code === "42501"
          ? logger.warn("sweep skipped: this role may not run DDL; run `idem sweep` hourly as the owner")
          : logger.error({ err }, "sweep failed"),
      ),
    3_600_000,
  );
  const completer = setInterval(() => {
    if (!runners.length) return;
    complete({ store, runners, olderThanMs: 60_000 }).then(
      (r) => {
        for (const [result, n] of Object.entries(r.counts)) if (n) metrics.completerRuns.inc({ result }, n);
        if (r.found) logger.info({ counts: r.counts }, "completer finished abandoned keys");
      },
      (err) => logger.error({ err }, "completer failed"),
    );
  }, 30_000);
  sweep.unref();
  completer.unref();
  return {
    stop() {
      clearInterval(sweep);
      clearInterval(completer);
    },
  };
}
