/**
 * Invariant checks on a production database (`idem audit`): each check is a query that returns the rows
 * violating it, so an empty result means the invariant holds. Built-in checks cover idem's own tables;
 * users add their own (e.g. "every payment has its receipt event") as SQL.
 */
import type { Db } from "../db.ts";
import { schemaOf } from "../schema/migrate.ts";

export interface AuditCheck {
  /** A short name, e.g. `one-answer-per-key` (also the metric label). */
  name: string;
  /** What must hold, in one sentence. */
  description: string;
  /** A query returning the violating rows (no parameters; read-only). */
  sql: string;
}

export interface AuditOptions {
  /** idem's schema. Default: `"idem"`. */
  schema?: string;
  /** The keys' retention, in ms (only live keys are checked). Default: 24 hours. */
  retentionMs?: number;
  /** The phases runners' lease, in ms. Default: 30,000. */
  leaseMs?: number;
  /** A key unfinished for more than this many leases is a violation. Default: 10. */
  maxLeases?: number;
  /** A review open for longer than this, in ms, is a violation. Default: 24 hours. */
  reviewMaxAgeMs?: number;
}

export interface AuditResult {
  name: string;
  description: string;
  /** Violating rows (at most `limit` of them). */
  rows: Record<string, unknown>[];
  /** How many rows violated (counted before the limit). */
  violations: number;
}

const interval = (ms: number) => `interval '${Math.max(0, Math.floor(ms))} milliseconds'`;

/** The built-in checks for idem's own tables. */
export function builtinChecks(options: AuditOptions = {}): AuditCheck[] {
  const s = schemaOf(options);
  const retention = interval(options.retentionMs ?? 24 * 3_600_000);
  const stuck = interval((options.leaseMs ?? 30_000) * (options.maxLeases ?? 10));
  const reviewAge = interval(options.reviewMaxAgeMs ?? 24 * 3_600_000);
  return [
    {
      name: "one-answer-per-key",
      description: "at most one saved answer per live key",
      sql: `SELECT scope, key, count(*)::int AS answers FROM ${s}.keys
             WHERE NOT marker AND status IS NOT NULL AND created_at > now() - ${retention}
             GROUP BY scope, key HAVING count(*) > 1`,
    },
    {
      name: "unfinished-past-leases",
      description: `no key unfinished (and not in review) for more than ${options.maxLeases ?? 10} leases`,
      sql: `SELECT scope, key, recovery_point, runner, updated_at FROM ${s}.keys
             WHERE recovery_point <> 'done' AND NOT marker AND needs_review_at IS NULL
               AND created_at > now() - ${retention} AND coalesce(updated_at, created_at) < now() - ${stuck}
             ORDER BY updated_at`,
    },
    {
      name: "review-too-old",
      description: "no key waits for a person longer than the review deadline",
      sql: `SELECT id, scope, key, recovery_point, reason, opened_at FROM ${s}.reviews
             WHERE settled_at IS NULL AND opened_at < now() - ${reviewAge} ORDER BY opened_at`,
    },
  ];
}

/**
 * Parse a file of the user's own checks: each starts with a `-- name: <name>` line, optionally followed
 * by `-- <description>` lines, then one query returning the violating rows.
 */
export function parseChecks(text: string): AuditCheck[] {
  const checks: AuditCheck[] = [];
  let current: { name: string; description: string[]; sql: string[] } | undefined;
  const flush = () => {
    if (!current) return;
    const sql = current.sql.join("\n").trim().replace(/;\s*$/, "");
    if (!sql) throw new Error(`the check "${current.name}" has no query`);
    checks.push({ name: current.name, description: current.description.join(" ") || current.name, sql });
  };
  for (const line of text.split(/\r?\n/)) {
    const named = /^--\s*name:\s*(\S+)\s*$/.exec(line);
    if (named) {
      flush();
      current = { name: named[1]!, description: [], sql: [] };
    } else if (!current) {
      if (line.trim() && !line.trim().startsWith("--")) {
        throw new Error("start each check with a line `-- name: <name>`");
      }
    } else if (current.sql.length === 0 && /^--/.test(line)) {
      current.description.push(line.replace(/^--\s?/, "").trim());
    } else {
      current.sql.push(line);
    }
  }
  flush();
  return checks;
}

/** Run the checks, each in a read-only transaction; `limit` rows of each are kept. */
export async function audit(
  db: Db,
  checks: AuditCheck[],
  options: { limit?: number } = {},
): Promise<AuditResult[]> {
  const limit = Math.max(1, options.limit ?? 20);
  const results: AuditResult[] = [];
  for (const check of checks) {
    const rows = await db.transaction(
      async (tx) => (await tx.query<Record<string, unknown>>(check.sql)).rows,
      { begin: "SET TRANSACTION READ ONLY; SET LOCAL statement_timeout = '60s'" },
    );
    results.push({
      name: check.name,
      description: check.description,
      rows: rows.slice(0, limit),
      violations: rows.length,
    });
  }
  return results;
}

/** The results as Prometheus text (for node_exporter's textfile collector, or a push). */
export function auditMetrics(results: AuditResult[]): string {
  const lines = [
    "# HELP idem_audit_violations Rows violating an invariant at the last audit.",
    "# TYPE idem_audit_violations gauge",
  ];
  for (const r of results)
    lines.push(`idem_audit_violations{check=${JSON.stringify(r.name)}} ${r.violations}`);
  return `${lines.join("\n")}\n`;
}
