/**
 * The operation lookup, `GET /v1/operations/{operation_ref}`: a client whose reply was lost asks what
 * became of its operation by the reference every keyed answer carries (`Idempotency-Operation-Ref`, and
 * `operation_ref` in problems), without sending the request again. A framework-free handler
 * (`Request` in, `Response` out, Fetch API globals only), so any adapter mounts it in a line:
 *
 *   const lookup = operationLookup({ read: operationReader(store), scope: (req) => accountOf(req) });
 *   // Hono:     app.get("/v1/operations/:ref", (c) => lookup(c.req.raw, c));
 *   // Next.js:  export const GET = lookup;
 *
 * What it answers (docs/contract.md, "Looking an operation up"):
 *   - a finished operation: its saved answer exactly as a replay gives it (the saved status, headers and
 *     body bytes, `Idempotent-Replayed: true`, `Idempotency-Expires`), re-authorized like a replay
 *     (`authorizeReplay`: 401 when refused);
 *   - an unfinished one (or one in review): 200 `application/json` with `operation_state`
 *     (`in_progress`, `uncertain`) and its timestamps; `?wait=SECONDS` holds the request (at most
 *     `maxWaitSeconds`) until it finishes;
 *   - by key: `GET /v1/operations` with the request's `Idempotency-Key` instead of a reference (a
 *     client whose reply was lost never saw the reference): the caller's live claim of that key;
 *   - 404, the same bytes after the same one read, for a reference that is malformed, forged, altered,
 *     another caller's, unknown, expired or of an older claim of the key: it is no oracle for other
 *     accounts' keys, nor for which references are real. The scope comes from authentication, never
 *     from the reference; references are sealed (core/operation-ref.ts), and nothing that does not
 *     open reaches the database.
 */
import {
  EXPIRES_HEADER,
  errorResponse,
  isDatabaseUnavailable,
  OPERATION_REF_HEADER,
  OPERATION_STATE_HEADER,
  type OperationReader,
  type OperationRecord,
  type OperationRefCodec,
  type OperationState,
  parseIdempotencyKey,
  problemResponse,
  REPLAYED_HEADER,
  refsOf,
  type StoredResponse,
  storedValueError,
} from "../core/index.ts";

/** Options of the operation lookup route (`GET /v1/operations/{ref}`). */
export interface OperationLookupOptions<C = unknown> {
  /** Reads an operation by (scope, key): `operationReader(store)` from `idem/postgres`. Required. */
  read: OperationReader;
  /** The caller's scope (their account id), from authentication: the same as the keyed routes'. Required. */
  scope: (request: Request, context: C) => string | undefined | Promise<string | undefined>;
  /**
   * The keyed routes' replay check (`authorizeReplay`): run before a saved answer is given. Refused:
   * 401, as a replay would be. Default: none (authentication alone).
   */
  authorizeReplay?: (request: Request, context: C) => boolean | Promise<boolean>;
  /**
   * The reference from the request. Default: the last segment of the URL's path
   * (`/v1/operations/op_...`). A request without one that sends `Idempotency-Key` looks up the
   * caller's live claim of that key (`GET /v1/operations` with the key, as a client that lost the
   * reply, and with it the reference, asks).
   */
  ref?: (request: Request, context: C) => string | undefined;
  /**
   * Opens the caller's reference: the store's (`store.refs`). Default: `read.refs`, which
   * `operationReader(store)` sets.
   */
  refs?: OperationRefCodec;
  /** The longest `?wait=` honoured, in seconds (a longer one is cut to it). Default: 20. */
  maxWaitSeconds?: number;
  /**
   * The reply of a finished key saved in compact form (`compact` routes), from its status and resource
   * id. Without it such a key is answered as JSON: its state and `status`, not the reply.
   */
  rebuild?: (saved: { status: number; id: string }) => StoredResponse | Promise<StoredResponse>;
}

/** The longest a lookup's long poll waits for the operation to finish, by default, in seconds. */
export const DEFAULT_MAX_WAIT_SECONDS = 20;
/** How often a long poll reads the operation again: from the first value, doubling up to the second. */
const POLL_MS: [number, number] = [50, 500];

/** What an unknown reference is looked up as: a valid key, never matched (`owned` is false). */
const MISS_KEY = "idem-lookup-miss";

const NOT_FOUND = () =>
  problemResponse(
    404,
    "operation-not-found",
    "No operation of yours has this reference (unknown, expired, or not yours).",
  );

