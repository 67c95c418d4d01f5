/**
 * How a transaction's function says how it ends, as a value: `commit(v)` or `rollback(v)`. A transaction
 * (`Db.transaction`, `AtomicStore.transaction`) rolls back only when its function throws, so `endTx`
 * throws one private carrier for `rollback` and unwraps it at once: the caller gets its value either
 * way, and a throw is a real error. The one way idem rolls a transaction back on purpose (atomic and
 * phases modes, and the lifecycle's unkeyed requests).
 */
import type { Db, Tx } from "./db.ts";

/** Whatever runs a function in a transaction: a `Db`, or a store's `transaction`. */
interface Transactional<X, O> {
  transaction<R>(fn: (tx: X) => Promise<R>, options?: O): Promise<R>;
}

/** A transaction's end: its value, committed or rolled back. */
export type TxEnd<T> = { end: "commit"; value: T } | { end: "rollback"; value: T };

export const commit = <T>(value: T): TxEnd<T> => ({ end: "commit", value });
export const rollback = <T>(value: T): TxEnd<T> => ({ end: "rollback", value });

class RolledBack<T> {
  constructor(readonly value: T) {}
}

/**
 * Run `fn` in a transaction of `db` (with its `transaction`'s options) and return its value, however it
 * ended.
 * Promise chains, not async functions: this runs once per keyed request, and each async layer that
 * awaits another costs promises and jobs of its own.
 */
export function endTx<T, X = Tx, O = Parameters<Db["transaction"]>[1]>(
  db: Transactional<X, O>,
  fn: (tx: X) => Promise<TxEnd<T>>,
  options?: O,
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
