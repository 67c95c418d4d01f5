/**
 * Counting effects: how many payments (emails, rows...) exist for one intent. idem verify counts
 * before the run (a baseline) and after it, and attributes the difference to the intent through the
 * values only that intent was rendered with (its `{{amount}}`, its `{{uuid}}`).
 */
import type { Queryable } from "../../core/db.ts";
import { type Placeholder, render, type TemplateVars, toParameterised } from "./template.ts";

/** Counts an API's effects (rows, list items) per intent, for `verify` (`sqlEffects`, `listEffects`). */
export interface EffectCounter {
  /** A short description for the report, e.g. the SQL or the URL. */
  readonly describe: string;
  /** The number of effects for each set of values, in the same order. */
  count(markers: readonly TemplateVars[]): Promise<number[]>;
}

/**
 * Count with an SQL query that returns one number, e.g.
 * `SELECT count(*) FROM payments WHERE amount_cents = {{amount}}`. Placeholders become parameters.
 */
export function sqlEffects(db: Queryable, sql: string): EffectCounter {
  const { text, names } = toParameterised(sql);
  return {
    describe: sql,
    async count(markers) {
      const out: number[] = [];
      for (const vars of markers) {
        const { rows } = await db.query<Record<string, unknown>>(
          text,
          names.map((name) => String(vars[name as Placeholder])),
        );
        const first = rows[0] ? Object.values(rows[0])[0] : undefined;
        const n = Number(first);
        if (first === undefined || first === null || !Number.isFinite(n)) {
          throw new Error(`the effect-counting query must return one number, got ${JSON.stringify(rows[0])}`);
        }
        out.push(n);
      }
      return out;
    },
  };
}

/** Options of `listEffects`: a list endpoint of the API, and which items mark an intent's effect. */
export interface ListEffectsOptions {
  /** The list's full URL, e.g. `http://127.0.0.1:3000/v1/payments?limit=100`. */
  url: string;
  /** Request headers (credentials). */
  headers?: Record<string, string>;
  /** Dot path to the array in the JSON reply, e.g. `data`; empty for a reply that is the array. */
  path?: string;
  /**
   * Item fields that mark an intent's effect: `{ amount_cents: "{{amount}}" }` counts the items whose
   * `amount_cents` is the intent's amount. Values are compared as text. At least one.
   */
  match: Record<string, string>;
  /** Default: the global fetch. */
  fetch?: typeof fetch;
}

function at(value: unknown, path: string): unknown {
  if (!path) return value;
  let v = value;
  for (const part of path.split(".")) {
    if (v === null || typeof v !== "object") return undefined;
    v = (v as Record<string, unknown>)[part];
  }
  return v;
}

/**
 * Count with one GET of a list endpoint per count: its items that match each intent's marker
 * fields. The list must hold every effect of the run (mind its page size).
 */
export function listEffects(options: ListEffectsOptions): EffectCounter {
  const fields = Object.entries(options.match);
  if (fields.length === 0) throw new Error("listEffects needs at least one match field");
  const path = options.path ?? "";
  return {
    describe: `GET ${options.url}${path ? ` (${path})` : ""} where ${fields.map(([f, v]) => `${f}=${v}`).join(", ")}`,
    async count(markers) {
      const doFetch = options.fetch ?? fetch;
      const res = await doFetch(options.url, { headers: { accept: "application/json", ...options.headers } });
      const text = await res.text();
      if (!res.ok) throw new Error(`GET ${options.url} answered ${res.status}: ${text.slice(0, 200)}`);
      let json: unknown;
      try {
        json = JSON.parse(text);
      } catch {
        throw new Error(`GET ${options.url} did not answer JSON`);
      }
      const items = at(json, path);
      if (!Array.isArray(items)) {
        throw new Error(`GET ${options.url}: ${path ? `"${path}"` : "the reply"} is not a JSON array`);
      }
      return markers.map((vars) => {
        const wanted = fields.map(([f, v]) => [f, render(v, vars)] as const);
        return items.filter((item) =>
          wanted.every(([f, v]) => {
            const got = at(item, f);
            return got !== undefined && got !== null && String(got) === v;
          }),
        ).length;
      });
    },
  };
}