/** Build the lookup handler. */
export function operationLookup<C = unknown>(
  options: OperationLookupOptions<C>,
): (request: Request, context: C) => Promise<Response> {
  const maxWait = Math.max(0, options.maxWaitSeconds ?? DEFAULT_MAX_WAIT_SECONDS);
  const refs = options.refs ?? options.read.refs ?? refsOf(undefined);
  return async function lookupOperation(request, context) {
    const url = new URL(request.url);
    const waitParam = url.searchParams.get("wait");
    const waitS = waitParam === null || waitParam === "" ? 0 : Number(waitParam);
    if (!Number.isFinite(waitS) || waitS < 0) {
      return send(problemResponse(400, "bad-request", "`wait` is a number of seconds, 0 or more."), request);
    }
    const scope = await options.scope(request, context);
    if (scope === undefined) {
      return send(problemResponse(401, "unauthorized", "Authenticate to look an operation up."), request);
    }
    const raw = options.ref ? options.ref(request, context) : lastSegment(url.pathname);
    // A reference (op_...) is opened and nothing else; without one, the caller's key.
    const given = raw?.startsWith("op_") === true;
    let ref = given ? refs.decode(raw!) : undefined;
    if (!given) {
      // No reference: the caller's own key (`Idempotency-Key`), for a client whose reply was lost
      // before it saw one. The scope is the caller's, so it names nothing of anyone else's.
      let key: string | undefined;
      try {
        key = parseIdempotencyKey(request.headers.get("idempotency-key"));
      } catch {
        key = undefined;
      }
      if (key !== undefined) ref = { scope, key };
    }
    // Another scope's reference, and one that does not open, are read like an unknown one (a key of
    // the caller's own scope that the key rules allow), so that neither the answer nor its timing
    // tells them apart.
    const owned = ref !== undefined && ref.scope === scope;
    const key = owned ? ref!.key : MISS_KEY;
    const matches = (op: OperationRecord | undefined): op is OperationRecord =>
      op !== undefined && owned && (ref!.claimId === undefined || ref!.claimId === op.claimId);
    try {
      const deadline = Date.now() + Math.min(waitS, maxWait) * 1000;
      let op = await options.read(scope, key);
      for (let pause = POLL_MS[0]; matches(op) && op.state === "in_progress"; pause *= 2) {
        const left = deadline - Date.now();
        if (left <= 0 || request.signal?.aborted) break;
        await new Promise((r) => setTimeout(r, Math.min(left, pause, POLL_MS[1])));
        op = await options.read(scope, key);
      }
      if (!matches(op)) return send(NOT_FOUND(), request);
      const named = refs.encode(scope, key, op.claimId);
      return send(await answerOf(op, named, request, context, options), request);
    } catch (err) {
      // A saved answer that cannot be opened or used: as the keyed route answers it (stored-errors.ts).
      const stored = storedValueError(err);
      if (stored)
        return send(errorResponse(stored, { ref: refs.encode(scope, key), claimed: true }), request);
      if (!isDatabaseUnavailable(err)) throw err;
      return send(
        problemResponse(503, "database-unavailable", "The database is unavailable; ask again.", {
          headers: [["retry-after", "1"]],
        }),
        request,
      );
    }
  };
}

async function answerOf<C>(
  op: OperationRecord,
  ref: string,
  request: Request,
  context: C,
  options: OperationLookupOptions<C>,
): Promise<StoredResponse> {
  const answer = op.answer;
  if (answer && (answer.kind === "reply" || options.rebuild)) {
    if (options.authorizeReplay && !(await options.authorizeReplay(request, context))) {
      return problemResponse(
        401,
        "unauthorized",
        "You may no longer see the answer saved under this Idempotency-Key.",
      );
    }
    const r = answer.kind === "reply" ? answer.response : await options.rebuild!(answer.saved);
    const headers: Array<[string, string]> = [
      ...r.headers,
      [REPLAYED_HEADER, "true"],
      [EXPIRES_HEADER, op.expiresAt.toUTCString()],
      [OPERATION_REF_HEADER, ref],
    ];
    const state = finalState(answer.kind === "reply" ? r.status : answer.saved.status);
    if (!headers.some(([name]) => name.toLowerCase() === OPERATION_STATE_HEADER)) {
      headers.push([OPERATION_STATE_HEADER, state]);
    }
    return { status: r.status, headers, body: r.body };
  }
  const state: OperationState =
    op.state === "needs_review" ? "uncertain" : op.state === "done" ? "done" : "in_progress";
  const doc: Record<string, unknown> = {
    operation_ref: ref,
    operation_state: state,
    created_at: op.createdAt.toISOString(),
    updated_at: op.updatedAt?.toISOString() ?? null,
    expires_at: op.expiresAt.toISOString(),
  };
  if (answer?.kind === "compact") doc.status = answer.saved.status;
  const headers: Array<[string, string]> = [
    ["content-type", "application/json"],
    [OPERATION_STATE_HEADER, state],
    [OPERATION_REF_HEADER, ref],
  ];
  if (state === "in_progress") headers.push(["retry-after", "1"]);
  return { status: 200, headers, body: new TextEncoder().encode(JSON.stringify(doc)) };
}

/** A saved 4xx changed nothing (docs/contract.md); anything else saved is done. */
function finalState(status: number): OperationState {
  return status >= 400 && status < 500 ? "failed_not_applied" : "done";
}

function lastSegment(pathname: string): string | undefined {
  const last = pathname.split("/").filter(Boolean).pop();
  if (last === undefined) return undefined;
  try {
    return decodeURIComponent(last);
  } catch {
    return undefined;
  }
}

/** The response to send; never cached (the state changes), HEAD without a body. */
function send(r: StoredResponse, request: Request): Response {
  const headers = new Headers();
  for (const [name, value] of r.headers) headers.append(name, value);
  headers.set("cache-control", "no-store");
  const body = request.method === "HEAD" || r.body.length === 0 ? null : (r.body as BodyInit);
  return new Response(body, { status: r.status, headers });
}
