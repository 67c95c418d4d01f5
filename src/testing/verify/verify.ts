/**
 * `verify(options)`: point idem's fault machinery at an API and check that it makes each intent's
 * effect happen once. It starts a loopback fault proxy in front of the API, counts effects (a
 * baseline), runs the planned intents, waits for the proxy to drain, counts again and checks the
 * invariants. The API is any HTTP server: it need not use idem.
 */
import { randomInt, randomUUID } from "node:crypto";
import type { EffectCounter } from "./effects.ts";
import { checkInvariants, type EffectCounts, type ViolationKind } from "./invariants.ts";
import { DELIVERIES, FAULTS, PROBES, planIntents, type VerifyFault } from "./plan.ts";
import { startFaultProxy } from "./proxy.ts";
import type { VerifyReport } from "./report.ts";
import { type Answer, drawValues, type IntentRun, runIntents, sendWithoutKey } from "./run.ts";
import {
  type RequestTemplate,
  type TemplateVars,
  unknownPlaceholders,
  usesPlaceholders,
} from "./template.ts";

/** Options of {@link verify}. */
export interface VerifyOptions {
  /** The API's base URL, e.g. `http://127.0.0.1:3000`. Required. */
  url: string;
  /** The request each intent makes; placeholders as in `template.ts`. Required. */
  request: RequestTemplate;
  /** Credential headers of the account the intents run as, e.g. `{ authorization: "Bearer sk_1" }`. */
  auth?: Record<string, string>;
  /** Credential headers of a second account: enables the `scope` probe. Default: none. */
  secondAuth?: Record<string, string>;
  /** How effects are counted (`sqlEffects`, `listEffects`). Default: none (effect checks skipped). */
  effects?: EffectCounter;
  /** Number of intents. Default 40. */
  intents?: number;
  /** Intents in progress at once. Default 8. */
  concurrency?: number;
  /** Seed of the fault plan. Default 1. */
  seed?: number;
  /** Faults to use. Default: all of them (`scope` only with `secondAuth`). */
  faults?: readonly VerifyFault[];
  /** Sends of a `concurrent` intent. Default 3. */
  copies?: number;
  /**
   * The `timeout` fault: the per-try timeout of an intent's first try, whose reply the proxy holds
   * until the client gives up; the retry then has the usual timeout. Default 500 ms.
   */
  timeoutMs?: number;
  /** Per-try timeout of every other request. Default 10,000 ms. */
  requestTimeoutMs?: number;
  /** How long a key may answer 409 before it counts as stuck. Default 10 s. */
  leaseSeconds?: number;
  /** The idempotency key header. Default `Idempotency-Key`. */
  keyHeader?: string;
  /**
   * `{{amount}}` of intent n is `amountBase + n` (its changed-body probe `+ intents`, its second
   * account's request `+ 2 * intents`). Default: a random number from 1,000,000 to 8,999,999, so that
   * two runs do not share amounts.
   */
  amountBase?: number;
  /**
   * Called after each intent with the intents done so far and how many of them already look wrong
   * (no final answer, or a changed body not answered 422); the full checks run at the end.
   */
  onProgress?: (done: number, total: number, suspicious: number) => void;
  /** Stops the run. */
  signal?: AbortSignal;
}

/** `verify` was given options it cannot use (the message says which and why). */
export class VerifyUsageError extends Error {
  /** Always `"VerifyUsageError"`: the name logs and stack traces show. */
  override readonly name = "VerifyUsageError";
}

/** The effect counter failed (a wrong query, URL or path); `cause` is its error. */
export class EffectCountError extends Error {
  /** Always `"EffectCountError"`: the name logs and stack traces show. */
  override readonly name = "EffectCountError";
}

async function countOrThrow(counter: EffectCounter, markers: TemplateVars[]): Promise<number[]> {
  try {
    return await counter.count(markers);
  } catch (err) {
    throw new EffectCountError(`cannot count effects (${counter.describe}): ${(err as Error).message}`, {
      cause: err,
    });
  }
}

/** Check options that a run cannot succeed without; throws {@link VerifyUsageError}. */
export function checkOptions(options: VerifyOptions): Required<Pick<VerifyOptions, "faults">> {
  let url: URL;
  try {
    url = new URL(options.url);
  } catch {
    throw new VerifyUsageError(
      `the API URL ${JSON.stringify(options.url)} is not a URL: write it like http://127.0.0.1:3000`,
    );
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new VerifyUsageError(`the API URL must be http:// or https://, not ${url.protocol}`);
  }
  const t = options.request;
  const texts = [t.path, t.body ?? "", ...Object.values(t.headers ?? {})];
  const unknown = texts.flatMap(unknownPlaceholders);
  if (unknown.length) {
    throw new VerifyUsageError(
      `unknown placeholder {{${unknown[0]}}}: use {{amount}}, {{uuid}}, {{n}} or {{key}}`,
    );
  }
  const faults = options.faults ?? FAULTS.filter((f) => f !== "scope" || options.secondAuth);
  for (const f of faults) {
    if (!(FAULTS as readonly string[]).includes(f)) {
      throw new VerifyUsageError(`unknown fault "${f}": use ${FAULTS.join(", ")}`);
    }
  }
  const variable = usesPlaceholders(t.path) || usesPlaceholders(t.body);
  if ((faults.includes("mismatch") || faults.includes("scope")) && !variable) {
    throw new VerifyUsageError(
      "the mismatch and scope probes change the request through its placeholders: put {{amount}} or {{uuid}} in the body",
    );
  }
  if (faults.includes("scope") && !options.secondAuth) {
    throw new VerifyUsageError("the scope probe needs a second account's credentials (secondAuth)");
  }
  const intents = options.intents ?? 40;
  if (!Number.isInteger(intents) || intents < 1)
    throw new VerifyUsageError("intents must be a whole number >= 1");
  return { faults };
}

