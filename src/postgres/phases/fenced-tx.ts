import type { Tx } from "../db.ts";

/**
 * A local phase's transaction on a pipelining driver: the phase's statements leave before the fence
 * (the lock of our key row, token checked) has answered, so the first one goes out with BEGIN and the
 * lock in one write. The server runs them after the lock, in order, and the phase sees an answer only
 * once the fence held: otherwise its statements reject with the fence's error (`LeaseLostError`, or the
 * lock's own) and nothing more is sent; the transaction rolls back. The phase's contract (write through
 * `tx` only) is what makes the early send safe: see atomic mode's `effectsInTxOnly` for the same idea.
 */
export class FencedTx implements Tx {
  private held: boolean | undefined;
  private failure: unknown;

  constructor(
    private readonly tx: Tx,
    private readonly fence: Promise<void>,
  ) {
    fence.then(
      () => {
        this.held = true;
      },
      (err) => {
        this.held = false;
        this.failure = err;
      },
    );
  }

  get raw(): unknown {
    return this.tx.raw;
  }

  get pipelined(): boolean | undefined {
    return this.tx.pipelined;
  }

  private async gate<T>(send: () => Promise<T>): Promise<T> {
    if (this.held === false) throw this.failure;
    const sent = send();
    if (this.held) return sent;
    sent.catch(() => {});
    await this.fence; // rejects with the fence's error: the statement's own answer is not used
    return sent;
  }

  query<R>(sql: string, params?: readonly unknown[]) {
    return this.gate(() => this.tx.query<R>(sql, params));
  }

  exec(sql: string): Promise<void> {
    return this.gate(() => this.tx.exec(sql));
  }

  final(sql: string, params?: readonly unknown[]): void {
    this.tx.final(sql, params);
  }

  /** Sent only if the transaction commits, which it does only once the fence held. */
  notifyAfterCommit(channel: string): boolean {
    return this.tx.notifyAfterCommit?.(channel) ?? false;
  }
}
