/**
 * The problem answers of the contract (docs/contract.md, issue 21): for each way a request can fail,
 * the status, the problem type and title, what the client may safely do next (`operation_state`,
 * `retry_same_key`, `safe_new_key`, `operation_ref`) and `Retry-After`, over HTTP and through the
 * public `errorResponse`; plus which driver errors mean "the database is unavailable" (503, retry).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  errorResponse,
  FAILED_NOT_APPLIED,
  IdemError,
  isConnectFailure,
  isDatabaseUnavailable,
  isMissingPartition,
  KeyInFlightError,
  KeyMismatchError,
  LeaseLostError,
  OperationUncertainError,
  poolerError,
  problemResponse,
  RetryableError,
  sqlStateOf,
} from "../../src/core/index.ts";
import { type RulesApp, startRulesApp } from "./app.ts";

const dec = new TextDecoder();
const bodyOf = (r: { body: Uint8Array }) => JSON.parse(dec.decode(r.body)) as Record<string, unknown>;
const header = (r: { headers: Array<[string, string]> }, name: string) =>
  r.headers.filter(([n]) => n === name).map(([, v]) => v);

describe("problem answers over HTTP", () => {
  let app: RulesApp;
  beforeAll(async () => {
    app = await startRulesApp({ "/v1": {}, "/optional": { required: false } });
  });
  afterAll(() => app?.close());

  const json = { "content-type": "application/json" };
  async function problem(res: Response) {
    expect(res.headers.get("content-type")).toBe("application/problem+json");
    return {
      status: res.status,
      state: res.headers.get("idempotency-operation-state"),
      body: (await res.json()) as Record<string, unknown>,
    };
  }
  const none = { operation_state: "none", retry_same_key: false, safe_new_key: true };

  it("no key on a route that requires one: 400 key-missing, nothing done, a new key is safe", async () => {
    const p = await problem(await app.send("/v1/p", { body: "{}", headers: json }));
    expect(p.status).toBe(400);
    expect(p.state).toBe("none");
    expect(p.body).toMatchObject({
      type: "urn:idem:problem:idempotency-key-missing",
      title: "Bad Request",
      status: 400,
      ...none,
    });
    expect(p.body.operation_ref).toBeUndefined();
  });

  it("no key on an optional route runs the handler, without saving anything", async () => {
    const before = app.runs();
    expect((await app.send("/optional/p", { body: "{}", headers: json })).status).toBe(201);
    expect((await app.send("/optional/p", { body: "{}", headers: json })).status).toBe(201);
    expect(app.runs()).toBe(before + 2);
  });

  it("a body that is not the JSON it claims, or that can be read two ways: 400, nothing done", async () => {
    const bad = await problem(await app.send("/v1/p", { key: "pb-1", body: "{oops", headers: json }));
    expect(bad.body).toMatchObject({ type: "urn:idem:problem:invalid-body", status: 400, ...none });
    const dup = await problem(await app.send("/v1/p", { key: "pb-2", body: '{"a":1,"a":2}', headers: json }));
    expect(dup.body).toMatchObject({ type: "urn:idem:problem:ambiguous-body", status: 400, ...none });
    expect(String(dup.body.detail)).toContain('"a" more than once');
  });

  it("an unauthenticated keyed request: 401 before anything is claimed", async () => {
    const before = app.runs();
    const p = await problem(
      await app.send("/v1/p", { key: "pb-3", body: "{}", headers: { ...json, "x-anonymous": "1" } }),
    );
    expect(p.status).toBe(401);
    expect(p.body).toMatchObject({ type: "urn:idem:problem:unauthorized", title: "Unauthorized" });
    expect(app.runs()).toBe(before);
  });

  it("another request under a used key: 422 mismatch naming the key's operation_ref", async () => {
    await app.send("/v1/p", { key: "pb-4", body: '{"a":1}', headers: json });
    const p = await problem(await app.send("/v1/p", { key: "pb-4", body: '{"a":2}', headers: json }));
    expect(p.status).toBe(422);
    expect(p.body).toMatchObject({
      type: "urn:idem:problem:idempotency-key-mismatch",
      title: "Unprocessable Content",
      ...none,
      operation_ref: app.encodeRef("pb-4"),
    });
    expect(app.decodeRef(String(p.body.operation_ref))).toEqual({ scope: "acct_1", key: "pb-4" });
  });

  it("every answer publishes the route's answer bound (whole seconds, at least 1)", async () => {
    const ok = await app.send("/v1/p", { key: "pb-5", body: "{}", headers: json });
    expect(ok.headers.get("idempotency-answer-within")).toBe("5");
    const bad = await app.send("/v1/p", { key: '"pb', body: "{}", headers: json });
    expect(bad.headers.get("idempotency-answer-within")).toBe("5");
  });

  it("the database down: 503 retryable with Retry-After, nothing done, the same key may be retried", async () => {
    const down = await startRulesApp({ "/v1": {} });
    await down.goDown();
    const res = await down
      .send("/v1/p", { key: "pb-6", body: "{}", headers: json })
      .finally(() => down.close());
    const p = await problem(res);
    expect(p.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("1");
    expect(p.body).toMatchObject({
      type: "urn:idem:problem:retryable-failure",
      title: "Service Unavailable",
      operation_state: "none",
      retry_same_key: true,
      safe_new_key: true,
    });
  });
});

describe("errorResponse, for adapters and runners", () => {
  it("409 in flight: retry the same key after Retry-After, never a new one", () => {
    const r = errorResponse(new KeyInFlightError(3), { ref: "op_x" });
    expect(r.status).toBe(409);
    expect(header(r, "retry-after")).toEqual(["3"]);
    expect(header(r, "idempotency-operation-state")).toEqual(["in_progress"]);
    expect(bodyOf(r)).toMatchObject({
      type: "urn:idem:problem:idempotency-key-in-flight",
      title: "Conflict",
      operation_state: "in_progress",
      retry_same_key: true,
      safe_new_key: false,
      operation_ref: "op_x",
    });
  });

  it("a lost lease is in flight too, with Retry-After: 1", () => {
    const r = errorResponse(new LeaseLostError(), { ref: "op_y" });
    expect(header(r, "retry-after")).toEqual(["1"]);
    expect(bodyOf(r)).toMatchObject({
      operation_state: "in_progress",
      retry_same_key: true,
      safe_new_key: false,
      operation_ref: "op_y",
    });
  });

  it("a retryable failure: nothing done in atomic mode; in phases mode the claim may stand", () => {
    const err = new RetryableError("try again", { retryAfterSeconds: 2 });
    const atomic = errorResponse(err, { ref: "op_z" });
    expect(header(atomic, "retry-after")).toEqual(["2"]);
    expect(bodyOf(atomic)).toMatchObject({
      operation_state: "none",
      retry_same_key: true,
      safe_new_key: true,
    });
    expect(bodyOf(atomic).operation_ref).toBeUndefined();
    const phases = errorResponse(err, { ref: "op_z", claimed: true });
    expect(bodyOf(phases)).toMatchObject({
      operation_state: "in_progress",
      retry_same_key: true,
      safe_new_key: false,
      operation_ref: "op_z",
    });
    expect(new RetryableError("x").retryAfterSeconds).toBe(1);
  });

  it("uncertain: never retried, with either key; the ref goes to a person", () => {
    const r = errorResponse(new OperationUncertainError("op_u"), { ref: "op_other" });
    expect(r.status).toBe(409);
    expect(header(r, "idempotency-operation-state")).toEqual(["uncertain"]);
    expect(bodyOf(r)).toMatchObject({
      operation_state: "uncertain",
      retry_same_key: false,
      safe_new_key: false,
      operation_ref: "op_u",
    });
    const generic = errorResponse(new IdemError("operation-uncertain", 409, "unknown"), { ref: "op_ctx" });
    expect(bodyOf(generic).operation_ref).toBe("op_ctx");
  });

  it("a mismatch without a key row names no ref; an unknown code carries no contract fields", () => {
    expect(bodyOf(errorResponse(new KeyMismatchError())).operation_ref).toBeUndefined();
    const other = errorResponse(new IdemError("not-found", 404, "no such key"));
    expect(bodyOf(other)).toEqual({
      type: "urn:idem:problem:not-found",
      title: "Not Found",
      status: 404,
      detail: "no such key",
    });
    expect(other.headers).toEqual([["content-type", "application/problem+json"]]);
    expect(errorResponse(new KeyMismatchError()).headers).toEqual([
      ["content-type", "application/problem+json"],
      ["idempotency-operation-state", "none"],
    ]);
  });

  it("a body over the limit (413): nothing done, a new key is safe", () => {
    const r = errorResponse(new IdemError("body-too-large", 413, "The body is over 1 MiB."), { ref: "op_b" });
    expect(bodyOf(r)).toEqual({
      type: "urn:idem:problem:body-too-large",
      title: "Content Too Large",
      status: 413,
      detail: "The body is over 1 MiB.",
      operation_state: "none",
      retry_same_key: false,
      safe_new_key: true,
    });
  });

  it("problemResponse: an unknown status is titled Error; fields and headers are added", () => {
    const r = problemResponse(418, "teapot", "short and stout", {
      fields: { x: 1 },
      headers: [["x-h", "v"]],
    });
    expect(bodyOf(r)).toEqual({
      type: "urn:idem:problem:teapot",
      title: "Error",
      status: 418,
      detail: "short and stout",
      x: 1,
    });
    expect(r.headers).toEqual([
      ["content-type", "application/problem+json"],
      ["x-h", "v"],
    ]);
    const declined = problemResponse(402, "card-declined", "declined", { operation: FAILED_NOT_APPLIED });
    expect(bodyOf(declined)).toMatchObject({
      title: "Payment Required",
      operation_state: "failed_not_applied",
      retry_same_key: false,
      safe_new_key: true,
    });
    expect(header(declined, "idempotency-operation-state")).toEqual(["failed_not_applied"]);
  });
});

describe("the database is unavailable", () => {
  const err = (code?: string, message = "boom", cause?: unknown) =>
    Object.assign(new Error(message, { cause }), code === undefined ? {} : { code });

  it("shutdown, too many connections, read-only after a failover, class 08 and socket failures are", () => {
    for (const code of [
      "25006",
      "57P01",
      "57P02",
      "57P03",
      "53300",
      "08006",
      "08001",
      "ECONNREFUSED",
      "ECONNRESET",
      "ETIMEDOUT",
      "EPIPE",
      "ENOTFOUND",
      "EHOSTUNREACH",
      "ENETUNREACH",
      "EAI_AGAIN",
      "ECONNABORTED",
      "CONNECTION_CLOSED",
      "CONNECTION_ENDED",
      "CONNECTION_DESTROYED",
      "CONNECT_TIMEOUT",
    ]) {
      expect(isDatabaseUnavailable(err(code)), code).toBe(true);
    }
    for (const message of [
      "Connection terminated unexpectedly",
      "timeout exceeded when trying to connect",
      "Client has encountered a connection error and is not queryable",
      "Client was closed and is not queryable",
      "PGlite is closed",
    ]) {
      expect(isDatabaseUnavailable(err(undefined, message)), message).toBe(true);
    }
  });

  it("found in the cause chain, up to five deep", () => {
    expect(isDatabaseUnavailable(err(undefined, "wrapped", err("57P01")))).toBe(true);
    let deep: unknown = err("57P01");
    for (let i = 0; i < 4; i++) deep = err(undefined, "wrap", deep);
    expect(isDatabaseUnavailable(deep)).toBe(true);
    deep = err(undefined, "wrap", deep);
    expect(isDatabaseUnavailable(deep)).toBe(false);
  });

  it("a constraint, a lock timeout, a syntax error or a non-error are not", () => {
    for (const e of [
      err("23505"),
      err("55P03"),
      err("42601"),
      err("0800"),
      err("080001"),
      err("XX000", "Connection lost? no: PGlite is closed"),
      null,
      undefined,
      "57P01",
      57,
      err(undefined, "prefix Connection terminated"),
    ]) {
      expect(isDatabaseUnavailable(e), String((e as Error)?.message ?? e)).toBe(false);
    }
  });

  it("PgBouncer's own errors and lost prepared statements are told apart from the server's", () => {
    expect(poolerError(err("08P01", "client_login_timeout (server down)"))).toBe("pooler");
    expect(poolerError(err("08P01", "unsupported startup parameter: pgbouncer"))).toBe("pooler");
    expect(poolerError(err("08P01", "no more connections allowed (max_client_conn)"))).toBe("pooler");
    expect(poolerError(err("42P05", 'prepared statement "idem_0123" already exists'))).toBe(
      "prepared-statement",
    );
    expect(poolerError(err("26000", 'prepared statement "7m6e15" does not exist'))).toBe(
      "prepared-statement",
    );
    for (const e of [
      err("08P01", "invalid frontend message type 0"),
      err("28P01"),
      err("ECONNREFUSED"),
      null,
    ]) {
      expect(poolerError(e)).toBeUndefined();
    }
  });

  it("no connection could be had (nothing sent can have committed) is told apart from one lost later", () => {
    for (const e of [
      err("57P03"),
      err("53300"),
      err("ECONNREFUSED"),
      err("ENOTFOUND"),
      err("EHOSTUNREACH"),
      err("ENETUNREACH"),
      err("EAI_AGAIN"),
      err("CONNECT_TIMEOUT"),
      err(undefined, "timeout exceeded when trying to connect"),
      err(undefined, "PGlite is closed"),
      err(undefined, "wrapped", err(undefined, "wrapped", err("ECONNREFUSED"))),
    ]) {
      expect(isConnectFailure(e), String(e.code ?? e.message)).toBe(true);
      expect(isDatabaseUnavailable(e), String(e.code ?? e.message)).toBe(true);
    }
    for (const e of [
      err("57P01"),
      err("08006"),
      err("ECONNRESET"),
      err("EPIPE"),
      err("CONNECTION_CLOSED"),
      err(undefined, "Connection terminated unexpectedly"),
      err(undefined, "a PGlite is closed"),
      err("23505"),
      null,
      "ECONNREFUSED",
    ]) {
      expect(isConnectFailure(e), String((e as Error)?.message ?? e)).toBe(false);
    }
    let deep: unknown = err("ECONNREFUSED");
    for (let i = 0; i < 4; i++) deep = err(undefined, "wrap", deep);
    expect(isConnectFailure(deep)).toBe(true);
    expect(isConnectFailure(err(undefined, "wrap", deep))).toBe(false);
  });

  it("an insert into a missing partition is recognised (the store then creates it), nothing else", () => {
    const missing = err("23514", 'no partition of relation "keys" found for row');
    expect(isMissingPartition(missing)).toBe(true);
    expect(isMissingPartition(err("23514", 'new row for relation "keys" violates check constraint'))).toBe(
      false,
    );
    expect(isMissingPartition(err("23505", "no partition of relation"))).toBe(false);
    expect(isMissingPartition(null)).toBe(false);
  });

  it("sqlStateOf reads a five-character SQLSTATE only", () => {
    expect(sqlStateOf(err("23505"))).toBe("23505");
    expect(sqlStateOf(err("40P01"))).toBe("40P01");
    expect(sqlStateOf(err("ECONNREFUSED"))).toBeUndefined();
    expect(sqlStateOf(err("2350"))).toBeUndefined();
    expect(sqlStateOf(err("x23505"))).toBeUndefined();
    expect(sqlStateOf(null)).toBeUndefined();
    expect(sqlStateOf({ code: 23505 })).toBeUndefined();
  });
});
