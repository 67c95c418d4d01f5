/**
 * One statement through node-postgres, as idem's `pg` adapter (pg.ts) sends it: its parameters in the
 * form the driver takes, a named prepared statement when the connection allows one, and the driver's
 * cheapest query path when it is there.
 */
import { createHash } from "node:crypto";
import type { QueryResult } from "../db.ts";

/**
 * The slice of node-postgres this adapter uses, typed structurally so `idem/postgres` never imports `pg`
 * at run time: a `pg.Pool` satisfies it.
 */
export interface PgQueryable {
  query(config: {
    text: string;
    values?: unknown[];
    name?: string;
  }): Promise<{ rows: any[]; rowCount: number | null }>;
  query(text: string): Promise<unknown>;
}
function toParams(params: readonly unknown[] | undefined): unknown[] | undefined {
  if (!params) return undefined;
  // A copy of the array (a caller may reuse it before a queued statement is sent), without a closure per
  // call. node-postgres sends Buffers as bytea but not plain Uint8Arrays: those go as a Buffer over the
  // same bytes (a view, not a copy: a saved reply's body is not written to once handed over).
  const values = new Array<unknown>(params.length);
  for (let i = 0; i < params.length; i++) {
    const p = params[i];
    values[i] =
      p instanceof Uint8Array && !Buffer.isBuffer(p) ? Buffer.from(p.buffer, p.byteOffset, p.byteLength) : p;
  }
  return values;
}

function result<R>(r: { rows: any[]; rowCount: number | null }): QueryResult<R> {
  return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
}

/*
 * Named prepared statements (the name derives from the text) let PostgreSQL parse and plan a statement
 * once per connection instead of on every call. They are only safe on a connection that is one server
 * session for its whole life: through a transaction pooler (PgBouncer's transaction mode) a name
 * prepared on one server session is missing on the next ("prepared statement ... does not exist") or
 * already there ("... already exists"). `prepare: "auto"` uses them only on a direct connection.
 */
const names = new Map<string, string>();
function statementName(text: string): string {
  let name = names.get(text);
  if (!name) {
    name = `idem_${createHash("sha1").update(text).digest("hex").slice(0, 16)}`;
    if (names.size > 1_000) names.clear();
    names.set(text, name);
  }
  return name;
}

export function run<R>(
  q: PgQueryable,
  sql: string,
  params: readonly unknown[] | undefined,
  named: boolean,
): Promise<QueryResult<R>> {
  const values = toParams(params);
  const submit = submitterOf(q);
  if (submit) return submit(q, sql, values, named ? statementName(sql) : undefined);
  return q
    .query(named ? { text: sql, values, name: statementName(sql) } : { text: sql, values })
    .then(result<R>);
}

/*
 * node-postgres' `client.query(config)` copies a config object on every call (`cloneQueryConfig`:
 * `Object.defineProperties(Object.create(...), Object.getOwnPropertyDescriptors(config))`, most of the
 * driver's own CPU per statement: docs/decisions/pg-query-path.md) and wraps its callback in two
 * promises, which `run` then wrapped in a third. A query built as `new Query(text, values, callback)`
 * takes its text path (no copy), and the callback settles the one promise `run` returns, with the
 * result already in idem's shape.
 * `client.query(submittable)` and `pg.Query` (`Client.Query`, the class node-postgres' own config path
 * builds) are public; what is not is setting `name` after construction (the config path copies it from
 * the config into the same field). So `submitterOf` only takes this path when the client's Query class
 * looks like node-postgres 8's and a probe query built this way carries text, values, callback and an own
 * `name` field; anything else (pg-native, a pg upgrade that moved these fields, a mock) keeps the config
 * path above. A pooled pg client's `query` is Client.prototype.query (pg-pool does not wrap it).
 */
type Submit = <R>(
  client: PgQueryable,
  text: string,
  values: unknown[] | undefined,
  name: string | undefined,
) => Promise<QueryResult<R>>;
type PgQueryCtor = new (
  text: string,
  values: unknown[] | undefined,
  callback: (err: Error | null, res: { rows: any[]; rowCount: number | null }) => void,
) => { text?: unknown; values?: unknown; callback?: unknown; name?: string };

/**
 * As node-postgres' own promise does: take an error's stack again in a promise reaction, so that it
 * leads back to the statement's caller (async frames) instead of to the socket's read.
 */
function restack(err: Error): never {
  Error.captureStackTrace(err);
  throw err;
}

const submitters = new WeakMap<object, Submit | null>();
function submitterOf(client: PgQueryable): Submit | null {
  const ctor = (client as { constructor?: unknown }).constructor;
  if (typeof ctor !== "function") return null;
  let submit = submitters.get(ctor);
  if (submit === undefined) {
    submit = submitterFor((ctor as { Query?: unknown }).Query);
    submitters.set(ctor, submit);
  }
  return submit;
}

function submitterFor(Query: unknown): Submit | null {
  if (typeof Query !== "function") return null;
  const proto = (Query as { prototype?: Record<string, unknown> }).prototype;
  if (
    typeof proto?.submit !== "function" ||
    typeof proto.requiresPreparation !== "function" ||
    typeof proto.hasBeenParsed !== "function"
  ) {
    return null;
  }
  const Q = Query as PgQueryCtor;
  try {
    const callback = () => {};
    const values = [1];
    const probe = new Q("SELECT $1", values, callback);
    if (
      probe.text !== "SELECT $1" ||
      probe.values !== values ||
      probe.callback !== callback ||
      !Object.hasOwn(probe, "name") ||
      probe.name !== undefined
    ) {
      return null;
    }
  } catch {
    return null;
  }
  return <R>(client: PgQueryable, text: string, values: unknown[] | undefined, name: string | undefined) =>
    new Promise<QueryResult<R>>((resolve, reject) => {
      const query = new Q(text, values, (err, res) => {
        if (err) reject(err);
        else resolve({ rows: res.rows as R[], rowCount: res.rowCount ?? 0 });
      });
      if (name !== undefined) query.name = name;
      (client as unknown as { query(q: unknown): unknown }).query(query);
    }).catch(restack);
}
