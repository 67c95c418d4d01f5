/**
 * The handler's side of single-statement mode (store.ts): the statement a route gives (`StatementSpec`),
 * how the handler hands it over (`statement()`, recorded by a `tx` that runs nothing), and the checks
 * of its text.
 */
import { problemResponse, type StoredResponse } from "../../core/index.ts";
import type { Tx } from "../db.ts";
import { CLAIM_RELATION, unkeyedSql } from "./sql.ts";

/** A route's one statement, as its handler gives it to `statement()`. */
export interface StatementSpec {
  /**
   * One INSERT, UPDATE or DELETE with RETURNING (or a MERGE ... RETURNING, PostgreSQL 17), that reads its
   * input `FROM idem_claim` (columns `scope`, `key`, `claim_id`): that relation has one row when this
   * request holds the key and none otherwise, so the statement does nothing for a duplicate. E.g.
   * `INSERT INTO payments (account, amount_cents, claim_id) SELECT $1, $2, claim_id FROM idem_claim
   *  RETURNING id, amount_cents`. A statement that returns rows without reading it fails (nothing kept).
   */
  sql: string;
  /** Its parameters, `$1..$n`. Default: none. */
  params?: readonly unknown[];
  /**
   * The saved (and sent) body: an SQL expression over one row the statement returned (its columns by
   * name, the row as `work`), cast to text. Default: `row_to_json(work)::text` (the row as JSON).
   */
  body?: string;
  /** The answer's status when this request holds the key. Default: 201. */
  status?: number;
  /** The answer's headers (the route's replay allow-list decides which are saved). Default: none. */
  headers?: Record<string, string>;
  /**
   * The answer when the statement returned no row (it changed nothing): sent, never saved, so a retry
   * runs the statement again. Default: 404 with a problem+json body.
   */
  empty?: { status: number; headers?: Record<string, string>; body?: string };
}

/** What `statement()` returns for the handler to return: the status and headers, and the body to come. */
export interface StatementReply {
  status: number;
  headers: Record<string, string>;
  /** Empty here: the body is built by the statement (the answer sent carries it). */
  body: string;
}

/** A single-statement route used in a way it cannot honour (the message says which, and what to do). */
export class StatementModeError extends Error {
  /** Always `"StatementModeError"`: the name logs and stack traces show. */
  override name = "StatementModeError";
}

/** The transaction a single-statement handler gets: it records the statement, and runs nothing. */
export class StatementCapture implements Tx {
  spec: StatementSpec | undefined;
  readonly raw = undefined;
  query(): never {
    throw new StatementModeError(
      "in single-statement mode the handler runs no query: return statement(tx, { sql, params, body })",
    );
  }
  exec(): never {
    return this.query();
  }
  final(): never {
    return this.query();
  }
}

export const DEFAULT_BODY = "row_to_json(work)";
/** The answer to a statement that returned no row, when the route gives none: 404 problem+json. */
export const EMPTY: NonNullable<StatementSpec["empty"]> = (() => {
  const r = problemResponse(404, "not-found", "The statement changed nothing; nothing was saved.");
  return { status: r.status, headers: Object.fromEntries(r.headers), body: new TextDecoder().decode(r.body) };
})();

/**
 * The handler's answer on a single-statement route: hand the statement to the store (keyed requests)
 * or run it in `tx` (a request without a key on a `required: false` route). Return what it resolves to.
 */
export async function statement(tx: Tx, spec: StatementSpec): Promise<StatementReply> {
  checkSpec(spec);
  const status = spec.status ?? 201;
  const headers = spec.headers ?? {};
  if (tx instanceof StatementCapture) {
    if (tx.spec) throw new StatementModeError("a single-statement handler calls statement() once");
    tx.spec = spec;
    return { status, headers, body: "" };
  }
  const params = spec.params ?? [];
  const { rows } = await tx.query<{ body: string | null }>(
    unkeyedSql(spec.sql, spec.body ?? DEFAULT_BODY),
    params,
  );
  if (rows.length === 0) {
    const e = spec.empty ?? EMPTY;
    return { status: e.status, headers: e.headers ?? {}, body: e.body ?? "" };
  }
  return { status, headers, body: rows[0]!.body ?? "" };
}

/** Statements checked already, with their parameter count (a route sends the same text each time). */
const checked = new Map<string, number>();
export function checkSpec(spec: StatementSpec): void {
  if (checked.get(spec?.sql) === (spec.params?.length ?? 0)) return;
  if (typeof spec?.sql !== "string" || !new RegExp(`\\b${CLAIM_RELATION}\\b`).test(spec.sql)) {
    throw new StatementModeError(
      `a single statement must read its input FROM ${CLAIM_RELATION} (one row when this request holds the key), e.g. INSERT INTO t (a, claim_id) SELECT $1, claim_id FROM ${CLAIM_RELATION} RETURNING id`,
    );
  }
  const n = spec.params?.length ?? 0;
  let max = 0;
  for (const m of spec.sql.matchAll(/\$(\d+)/g)) max = Math.max(max, Number(m[1]));
  if (max > n) {
    throw new StatementModeError(`the statement reads $${max} but is given ${n} parameters`);
  }
  if (checked.size >= 1_000) checked.clear();
  checked.set(spec.sql, n);
}

/** Whether a header is not derived from the body (Content-Length, ETag: a framework's, of the placeholder). */
export function notOfThePlaceholder([name]: readonly [string, string]): boolean {
  const n = name.toLowerCase();
  return n !== "content-length" && n !== "etag";
}

/** The answer for a statement that changed nothing: the route's `empty`, or 404 problem+json. */
export function emptyAnswer(spec: StatementSpec): StoredResponse {
  const e = spec.empty ?? EMPTY;
  const headers = Object.entries(e.headers ?? {}).map(([k, v]) => [k.toLowerCase(), v] as [string, string]);
  return { status: e.status, headers, body: new TextEncoder().encode(e.body ?? "") };
}
