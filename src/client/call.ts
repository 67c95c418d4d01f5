/**
 * One call: what it sends (headers lower-cased, body replayable) and where it stands, plus turning
 * a fetch-style `init` into one. A class, so that every call has the same shape and the attempt loop
 * keeps its state here rather than in closures.
 */
import type { ServerAnswer } from "./answer.ts";
import { type ReplayableBody, toReplayable } from "./body.ts";
import type { GiveUpDetails } from "./errors.ts";
import type { CallInfo } from "./events.ts";
import type { HeaderMap } from "./headers.ts";
import type { IntentRecord } from "./intent-store.ts";
import type { CallOptions, RequestOptions } from "./options.ts";

export class Call {
  intentId: string | undefined = undefined;
  key: string | undefined = undefined;
  record: IntentRecord | undefined = undefined;
  /** Attempts sent by this call. */
  attempts = 0;
  /** Attempts this call has counted in its intent's record (counted before each is sent). */
  counted = 0;
  lastResponse: Response | undefined = undefined;
  lastError: unknown = undefined;
  /** What the last response said about the operation (non-2xx responses only). */
  lastAnswer: ServerAnswer | undefined = undefined;
  readonly method: string;
  readonly url: string;
  headers: HeaderMap;
  readonly body: ReplayableBody | undefined;
  /** The caller's other fetch init fields (credentials, redirect...), when there are any. */
  readonly init: RequestInit | undefined;
  readonly options: CallOptions;

  constructor(
    method: string,
    url: string,
    headers: HeaderMap,
    body: ReplayableBody | undefined,
    init: RequestInit | undefined,
    options: CallOptions,
  ) {
    this.method = method;
    this.url = url;
    this.headers = headers;
    this.body = body;
    this.init = init;
    this.options = options;
  }

  /** The call sends this intent's key. */
  attach(record: IntentRecord): void {
    this.record = record;
    this.intentId = record.id;
    this.key = record.key;
  }

  /** What a give-up error says about the call so far. */
  details(): GiveUpDetails {
    const d: GiveUpDetails = { intentId: this.intentId ?? "", key: this.key ?? "", attempts: this.attempts };
    if (this.lastResponse) d.lastResponse = this.lastResponse;
    if (this.lastError !== undefined) d.lastError = this.lastError;
    const a = this.lastAnswer;
    if (a) {
      if (a.operationState !== undefined) d.operationState = a.operationState;
      if (a.safeNewKey !== undefined) d.safeNewKey = a.safeNewKey;
      if (a.operationRef !== undefined) d.operationRef = a.operationRef;
    }
    return d;
  }

  /** What every hook event says about the call (built only when a hook is called). */
  info(): CallInfo {
    const info: CallInfo = { method: this.method, url: this.url };
    if (this.intentId !== undefined) info.intentId = this.intentId;
    if (this.key !== undefined) info.key = this.key;
    return info;
  }
}

export const NO_OPTIONS: RequestOptions & { intent?: unknown } = Object.freeze({});

/** Fields of a call's init that the client handles itself instead of passing to fetch. */
export const OWN_FIELDS: ReadonlySet<string> = new Set([
  "headers",
  "body",
  "method",
  "signal",
  "deadlineMs",
  "perTryTimeoutMs",
  "maxAttempts",
]);
/** The same, for `post()`, whose options also name the intent. */
export const POST_OWN_FIELDS: ReadonlySet<string> = new Set([...OWN_FIELDS, "intent"]);

/**
 * The call for a request: `headers` (a map made for this call, so it may be changed), the body made
 * replayable, the rest of `init` kept for fetch. Synchronous except for a Blob body (read once, here).
 */
export function prepareCall(
  url: string,
  init: RequestOptions,
  method: string,
  headers: HeaderMap,
  body: BodyInit | null | undefined,
  ownFields: ReadonlySet<string>,
): Call | Promise<Call> {
  if (typeof body === "string") return newCall(url, init, method, headers, body, undefined, ownFields);
  const r = toReplayable(body);
  return isPromise(r)
    ? r.then((b) => newCall(url, init, method, headers, b.body, b.contentType, ownFields))
    : newCall(url, init, method, headers, r.body, r.contentType, ownFields);
}

function newCall(
  url: string,
  init: RequestOptions,
  method: string,
  headers: HeaderMap,
  body: ReplayableBody | undefined,
  contentType: string | undefined,
  ownFields: ReadonlySet<string>,
): Call {
  if (contentType) headers["content-type"] ??= contentType;
  return new Call(method, url, headers, body, fetchFields(init, ownFields), callOptions(init));
}

export function methodOf(init: RequestOptions): string {
  return (init.method ?? "GET").toUpperCase();
}

/** The call's own settings, copied (a caller may reuse its init object while the call runs). */
export function callOptions(init: CallOptions): CallOptions {
  const { deadlineMs, perTryTimeoutMs, maxAttempts, signal } = init;
  if (deadlineMs === undefined && perTryTimeoutMs === undefined && maxAttempts === undefined && !signal) {
    return NO_OPTIONS;
  }
  return { deadlineMs, perTryTimeoutMs, maxAttempts, signal };
}

/** The init fields passed on to fetch as they are (undefined when there are none, as usual). */
function fetchFields(init: RequestOptions, ownFields: ReadonlySet<string>): RequestInit | undefined {
  let fields: Record<string, unknown> | undefined;
  for (const name in init) {
    if (!ownFields.has(name) && Object.hasOwn(init, name)) {
      fields ??= {};
      fields[name] = (init as Record<string, unknown>)[name];
    }
  }
  return fields;
}

/** Awaiting a plain value still costs a microtask turn; the success path avoids it. */
export function isPromise<T>(value: T | Promise<T>): value is Promise<T> {
  return value instanceof Promise;
}
