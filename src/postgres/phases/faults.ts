/** Crash points of a phases runner, for fault-injection tests (see `idem/testing`). */

/** Where the runner asks the fault hooks (tests) whether to crash. `ctx.crash(name)` adds custom ones. */
export type CrashPointName =
  | "after-claim"
  | "before-phase"
  | "after-external"
  | "before-commit"
  | "after-commit"
  | (string & {});

/** Where a runner is when it asks its fault hooks (`PhaseFaults.at`). */
export interface CrashInfo {
  /** The crash point. */
  point: CrashPointName;
  /** The phase being run (or about to run). */
  phase: string;
  /** The key's scope. */
  scope: string;
  /** The idempotency key. */
  key: string;
}

/**
 * Fault injection for tests (see `idem/testing`). `at` is asked at every named point; resolve `true` to
 * "crash" there: the runner throws `SimulatedCrashError` and, like a dead process, frees nothing (the
 * lease has to expire). It may also wait, to model a worker that stalls.
 */
export interface PhaseFaults {
  /** Asked at every crash point: `true` crashes there. */
  at(info: CrashInfo): boolean | Promise<boolean>;
}

/** Thrown at a crash point chosen by `faults`. Never thrown in production (no `faults`, no crash). */
export class SimulatedCrashError extends Error {
  /** Always `"SimulatedCrashError"`: the name logs and stack traces show. */
  override name = "SimulatedCrashError";
  /** Where it crashed. */
  readonly info: CrashInfo;
  constructor(info: CrashInfo) {
    super(`simulated crash at ${info.point} (phase ${info.phase})`);
    this.info = info;
  }
}

/** Ask `faults` at a point; throws `SimulatedCrashError` when it says crash. Free without `faults`. */
export async function crashPoint(faults: PhaseFaults | undefined, info: CrashInfo): Promise<void> {
  if (faults === undefined) return;
  if (await faults.at(info)) throw new SimulatedCrashError(info);
}
