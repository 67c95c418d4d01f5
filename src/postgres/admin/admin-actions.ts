/**
 * The record of what people did to idem's records (sql/0010): every settle, forget, requeue, unpark and
 * audit run of the admin API, the console and the CLI, with who, when, what and why. The table is
 * outside the partitioned tables (no sweep drops it) and append-only for the service's runtime role.
 */
import { type Db, jsonColumn, type Tx } from "../db.ts";
import { schemaOf } from "../schema/migrate.ts";

/** What a person did, as recorded. */
export interface AdminAction {
  /** The record's id. */
  id: number;
  /** When (the database's clock). */
  at: Date;
  /** Who: the name the admin API's `authorize` hook returned, or the CLI's `--by` / `$USER`. */
  actor: string;
  /** What: `key.settle`, `key.forget`, `outbox.requeue`, `inbox.unpark`, `audit.run`. */
  action: string;
  /** The key acted on, when the action is about one. */
  scope: string | null;
  /** The key acted on, with `scope`. */
  key: string | null;
  /** What else it names: an outbox event id or aggregate, a consumer's message. */
  target: string | null;
  /** Why, in the person's words. */
  reason: string | null;
  /** What was done: the settlement, the rows touched, the audit's results. */
  details: unknown;
}

/** An action to record: who and what, and what it is about (`recordAction`). */
export type NewAdminAction = Pick<AdminAction, "actor" | "action"> &
  Partial<Pick<AdminAction, "scope" | "key" | "target" | "reason" | "details">>;

interface ActionRow {
  id: string | number;
  at: Date | string;
  actor: string;
  action: string;
  scope: string | null;
  key: string | null;
  target: string | null;
  reason: string | null;
  details: unknown;
}

function toAction(r: ActionRow): AdminAction {
  return {
    id: Number(r.id),
    at: new Date(r.at),
    actor: r.actor,
    action: r.action,
    scope: r.scope,
    key: r.key,
    target: r.target,
    reason: r.reason,
    details: jsonColumn(r.details),
  };
}

/** Record one action (in `tx` to commit it together with the change it describes). */
export async function recordAction(
  db: Db | Tx,
  action: NewAdminAction,
  options: { schema?: string } = {},
): Promise<AdminAction> {
  if (!action.actor?.trim()) throw new Error("an action needs an actor (who did it)");
  const s = schemaOf(options);
  const { rows } = await db.query<ActionRow>(
    `INSERT INTO ${s}.admin_actions (actor, action, scope, key, target, reason, details)
     VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb) RETURNING *`,
    [
      action.actor,
      action.action,
      action.scope ?? null,
      action.key ?? null,
      action.target ?? null,
      action.reason ?? null,
      action.details === undefined ? null : JSON.stringify(action.details),
    ],
  );
  return toAction(rows[0]!);
}

/** The recorded actions, newest first: all, those on one key, or those of one kind. */
export async function listActions(
  db: Db,
  options: { schema?: string; scope?: string; key?: string; action?: string; limit?: number } = {},
): Promise<AdminAction[]> {
  const s = schemaOf(options);
  const { rows } = await db.query<ActionRow>(
    `SELECT * FROM ${s}.admin_actions
      WHERE ($1::text IS NULL OR (scope = $1::text AND key = $2::text))
        AND ($3::text IS NULL OR action = $3::text)
      ORDER BY at DESC, id DESC LIMIT $4`,
    [
      options.key === undefined ? null : (options.scope ?? ""),
      options.key ?? null,
      options.action ?? null,
      Math.max(1, Math.floor(options.limit ?? 100)),
    ],
  );
  return rows.map(toAction);
}
