/**
 * Executes the planned intents against the API, a bounded number at a time, and records every answer.
 *
 * One intent, in order:
 *   1. its delivery: once, twice in a row, `copies` times at once, with the first reply dropped by
 *      the proxy, or with the first reply held past the client's per-try timeout. Sent through the
 *      fault proxy by idem's own retrying client (network errors, timeouts, 409 and 5xx retried).
 *   2. the probes planned for it, straight to the API: the same key with a changed body; the same
 *      key from a second account with a body of its own.
 *   3. a last replay of the original request, through the proxy; a 409 is retried until the lease
 *      has passed, so a key stuck in flight is told from one that is merely busy.
 */
import { randomUUID } from "node:crypto";
import { createClient, type IdemClient } from "../../client/index.ts";
import type { IntentPlan } from "./plan.ts";
import type { FaultProxy } from "./proxy.ts";
import { type RenderedRequest, type RequestTemplate, renderRequest, type TemplateVars } from "./template.ts";

/** One answer as the sender saw it. */
export interface Answer {
  /** Which send: `first`, `copy 2`, `duplicate`, `retry`, `changed body`, `second account`, `replay`. */
  label: string;
  /** 0 when no response came (network error or timeout on every attempt). */
  status: number;
  body: string;
  replayed: boolean;
  /** The answer's `content-type`, when it had one. */
  contentType?: string;
  /** Why no response came. */
  error?: string;
}

export type VerifyOutcome = "succeeded" | "rejected" | "unresolved";

export interface IntentRun {
  plan: IntentPlan;
  key: string;
  vars: TemplateVars;
  /** Values of the changed-body probe (planned only). */
  mismatchVars?: TemplateVars;
  /** Values of the second account's request (planned only). */
  scopeVars?: TemplateVars;
  /** Answers to the original request: its delivery, then the last replay. */
  answers: Answer[];
  mismatch?: Answer;
  scope?: Answer;
  /** Milliseconds the last replay kept answering 409 (set only when it never stopped). */
  stuckMs?: number;
  /** The first final answer to the original request, if any. */
  final?: Answer;
  outcome: VerifyOutcome;
}

/** The values one intent and its probes are rendered with, drawn before anything is sent. */
export interface IntentValues {
  vars: TemplateVars;
  mismatchVars?: TemplateVars;
  scopeVars?: TemplateVars;
}

/**
 * Keys and values for every planned intent: a fresh random key and UUIDs; amounts `amountBase + n`,
 * `+ intents` for the changed-body probe, `+ 2 * intents` for the second account's request.
 */
export function drawValues(plans: readonly IntentPlan[], amountBase: number): IntentValues[] {
  const n = plans.length;
  return plans.map((plan) => {
    const key = randomUUID();
    const v: IntentValues = { vars: { n: plan.n, key, uuid: randomUUID(), amount: amountBase + plan.n } };
    if (plan.mismatch)
      v.mismatchVars = { n: plan.n, key, uuid: randomUUID(), amount: amountBase + n + plan.n };
    if (plan.scope) v.scopeVars = { n: plan.n, key, uuid: randomUUID(), amount: amountBase + 2 * n + plan.n };
    return v;
  });
}

export interface RunOptions {
  /** Base URL of the API (probes go here directly). */
  url: string;
  proxy: FaultProxy;
  template: RequestTemplate;
  plans: IntentPlan[];
  /** From {@link drawValues}, one per plan. */
  values: IntentValues[];
  /** Credential headers of the account the intents run as. */
  auth: Record<string, string>;
  /** Credential headers of a second account (scope probes). */
  secondAuth?: Record<string, string>;
  keyHeader: string;
  concurrency: number;
  copies: number;
  timeoutMs: number;
  requestTimeoutMs: number;
  leaseMs: number;
  onIntentDone?: (run: IntentRun) => void;
  signal?: AbortSignal;
}

/** Statuses that are not an answer yet: the same request may get another one later. */
export function isRetryable(status: number): boolean {
  return (
    status === 0 || status === 408 || status === 409 || status === 425 || status === 429 || status >= 500
  );
}

function describeError(err: unknown): string {
  const e = err as { message?: string; cause?: { code?: string; message?: string } };
  const cause = e?.cause?.code ?? e?.cause?.message;
  return `${e?.message ?? String(err)}${cause ? ` (${cause})` : ""}`;
}

async function toAnswer(label: string, res: Response): Promise<Answer> {
  let body = "";
  try {
    body = await res.text();
  } catch (err) {
    return { label, status: res.status, body: "", replayed: false, error: describeError(err) };
  }
  return {
    label,
    status: res.status,
    body,
    replayed: (res.headers.get("idempotent-replayed") ?? "").toLowerCase() === "true",
    contentType: res.headers.get("content-type") ?? undefined,
  };
}

/**
 * The key-missing probe: the request once, straight to the API, without the key header, so that a
 * route that requires a key answers its idempotency problem (checked for the contract's fields). A
 * route where the key is optional runs it: one effect, outside the counted markers. Undefined when the
 * template itself puts the key somewhere, or no answer came.
 */
export async function sendWithoutKey(
  options: Pick<RunOptions, "url" | "template" | "auth" | "requestTimeoutMs" | "signal">,
  vars: TemplateVars,
): Promise<Answer | undefined> {
  const t = options.template;
  if ([t.path, t.body ?? "", ...Object.values(t.headers ?? {})].some((s) => s.includes("{{key}}"))) return;
  const req = renderRequest(t, vars);
  try {
    const res = await fetch(new URL(req.path, options.url), {
      method: req.method,
      headers: { ...req.headers, ...options.auth },
      body: req.body ?? null,
      signal: options.signal
        ? AbortSignal.any([options.signal, AbortSignal.timeout(options.requestTimeoutMs)])
        : AbortSignal.timeout(options.requestTimeoutMs),
    });
    return await toAnswer("without key", res);
  } catch {
    return undefined;
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    });
  });
}

