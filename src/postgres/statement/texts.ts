/**
 * The texts of single-statement mode's statements, built once per route statement and body expression
 * (and again when the store's time shift moved): the driver finds a prepared statement by its text, and
 * a string built per request would be hashed again each time.
 */
import type { DbTime } from "../keys/db-time.ts";
import { commonStatementSql, type StatementTable, statementSql } from "./sql.ts";

/** A route's built statements: for `n` route parameters, at the store's time shift `timeKey`. */
export interface BuiltText {
  n: number;
  timeKey: string;
  /** The full statement (sql.ts `statementSql`). */
  text: string;
  /** The common case's (sql.ts `commonStatementSql`), for the partitions it was built for. */
  common: { lo: number; hi: number; text: string } | undefined;
  /** Its table, route statement and body expression. */
  table: StatementTable;
  sql: string;
  body: string;
}

/** The table-side constants, read from the store each time (its time shift may move). */
export interface TextsTable {
  readonly schema: string;
  readonly dbTime: DbTime;
  readonly boundaryOverlapMs: number;
}

export class StatementTexts {
  /**
   * The built statements by route statement, then body expression: looked up with the route's own
   * strings (constants, whose hashes V8 keeps), not with a key concatenated per request.
   */
  private readonly texts = new Map<string, Map<string, BuiltText>>();
  private count = 0;

  constructor(private readonly table: TextsTable) {}

  /** The statements' texts, built once per route statement (and again when the store's time shift moved). */
  of(sql: string, n: number, body: string): BuiltText {
    const time = this.table.dbTime;
    let bodies = this.texts.get(sql);
    const hit = bodies?.get(body);
    if (hit && hit.n === n && hit.timeKey === time.key) return hit;
    const table = {
      schema: this.table.schema,
      dbTime: time,
      boundaryOverlapMs: this.table.boundaryOverlapMs,
    };
    const built: BuiltText = {
      n,
      timeKey: time.key,
      text: statementSql(table, sql, n, body),
      table,
      sql,
      body,
      common: undefined,
    };
    if (this.count >= MAX_TEXTS) {
      this.texts.clear();
      this.count = 0;
      bodies = undefined;
    }
    if (!bodies) {
      bodies = new Map();
      this.texts.set(sql, bodies);
    }
    if (!hit) this.count++;
    bodies.set(body, built);
    return built;
  }

  /**
   * The common statement, naming the partitions this process's estimate of the database's time
   * (`estimatedMs`) puts the lookup's window in: built again when they move on (a partition boundary,
   * twice per partition).
   */
  commonOf(built: BuiltText, estimatedMs: number): string {
    const { lo, hi } = built.table.dbTime.rangeAround(estimatedMs);
    const c = built.common;
    if (c?.lo === lo && c.hi === hi) return c.text;
    const text = commonStatementSql(built.table, built.sql, built.n, built.body, { lo, hi });
    built.common = { lo, hi, text };
    return text;
  }
}

/** How many distinct route statements a store keeps built. */
const MAX_TEXTS = 256;
