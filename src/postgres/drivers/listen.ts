/**
 * LISTEN/NOTIFY, for waking an idle relay the moment events commit. The `Db` interface has no notion
 * of a long-lived connection, so each driver gets a small adapter here. A relay without a listener
 * still works: it polls.
 */

import { isDirectPgSession } from "./pg.ts";
import { isDirectPostgresJs } from "./postgres-js.ts";

/**
 * LISTEN was refused because the connection goes through a pooler (PgBouncer): a transaction pooler
 * hands the session that listened to other clients, so no notification would ever arrive. Listen on a
 * URL straight to PostgreSQL instead (`IDEM_LISTEN_DATABASE_URL`), or poll.
 */
export class ListenUnavailableError extends Error {
  /** Always `"ListenUnavailableError"`: the name logs and stack traces show. */
  override name = "ListenUnavailableError";
  /** Always `"IDEM_LISTEN_UNAVAILABLE"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_LISTEN_UNAVAILABLE";
  constructor() {
    super(
      "LISTEN is unavailable through a connection pooler (PgBouncer): notifications would never arrive; " +
        "give a URL straight to PostgreSQL for LISTEN (IDEM_LISTEN_DATABASE_URL)",
    );
  }
}

/**
 * Subscribe to a channel; `close()` unsubscribes. `onNotify` may be called spuriously. Rejects with
 * `ListenUnavailableError` when the connection goes through a pooler.
 */
export type Listen = (channel: string, onNotify: () => void) => Promise<{ close(): Promise<void> }>;

/** The `pg` client `listenWithPg` listens on (a `pg.Client`, or a pool's client held for it). */
export interface PgNotifyClient {
  query(text: string): Promise<unknown>;
  on(event: "notification", fn: () => void): unknown;
  on(event: "error" | "end", fn: (err?: Error) => void): unknown;
  removeAllListeners(event?: string): unknown;
}

/**
 * LISTEN through node-postgres. `connect` returns a dedicated connection (a `pg.Client` already
 * connected, or one checked out of a pool). A broken connection is replaced after `retryMs`
 * (default 1,000 ms); each (re)connection is followed by one `onNotify` call, since events may have
 * been written while nobody listened. A connection through a pooler is refused
 * (`ListenUnavailableError`), at subscription or, later, through `onError` (then it stops trying).
 */
export function listenWithPg(
  connect: () => Promise<PgNotifyClient & { release?(err?: boolean | Error): void; end?(): Promise<void> }>,
  options: { retryMs?: number; onError?: (err: Error) => void } = {},
): Listen {
  const retryMs = options.retryMs ?? 1_000;
  return async (channel, onNotify) => {
    let closed = false;
    let client: Awaited<ReturnType<typeof connect>> | undefined;
    let timer: NodeJS.Timeout | undefined;
    const drop = (c: NonNullable<typeof client>, err?: Error) => {
      c.removeAllListeners("notification");
      c.removeAllListeners("error");
      c.removeAllListeners("end");
      c.on("error", () => {}); // late errors of a dropped connection
      if (c.release) c.release(err ?? true);
      else c.end?.().catch(() => {});
    };
    const open = async (first = false): Promise<void> => {
      try {
        const c = await connect();
        if (closed) {
          drop(c);
          return;
        }
        if (!(await isDirectPgSession(c))) {
          drop(c);
          throw new ListenUnavailableError();
        }
        c.on("notification", onNotify);
        const broken = (err?: Error) => {
          if (client !== c) return;
          client = undefined;
          drop(c, err);
          if (err) options.onError?.(err);
          if (!closed) timer = setTimeout(open, retryMs);
        };
        c.on("error", broken);
        c.on("end", () => broken(new Error("LISTEN connection ended")));
        client = c;
        await c.query(`LISTEN "${channel}"`);
        onNotify();
      } catch (err) {
        if (err instanceof ListenUnavailableError) {
          if (first) throw err;
          options.onError?.(err);
          return;
        }
        options.onError?.(err as Error);
        if (!closed) timer = setTimeout(open, retryMs);
      }
    };
    await open(true);
    return {
      async close() {
        closed = true;
        clearTimeout(timer);
        const c = client;
        client = undefined;
        if (c) {
          await c.query(`UNLISTEN "${channel}"`).catch(() => {});
          drop(c);
        }
      },
    };
  };
}

/**
 * LISTEN through postgres.js (`sql.listen`, which reconnects by itself). Refused with
 * `ListenUnavailableError` when `sql` goes through a pooler.
 */
export function listenWithPostgresJs(sql: {
  listen(
    channel: string,
    fn: (payload: string) => void,
    onlisten?: () => void,
  ): Promise<{ unlisten(): Promise<void> }>;
  unsafe(query: string, params?: any[], options?: { prepare?: boolean }): Promise<any>;
}): Listen {
  return async (channel, onNotify) => {
    if (!(await isDirectPostgresJs(sql))) throw new ListenUnavailableError();
    const sub = await sql.listen(channel, () => onNotify(), onNotify);
    return { close: () => sub.unlisten() };
  };
}

/** LISTEN on an embedded PGlite database (same process). */
export function listenWithPglite(pglite: {
  listen(channel: string, fn: (payload: string) => void): Promise<() => Promise<void>>;
}): Listen {
  return async (channel, onNotify) => {
    const unsubscribe = await pglite.listen(channel, () => onNotify());
    return { close: () => unsubscribe() };
  };
}
