/**
 * Crash points for phases runners, for tests: pass one of these as `definePhases({ faults })`.
 * A "crash" throws `SimulatedCrashError` at a named point and, like a dead process, frees nothing.
 *
 * Points the runner names: after-claim, before-phase, after-external, before-commit, after-commit
 * (plus any `ctx.crash("name")` a phase adds). `phase` narrows a point to one phase.
 */
import type { CrashInfo, CrashPointName, PhaseFaults } from "../postgres/phases/index.ts";
import { createRng } from "./prng.ts";

/** Phase faults that count the crashes they injected. */
export interface CountingFaults extends PhaseFaults {
  /** How many crashes were injected so far. */
  readonly fired: number;
}

function matches(info: CrashInfo, point: CrashPointName, phase?: string, key?: string): boolean {
  return (
    info.point === point &&
    (phase === undefined || info.phase === phase) &&
    (key === undefined || info.key === key)
  );
}

/** Crash at `point` (of `phase`, of `key`, if given), the first `times` times it is reached (default 1). */
export function crashAt(
  point: CrashPointName,
  options: { phase?: string; key?: string; times?: number } = {},
): CountingFaults {
  let left = options.times ?? 1;
  let fired = 0;
  return {
    get fired() {
      return fired;
    },
    at(info) {
      if (left > 0 && matches(info, point, options.phase, options.key)) {
        left--;
        fired++;
        return true;
      }
      return false;
    },
  };
}

/** Crash at every reached point with probability `rate`, drawn from a generator seeded with `seed`. */
export function randomCrashes(options: {
  seed: number;
  rate: number;
  /** Only these points. Default: all the runner's named points. */
  points?: readonly CrashPointName[];
}): CountingFaults {
  const rng = createRng(options.seed);
  const points = options.points ? new Set(options.points) : undefined;
  let fired = 0;
  return {
    get fired() {
      return fired;
    },
    at(info) {
      if (points && !points.has(info.point)) return false;
      if (!rng.chance(options.rate)) return false;
      fired++;
      return true;
    },
  };
}

/**
 * Stall at `point` (of `phase`, of `key`) until `release()` is called: a worker that is merely slow
 * (a long GC pause, a frozen VM). `reached` resolves when the worker gets there.
 */
export function pauseAt(
  point: CrashPointName,
  options: { phase?: string; key?: string } = {},
): PhaseFaults & { reached: Promise<void>; release(): void } {
  let arrive!: () => void;
  let release!: () => void;
  const reached = new Promise<void>((r) => {
    arrive = r;
  });
  const gate = new Promise<void>((r) => {
    release = r;
  });
  let used = false;
  return {
    reached,
    release,
    async at(info) {
      if (used || !matches(info, point, options.phase, options.key)) return false;
      used = true;
      arrive();
      await gate;
      return false;
    },
  };
}
