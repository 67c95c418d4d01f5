/**
 * The invariants idem verify checks after a run, each one a function of what was sent, what the
 * server answered (through the proxy, dropped replies included) and how many effects were counted.
 */
import { isCheckedProblem, problemFieldsError, type SeenAnswer } from "./fields.ts";
import type { Exchange } from "./proxy.ts";
import { type Answer, type IntentRun, isRetryable } from "./run.ts";

/** The ways an API can break idempotency that `verify` checks. */
export const ViolationKind = {
  /** A succeeded (or unresolved) intent caused more than one effect. */
  doubleEffect: "double-effect",
  /** An intent answered with success caused no effect. */
  missingEffect: "missing-effect",
  /** A rejected intent, or a changed-body request, caused an effect. */
  effectOfRejected: "effect-of-rejected",
  /** One key, one request, different final answers (status or body bytes). */
  replayMismatch: "replay-mismatch",
  /** The same key with a changed body was not answered 422. */
  changedBodyAccepted: "changed-body-accepted",
  /** The key still answered 409 after the lease had passed. */
  stuckInFlight: "stuck-in-flight",
  /** A second account's request with the same key did not get a fresh answer of its own. */
  crossAccount: "cross-account",
  /** The intent never got a final answer. */
  unresolved: "unresolved",
  /**
   * A problem answer (4xx/5xx problem+json, or the answer to the request sent without its key) lacks
   * the contract's operation_state, retry_same_key, safe_new_key, or a 409 in flight says not to retry.
   */
  problemFields: "problem-fields",
  /** No intent succeeded, so nothing was really checked (wrong credentials, path or body?). */
  noSuccess: "no-success",
} as const;
/** One of the values of {@link ViolationKind}. */
export type ViolationKind = (typeof ViolationKind)[keyof typeof ViolationKind];

/** One broken invariant, with the intent it was seen in. */
export interface Violation {
  /** Which invariant. */
  kind: ViolationKind;
  /** The intent's number, or -1 for the whole run. */
  intent: number;
  /** The idempotency key the intent used. */
  key: string;
  /** What was seen, for a person. */
  message: string;
}

/** One row of the summary table. */
export interface CheckResult {
  /** The check's name. */
  name: string;
  /** The violations it looks for. */
  kinds: ViolationKind[];
  /** How many intents or probes the check looked at (0: not checked). */
  checked: number;
  /** Violations it found. */
  violations: number;
}

/** Effects counted per intent, after minus before. */
export interface EffectCounts {
  /** Effects of the intent's own request. */
  original: number;
  /** Effects of the same key with a changed body (must be 0), when that probe ran. */
  mismatch?: number;
}

function short(text: string, max = 120): string {
  const t = text.replace(/\s+/g, " ").trim();
  return t.length > max ? `${t.slice(0, max - 1)}…` : t;
}

function show(a: Pick<Answer, "status" | "body" | "error">): string {
  if (a.status === 0) return `no answer (${a.error ?? "network error"})`;
  return `${a.status} ${short(a.body, 80)}`;
}

/**
 * @param runs the intents as run
 * @param exchanges what the server answered per key through the proxy (original requests only)
 * @param effects per intent (same order as `runs`), or undefined when effects were not counted
 * @param withoutKey the answer to the request sent without its key, if one came
 */
