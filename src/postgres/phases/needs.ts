/**
 * What a phase needs in its key's data before it can run (`Phase.needs`, e.g. the provider's charge id
 * for "charged"), checked in two places so that no key is ever left answering 500 for the lack of it:
 *
 *   settling   `settleReview` refuses to resume a key at a phase without what it needs, before anything
 *              changes (`SettlementRefusedError`); the review records each phase's needs when it opens
 *              (the runner's definition is not at hand where a person settles: the CLI, the console)
 *   running    the runner checks the phase's needs before it runs it; a key that lacks them (or is at a
 *              phase its runner does not have) goes back to review: 409 operation-uncertain, for a person
 */

/** Each phase's needs, by phase: what a review records (`reviews.phases`, sql/0018). */
export type PhaseNeeds = Record<string, string[]>;

/** The needs of a runner's phases. */
export function phaseNeeds(phases: Record<string, { needs?: readonly string[] }>): PhaseNeeds {
  return Object.fromEntries(Object.entries(phases).map(([name, p]) => [name, [...(p.needs ?? [])]]));
}

/** The fields of `needs` that `data` lacks (absent, null or empty). */
export function lacking(needs: readonly string[] | undefined, data: Record<string, unknown>): string[] {
  return (needs ?? []).filter((f) => data[f] === undefined || data[f] === null || data[f] === "");
}

/** Why a key at `point` cannot run `phase` (none: the runner has no such phase), or undefined. */
export function notRunnable(
  point: string,
  phase: { needs?: readonly string[] } | undefined,
  data: Record<string, unknown>,
): string | undefined {
  if (!phase) return `"${point}" is not a phase of the key's runner`;
  const missing = lacking(phase.needs, data);
  return missing.length > 0
    ? `"${point}" needs ${missing.join(", ")}, which the key's data lacks`
    : undefined;
}

/**
 * Why resuming at `phase` with `data` (the key's data with the settlement's merged in) cannot work,
 * or undefined when it can. `needs`: the review's record of its runner's phases (null for a review
 * opened before sql/0018: only the phase's name is checked then).
 */
export function resumeProblem(
  needs: PhaseNeeds | null,
  phase: string,
  data: Record<string, unknown>,
): string | undefined {
  if (!phase.trim() || phase === "done") {
    return `"${phase}" is not a phase to resume at: to close the key, settle it with an answer instead`;
  }
  if (!needs) return undefined;
  if (!Object.hasOwn(needs, phase)) {
    return `the runner has no phase "${phase}" (its phases: ${Object.keys(needs).join(", ")})`;
  }
  const missing = lacking(needs[phase], data);
  if (missing.length > 0) {
    return `resuming at "${phase}" needs ${missing.join(", ")} in data (e.g. {"${missing[0]}": "..."} as found at the provider)`;
  }
  return undefined;
}