/**
 * Check that an API makes each intent's effect happen once under faults (see the module's notes):
 * resolves with the report; `report.ok` is false when an invariant was broken.
 */
export async function verify(options: VerifyOptions): Promise<VerifyReport> {
  const { faults } = checkOptions(options);
  const started = Date.now();
  const intents = options.intents ?? 40;
  const seed = options.seed ?? 1;
  const keyHeader = options.keyHeader ?? "Idempotency-Key";
  const amountBase = options.amountBase ?? randomInt(1_000_000, 9_000_000);
  const leaseMs = (options.leaseSeconds ?? 10) * 1000;
  const timeoutMs = options.timeoutMs ?? 500;
  const plans = planIntents({ intents, faults, seed });

  const values = drawValues(plans, amountBase);
  // Every value is drawn before anything is sent, so effects are counted once before (a baseline,
  // for data already there) and once after; the difference is the run's.
  const markers: TemplateVars[] = values.flatMap((v) =>
    v.mismatchVars ? [v.vars, v.mismatchVars] : [v.vars],
  );
  const counter = options.effects;
  const baseline = counter ? await countOrThrow(counter, markers) : undefined;

  const proxy = await startFaultProxy({ target: options.url, keyHeader, holdMs: timeoutMs + 30_000 });
  let runs: IntentRun[];
  let withoutKey: Answer | undefined;
  let suspicious = 0;
  try {
    let done = 0;
    runs = await runIntents({
      url: options.url,
      proxy,
      template: options.request,
      plans,
      auth: options.auth ?? {},
      secondAuth: options.secondAuth,
      values,
      keyHeader,
      concurrency: options.concurrency ?? 8,
      copies: options.copies ?? 3,
      timeoutMs,
      requestTimeoutMs: options.requestTimeoutMs ?? 10_000,
      leaseMs,
      signal: options.signal,
      onIntentDone(run) {
        done++;
        // A cheap early signal for the progress line: answers that already disagree.
        if (run.outcome === "unresolved" || (run.mismatch && run.mismatch.status !== 422)) suspicious++;
        options.onProgress?.(done, intents, suspicious);
      },
    });
    await proxy.idle();
    // Once the API has answered at all: the request without its key, for its problem's fields.
    if (runs.some((r) => r.answers.some((a) => a.status > 0)) && !options.signal?.aborted) {
      const n = 3 * intents; // an amount no intent or probe uses: its effect, if any, is not counted
      withoutKey = await sendWithoutKey(
        {
          url: options.url,
          template: options.request,
          auth: options.auth ?? {},
          requestTimeoutMs: options.requestTimeoutMs ?? 10_000,
          signal: options.signal,
        },
        { n, key: "", uuid: randomUUID(), amount: amountBase + n },
      );
    }
  } finally {
    await proxy.close();
  }

  let effects: EffectCounts[] | undefined;
  if (counter && baseline) {
    const after = await countOrThrow(counter, markers);
    const diff = (vars: TemplateVars) => {
      const i = markers.indexOf(vars);
      return after[i]! - baseline[i]!;
    };
    effects = runs.map((r) => {
      const v = values[r.plan.n]!;
      const e: EffectCounts = { original: diff(v.vars) };
      if (v.mismatchVars) e.mismatch = diff(v.mismatchVars);
      return e;
    });
  }

  const { checks, violations } = checkInvariants(runs, (key) => proxy.exchanges(key), effects, withoutKey);
  const byKind: Partial<Record<ViolationKind, number>> = {};
  for (const v of violations) byKind[v.kind] = (byKind[v.kind] ?? 0) + 1;
  const faultCounts: VerifyReport["faults"] = {};
  for (const d of ["once", ...DELIVERIES] as const) {
    const count = plans.filter((p) => p.delivery === d).length;
    if (count || faults.includes(d as VerifyFault)) faultCounts[d] = count;
  }
  for (const probe of PROBES) {
    if (faults.includes(probe)) faultCounts[probe] = plans.filter((p) => p[probe]).length;
  }
  const outcomes = { succeeded: 0, rejected: 0, unresolved: 0 };
  for (const r of runs) outcomes[r.outcome]++;
  const method = (options.request.method ?? "POST").toUpperCase();
  return {
    ok: violations.length === 0,
    target: { url: options.url.replace(/\/$/, ""), method, path: options.request.path },
    seed,
    intents: runs.length,
    durationMs: Date.now() - started,
    faults: faultCounts,
    outcomes,
    replies: proxy.stats(),
    effects: {
      counter: counter?.describe ?? null,
      counted: effects ? effects.reduce((s, e) => s + e.original + (e.mismatch ?? 0), 0) : 0,
    },
    checks,
    violationsByKind: byKind,
    violations,
  };
}