export function checkInvariants(
  runs: readonly IntentRun[],
  exchanges: (key: string) => Exchange[],
  effects: readonly EffectCounts[] | undefined,
  withoutKey?: Answer,
): { checks: CheckResult[]; violations: Violation[] } {
  const violations: Violation[] = [];
  const add = (run: IntentRun | undefined, kind: ViolationKind, message: string) =>
    violations.push({ kind, intent: run?.plan.n ?? -1, key: run?.key ?? "", message });
  const checked: Record<string, number> = {};
  const seen = (name: string) => {
    checked[name] = (checked[name] ?? 0) + 1;
  };

  runs.forEach((run, i) => {
    // Every intent gets a final answer.
    seen("final");
    if (run.outcome === "unresolved") {
      const last = run.answers[run.answers.length - 1];
      add(run, ViolationKind.unresolved, `no final answer; last: ${last ? show(last) : "nothing sent"}`);
    }

    // One key, one request: every final answer the server gave is the same, byte for byte.
    const finals: Pick<Answer, "status" | "body" | "label">[] = [
      ...exchanges(run.key)
        .filter((e) => !isRetryable(e.status))
        .map((e) => ({ status: e.status, body: e.body, label: `server (${e.fate})` })),
      ...run.answers.filter((a) => !isRetryable(a.status)),
    ];
    if (finals.length >= 2) {
      seen("replay");
      const first = finals[0]!;
      const other = finals.find((a) => a.status !== first.status || a.body !== first.body);
      if (other) {
        const distinct = new Set(finals.map((a) => `${a.status} ${a.body}`)).size;
        add(
          run,
          ViolationKind.replayMismatch,
          `${distinct} different answers for one request: ${show(first)} / ${show(other)}`,
        );
      }
    }

    // Same key, changed body: 422, and (below) no effect.
    if (run.mismatch) {
      seen("mismatch");
      if (run.mismatch.status !== 422) {
        const how =
          run.mismatch.status >= 200 && run.mismatch.status < 300 && run.mismatch.body === run.final?.body
            ? "the original answer was replayed for a different request"
            : run.mismatch.status >= 200 && run.mismatch.status < 300
              ? "it ran as a new request under a used key"
              : "expected 422";
        add(run, ViolationKind.changedBodyAccepted, `changed body got ${show(run.mismatch)}: ${how}`);
      }
    }

    // Same key from another account: its own fresh answer, never one the first account got.
    if (run.scope) {
      seen("scope");
      const firstAccountBodies = new Set([
        ...exchanges(run.key).map((e) => e.body),
        ...run.answers.filter((a) => a.status !== 0).map((a) => a.body),
      ]);
      const s = run.scope;
      const ok = s.status >= 200 && s.status < 300;
      if (!ok) {
        add(
          run,
          ViolationKind.crossAccount,
          `a second account's request with this key got ${show(s)}: keys must be scoped by account`,
        );
      } else if (s.replayed || firstAccountBodies.has(s.body)) {
        add(
          run,
          ViolationKind.crossAccount,
          `a second account's request with this key was answered with the first account's reply: ${short(s.body, 80)}`,
        );
      }
    }

    // Problem answers carry the contract's fields: what the server sent through the proxy, and the
    // probes sent straight to the API. One violation per intent, naming the first bad answer.
    const problems: SeenAnswer[] = [
      ...exchanges(run.key).filter((e) => e.status > 0),
      ...[run.mismatch, run.scope].filter((a): a is Answer => a !== undefined && a.status > 0),
    ].filter((a) => isCheckedProblem(a));
    const errors = problems.map(problemFieldsError).filter((e) => e !== undefined);
    for (const _ of problems) seen("fields");
    if (errors.length) {
      const more = errors.length > 1 ? ` (and ${errors.length - 1} more answers)` : "";
      add(run, ViolationKind.problemFields, `${errors[0]}${more}`);
    }

    // No key stuck in flight.
    seen("stuck");
    if (run.stuckMs !== undefined) {
      add(
        run,
        ViolationKind.stuckInFlight,
        `still 409 after ${(run.stuckMs / 1000).toFixed(1)} s (the lease)`,
      );
    }

    // Effects.
    const e = effects?.[i];
    if (!e) return;
    if (run.outcome === "succeeded") {
      seen("effects");
      if (e.original > 1)
        add(run, ViolationKind.doubleEffect, `${e.original} effects for one succeeded intent`);
      if (e.original < 1) {
        add(run, ViolationKind.missingEffect, `answered ${run.final?.status} but no effect was counted`);
      }
    } else if (run.outcome === "rejected") {
      seen("rejected");
      if (e.original > 0) {
        add(
          run,
          ViolationKind.effectOfRejected,
          `${e.original} effect(s) for an intent answered ${run.final?.status}`,
        );
      }
    } else if (e.original > 1) {
      add(run, ViolationKind.doubleEffect, `${e.original} effects for one intent (never answered)`);
    }
    if (run.mismatch && e.mismatch !== undefined) {
      seen("rejected");
      if (e.mismatch > 0) {
        add(
          run,
          ViolationKind.effectOfRejected,
          `${e.mismatch} effect(s) for the changed-body request (answered ${run.mismatch.status})`,
        );
      }
    }
  });

  if (withoutKey && isCheckedProblem(withoutKey, true)) {
    seen("fields");
    const error = problemFieldsError(withoutKey);
    if (error) add(undefined, ViolationKind.problemFields, `the request without its key: ${error}`);
  }

  if (runs.length > 0 && !runs.some((r) => r.outcome === "succeeded")) {
    const first = runs[0]!.final ?? runs[0]!.answers[0];
    add(
      undefined,
      ViolationKind.noSuccess,
      `no intent succeeded (first answer: ${first ? show(first) : "none"}), so nothing was really checked: fix the URL, path, body or credentials`,
    );
  }

  const count = (kinds: ViolationKind[]) => violations.filter((v) => kinds.includes(v.kind)).length;
  const row = (name: string, key: string, kinds: ViolationKind[]): CheckResult => ({
    name,
    kinds,
    checked: checked[key] ?? 0,
    violations: count(kinds),
  });
  const checks = [
    row("one effect per succeeded intent", "effects", [
      ViolationKind.doubleEffect,
      ViolationKind.missingEffect,
    ]),
    row("no effect for rejected requests", "rejected", [ViolationKind.effectOfRejected]),
    row("identical answers for one key", "replay", [ViolationKind.replayMismatch]),
    row("422 for a changed body", "mismatch", [ViolationKind.changedBodyAccepted]),
    row("keys scoped by account", "scope", [ViolationKind.crossAccount]),
    row("no key stuck in 409 past the lease", "stuck", [ViolationKind.stuckInFlight]),
    row("problems say what the client may do next", "fields", [ViolationKind.problemFields]),
    row("a final answer for every intent", "final", [ViolationKind.unresolved, ViolationKind.noSuccess]),
  ];
  return { checks, violations };
}
