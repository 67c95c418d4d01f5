/**
 * How a transaction's function says how it ends, as a value: `commit(v)` or `rollback(v)`. `Db` rolls a
 * transaction back only when its function throws, so `endTx` throws one private carrier for
 * `rollback` and unwraps it at once: the caller gets its value either way, and a throw is a real error.
 */
import type { Db, Tx } from "./db.ts";

/** A transaction's end: its value, committed or rolled back. */
export type TxEnd<T> = { end: "commit"; value: T } | { end: "rollback"; value: T };

export const commit = <T>(value: T): TxEnd<T> => ({ end: "commit", value });
export const rollback = <T>(value: T): TxEnd<T> => ({ end: "rollback", value });

class RolledBack<T> {
  constructor(readonly value: T) {}
}

/**
 * Run `fn` in a transaction of `db` (`Db.transaction`'s options) and return its value, however it ended.
 * Promise chains, not async functions: this runs once per keyed request, and each async layer that
 * awaits another costs promises and jobs of its own.
 */
export function endTx<T>(
  db: Db,
  fn: (tx: Tx) => Promise<TxEnd<T>>,
  options?: Parameters<Db["transaction"]>[1],
): Promise<T> {
  return db.transaction((tx) => fn(tx).then(valueOrRollback), options).catch(rolledBackValue) as Promise<T>;
}

function valueOrRollback<T>(ended: TxEnd<T>): T {
  if (ended.end === "rollback") throw new RolledBack(ended.value);
  return ended.value;
}

function rolledBackValue(err: unknown): unknown {
  if (err instanceof RolledBack) return err.value;
  throw err;
}
