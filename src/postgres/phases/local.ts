/**
 * A local phase's transaction: the phase's writes and the key's next recovery point (or its saved
 * answer) commit together, fenced by the lease token, so a worker whose lease was taken over writes
 * nothing. The phases runner (runner.ts) applies what it ended in.
 */
import {
  isSaved,
  LeaseLostError,
  type SavePolicy,
  type StoredResponse,
  withGuardedTx,
} from "../../core/index.ts";
import { commit, endTx, rollback } from "../../core/tx-end.ts";
import type { CrashPointName } from "./faults.ts";
import { FencedTx } from "./fenced-tx.ts";
import { advanceParams, fence, finishParams, type Lease } from "./lease.ts";
import type { LocalPhase, PhaseContext, PhaseStep } from "./types.ts";

/** How a local phase's transaction ended. */
export type LocalEnd<D> =
  /** Committed at the next phase, with the data it recorded. */
  | { kind: "advanced"; next: string; data: Partial<D> | undefined }
  /** Committed with the key's final answer, saved. */
  | { kind: "finished"; response: StoredResponse }
  /** Rolled back: the answer is not final (the save policy), and is given to this caller only. */
  | { kind: "unsaved"; response: StoredResponse };

/** What a local phase's transaction needs of its runner. */
export interface LocalSettings<D> {
  /** The runner's name (for errors). */
  name: string;
  policy: SavePolicy;
  replayHeaders: readonly string[];
  leaseMs: number;
  /** The runner's fault hook at `point`, for this lease. */
  crashPoint(point: CrashPointName): Promise<void>;
  /** The phase after this one, given what it returned. */
  nextOf(step: PhaseStep<D> | undefined): string;
}

/** Run `phase` in one fenced transaction, and say how it ended. */
export function localTransaction<I, D extends Record<string, unknown>>(
  phase: LocalPhase<I, D>,
  lease: Lease<I, D>,
  ctx: PhaseContext<I, D>,
  s: LocalSettings<D>,
): Promise<LocalEnd<D>> {
  const { table, sql } = lease;
  // The recovery point an external phase left to go out with this transaction (runner.ts `record`).
  const before = lease.unrecorded;
  lease.unrecorded = undefined;
  return endTx<LocalEnd<D>>(
    table.db,
    async (tx) => {
      // The fence: lock our key row only if the token is still ours. A stale worker stops here,
      // before its business writes count; a takeover that comes later waits for this commit.
      const held = tx.query(sql.lock, fence(lease)).then((locked) => {
        if (locked.rows.length === 0) throw new LeaseLostError();
      });
      let step: PhaseStep<D> | undefined;
      if (tx.pipelined) {
        // The phase's first statement leaves with BEGIN and the lock; it is answered only once the
        // fence held (FencedTx), and the fence's error wins over whatever the phase made of it.
        const running = withGuardedTx(new FencedTx(tx, held), (fenced) => phase.local(ctx, fenced));
        running.catch(() => {});
        await held;
        step = await running;
      } else {
        await held;
        // Fenced: what the phase keeps past its return fails at once (guarded-tx.ts).
        step = await withGuardedTx(tx, (guarded) => phase.local(ctx, guarded));
      }
      if (step?.review) throw new Error(`phases "${s.name}": only an external phase can ask for review`);
      // The row is locked with our token, so the last write cannot miss: it goes out with COMMIT
      // (one round trip on a pipelining driver), still fenced by the token.
      if (step?.response) {
        // Not a final answer: the phase's writes roll back.
        if (!isSaved(step.response.status, s.policy))
          return rollback({ kind: "unsaved", response: step.response });
        await s.crashPoint("before-commit");
        tx.final(sql.finish, finishParams(lease, step, s.replayHeaders));
        return commit({ kind: "finished", response: step.response });
      }
      const next = s.nextOf(step);
      await s.crashPoint("before-commit");
      tx.final(sql.advance, advanceParams(lease, next, step?.data, s.leaseMs));
      return commit({ kind: "advanced", next, data: step?.data });
    },
    {
      begin: `SET LOCAL lock_timeout = '${Math.max(1, Math.floor(table.lockTimeoutMs))}ms'`,
      batch: true,
      before,
    },
  );
}
