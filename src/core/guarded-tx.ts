/**
 * The transaction handed to user code (a handler, a local phase), fenced: once the key's transaction is
 * over for that code (its function returned, the transaction then committed or rolled back), any use of
 * it fails at once with `TransactionEndedError`, which says why. Without the fence a handler that keeps
 * `tx` (or fires a statement without awaiting it) would send that statement on the pooled connection
 * after it went back to the pool: inside whatever transaction the next request runs there, committed or
 * rolled back with it.
 *
 * A wrapper of the `Tx` interface, above the drivers: it works the same for every driver and for a
 * user's own `Db`. Its `raw` (the driver's or the ORM's transaction object) is fenced too: a property of
 * it read after the end throws (methods read before the end and kept are beyond its reach).
 */
import type { QueryResult, Tx } from "./db.ts";

/** Why a fenced transaction can no longer be used. */
export type TransactionEnd = "returned" | "committed" | "rolled back";

/** A statement on (or a read of the driver object of) a transaction that has ended for its user. */
export class TransactionEndedError extends Error {
  /** Always `"TransactionEndedError"`: the name logs and stack traces show. */
  override name = "TransactionEndedError";
  /** Always `"IDEM_TRANSACTION_ENDED"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_TRANSACTION_ENDED";
  constructor(
    /** How the transaction ended for its user. */
    readonly end: "returned" | "committed" | "rolled back",
  ) {
    super(
      `this request's transaction has ended (${
        end === "returned" ? "its handler returned; it then committed or rolled back" : `it ${end}`
      }): a statement on it now would run on a pooled connection another request may be using. ` +
        "Await every use of the transaction inside the handler, and do not keep it past the handler.",
    );
  }
}

export const isTransactionEndedError = (e: unknown): e is TransactionEndedError =>
  e instanceof TransactionEndedError;

/** The objects `GuardedTx` put a fence around, by fence (so that `unguarded` finds the real one). */
const targets = new WeakMap<object, object>();

/** The real driver or ORM object behind a fenced `raw` (itself when it is not fenced). */
export function unguarded<T>(raw: T): T {
  return ((raw !== null && (typeof raw === "object" || typeof raw === "function") && targets.get(raw)) ??
    raw) as T;
}

/** A `Tx` whose every use fails once `end()` was called. */
export class GuardedTx implements Tx {
  private ended: TransactionEnd | undefined;
  private fencedRaw: unknown;

  constructor(private readonly tx: Tx) {}

  /** The user's code is done with the transaction: from now on every use throws. */
  end(how: TransactionEnd = "returned"): void {
    // A later, more precise reason (committed, rolled back) replaces "returned".
    if (this.ended === undefined || this.ended === "returned") this.ended = how;
  }

  private check(): void {
    if (this.ended !== undefined) throw new TransactionEndedError(this.ended);
  }

  get pipelined(): boolean | undefined {
    return this.tx.pipelined;
  }

  get raw(): unknown {
    this.check();
    const raw = this.tx.raw;
    if (raw === null || (typeof raw !== "object" && typeof raw !== "function")) return raw;
    if (this.fencedRaw === undefined) {
      const fence = this;
      const target = raw as object;
      const fenced = new Proxy(target, {
        get(t, prop) {
          fence.check();
          const v = Reflect.get(t, prop, t);
          // Bound to the real object: classes with private fields refuse a proxy as `this`.
          return typeof v === "function" ? v.bind(t) : v;
        },
        apply(t, thisArg, args) {
          fence.check();
          return Reflect.apply(t as (...a: unknown[]) => unknown, thisArg, args);
        },
      });
      targets.set(fenced, target);
      this.fencedRaw = fenced;
    }
    return this.fencedRaw;
  }

  query<R>(sql: string, params?: readonly unknown[]): Promise<QueryResult<R>> {
    try {
      this.check();
    } catch (err) {
      return Promise.reject(err);
    }
    return this.tx.query<R>(sql, params);
  }

  exec(sql: string): Promise<void> {
    try {
      this.check();
    } catch (err) {
      return Promise.reject(err);
    }
    return this.tx.exec(sql);
  }

  final(sql: string, params?: readonly unknown[]): void {
    this.check();
    this.tx.final(sql, params);
  }

  notifyAfterCommit(channel: string): boolean {
    this.check();
    return this.tx.notifyAfterCommit?.(channel) ?? false; // false: the outbox's trigger notifies instead
  }
}

/**
 * Run `work` on a fenced view of `tx`, and close the fence when it settles: what the work kept, or sent
 * without awaiting after it returned, fails with `TransactionEndedError` instead of reaching the
 * connection after the transaction.
 */
export function withGuardedTx<T>(tx: Tx, work: (tx: Tx) => Promise<T>): Promise<T> {
  const guard = new GuardedTx(tx);
  const end = () => guard.end("returned");
  let running: Promise<T>;
  try {
    running = work(guard);
  } catch (err) {
    end();
    return Promise.reject(err);
  }
  // `finally` as one reaction (no async layer of its own, nor `.finally`'s extra promises: this wraps
  // every keyed handler).
  return Promise.resolve(running).then(
    (value) => {
      end();
      return value;
    },
    (err: unknown) => {
      end();
      throw err;
    },
  );
}
