/**
 * The one handler every variant of the comparison runs: a payment is one INSERT, answered 201 with the
 * row as JSON. Bare variants and the peers run it autocommitted on a plain pool; idem's variants run it
 * in the key's transaction. The row keeps the request's Idempotency-Key so the bench can count how many
 * times each key was executed.
 */

/** The table the handler writes; created by the orchestrator before any server starts. */
export const PAYMENTS_DDL = `
  CREATE TABLE payments (
    id bigserial PRIMARY KEY,
    idem_key text,
    amount_cents integer NOT NULL,
    currency text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
  );
  CREATE INDEX payments_idem_key ON payments (idem_key);
  -- The hand-written variants' keys and replies (hand.ts).
  CREATE TABLE hand_keys (key text PRIMARY KEY, status integer, body text);
  CREATE TABLE hand_replies (key text PRIMARY KEY, status integer NOT NULL, body text NOT NULL);`;

export const PATH = "/v1/payments";
export const BODY = JSON.stringify({ amount_cents: 5000, currency: "eur" });

/**
 * A request with this header (only the crash check sends it) kills its server with SIGKILL right after
 * the handler's INSERT returned: the worst moment for a crash, after the effect and before any answer
 * or saved response.
 */
export const CRASH_HEADER = "x-bench-crash";

export interface Payment {
  amount_cents: number;
  currency: string;
}

interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}

/** What node-postgres' pools and clients take: a statement with a name is prepared once per connection. */
interface NamedQueryable {
  query(config: { name: string; text: string; values?: unknown[] }): Promise<{ rows: any[] }>;
}

/**
 * A plain pool (the bare handlers', the peers') whose statements are sent named, as a careful engineer
 * writes them and as idem sends the handler's INSERT in the key's transaction: PostgreSQL parses and
 * plans each once per connection instead of on every request (issue 65: the bench's yardsticks were
 * sent unnamed, and their planning was counted against them).
 */
export function prepared(db: NamedQueryable): Queryable {
  const names = new Map<string, string>();
  return {
    query(text, values) {
      let name = names.get(text);
      if (!name) {
        name = `bench_${names.size}`;
        names.set(text, name);
      }
      return db.query(values ? { name, text, values } : { name, text });
    },
  };
}

const INSERT =
  "INSERT INTO payments (idem_key, amount_cents, currency) VALUES ($1, $2, $3) RETURNING id, amount_cents, currency";

/** The work itself: one INSERT. `crash`: die right after it (see CRASH_HEADER). */
export async function insertPayment(
  q: Queryable,
  key: string | undefined,
  body: Payment,
  crash: boolean,
): Promise<{ id: string; amount_cents: number; currency: string }> {
  const { rows } = await q.query(INSERT, [key ?? null, body.amount_cents, body.currency]);
  if (crash) process.kill(process.pid, "SIGKILL");
  return rows[0];
}

/** Status and JSON body of the handler's answer. */
export const CREATED = 201;