export async function runIntents(options: RunOptions): Promise<IntentRun[]> {
  const n = options.plans.length;
  const clientFor = (baseUrl: string): IdemClient =>
    createClient({
      baseUrl,
      keyHeader: options.keyHeader,
      budget: false, // every retry here is deliberate
      breaker: false, // the faults would open it
      giveUpWith: "response",
      deadlineMs: options.leaseMs + options.requestTimeoutMs, // room for a 409 to clear
      perTryTimeoutMs: options.requestTimeoutMs,
      maxAttempts: 8,
      retry: { baseMs: 50, capMs: 1_000 },
    });
  const viaProxy = clientFor(options.proxy.url);
  const direct = clientFor(options.url);

  let calls = 0;
  /** One call of idem's client: retries until a final answer, or gives up. */
  async function call(
    client: IdemClient,
    label: string,
    key: string,
    req: RenderedRequest,
    auth: Record<string, string>,
    extra: { perTryTimeoutMs?: number; maxAttempts?: number } = {},
  ): Promise<Answer> {
    try {
      const intent = await client.intent(`${key}.${++calls}`, { key });
      const res = await client.request(intent, req.path, {
        method: req.method,
        headers: { ...req.headers, ...auth },
        body: req.body ?? null,
        ...extra,
        signal: options.signal ?? null,
      });
      return await toAnswer(label, res);
    } catch (err) {
      const last = (err as { lastResponse?: Response }).lastResponse;
      if (last) return toAnswer(label, last);
      return { label, status: 0, body: "", replayed: false, error: describeError(err) };
    }
  }

  /** The last replay: one plain request; a 409 (or no answer) is retried until the lease has passed. */
  async function replay(key: string, req: RenderedRequest, run: IntentRun): Promise<Answer> {
    let busySince: number | undefined;
    for (;;) {
      let answer: Answer;
      try {
        const res = await fetch(new URL(req.path, options.proxy.url), {
          method: req.method,
          headers: { ...req.headers, ...options.auth, [options.keyHeader]: key },
          body: req.body ?? null,
          signal: AbortSignal.timeout(options.requestTimeoutMs),
        });
        answer = await toAnswer("replay", res);
      } catch (err) {
        answer = { label: "replay", status: 0, body: "", replayed: false, error: describeError(err) };
      }
      if (!isRetryable(answer.status) || options.signal?.aborted) return answer;
      busySince ??= Date.now();
      const waited = Date.now() - busySince;
      if (waited >= options.leaseMs) {
        if (answer.status === 409) run.stuckMs = waited;
        return answer;
      }
      await sleep(Math.min(250, options.leaseMs - waited), options.signal);
    }
  }

  async function runOne(plan: IntentPlan, values: IntentValues): Promise<IntentRun> {
    const { vars } = values;
    const key = vars.key;
    const req = renderRequest(options.template, vars);
    const run: IntentRun = { plan, key, vars, answers: [], outcome: "unresolved" };
    const send = (label: string, extra?: { perTryTimeoutMs?: number; maxAttempts?: number }) =>
      call(viaProxy, label, key, req, options.auth, extra);

    switch (plan.delivery) {
      case "once":
        run.answers.push(await send("first"));
        break;
      case "duplicate":
        run.answers.push(await send("first"));
        run.answers.push(await send("duplicate"));
        break;
      case "concurrent":
        run.answers.push(
          ...(await Promise.all(
            Array.from({ length: options.copies }, (_, i) => send(i === 0 ? "first" : `copy ${i + 1}`)),
          )),
        );
        break;
      case "drop":
        options.proxy.inject(key, "drop");
        run.answers.push(await send("first"));
        break;
      case "timeout":
        // One attempt with a short per-try timeout (the proxy holds its reply until the client gives
        // up), then the caller's retry with the usual timeout: a slow retry must not time out too.
        options.proxy.inject(key, "hold");
        run.answers.push(await send("first", { perTryTimeoutMs: options.timeoutMs, maxAttempts: 1 }));
        run.answers.push(await send("retry"));
        break;
    }

    if (plan.mismatch && values.mismatchVars) {
      run.mismatchVars = values.mismatchVars;
      const changed = renderRequest(options.template, run.mismatchVars);
      run.mismatch = await call(direct, "changed body", key, changed, options.auth);
    }
    if (plan.scope && values.scopeVars && options.secondAuth) {
      run.scopeVars = values.scopeVars;
      const theirs = renderRequest(options.template, run.scopeVars);
      run.scope = await call(direct, "second account", key, theirs, options.secondAuth);
    }
    run.answers.push(await replay(key, req, run));

    run.final = run.answers.find((a) => !isRetryable(a.status));
    run.outcome = !run.final ? "unresolved" : run.final.status < 400 ? "succeeded" : "rejected";
    return run;
  }

  const runs: IntentRun[] = new Array(n);
  let next = 0;
  const worker = async () => {
    while (next < n && !options.signal?.aborted) {
      const i = next++;
      const r = await runOne(options.plans[i]!, options.values[i]!);
      runs[i] = r;
      options.onIntentDone?.(r);
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(options.concurrency, n)) }, worker));
  return runs.filter(Boolean);
}
