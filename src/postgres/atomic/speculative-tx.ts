/**
 * The transaction a speculative work (`effectsInTxOnly`) sees: its statements leave with the key's
 * lookup, and their answers reach it only once the key is known free.
 */
import { AbandonedWorkError, type WorkResult } from "../../core/index.ts";
import type { Tx } from "../db.ts";

/** The speculative work of one `atomic` call, kept across its locked attempts. */
export interface Speculation {
  gate?: SpeculativeTx;
  running?: Promise<WorkResult>;
}

/**
 * The transaction as a speculative work sees it: while the lookup has not answered, its statements are
 * sent at once (pipelined behind the lookup), but their answers reach the work only once the lookup
 * found the key free. Once the key is known taken (or the lookup failed), every statement, pending or
 * new, rejects with `AbandonedWorkError`, and nothing more is sent: the transaction is rolling back,
 * and a statement sent after its ROLLBACK would run on its own. When the key's lock was busy, the
 * waiting statements are sent again in the next attempt's transaction (`retryOn`).
 */
export class SpeculativeTx implements Tx {
  private state: "pending" | "free" | "taken" = "pending";
  /** Settles when this attempt is decided (free, taken) or replaced by the next one (`retryOn`). */
  private turn!: Promise<void>;
  private endTurn!: () => void;
  constructor(private tx: Tx) {
    this.newTurn();
  }
  private newTurn(): void {
    this.turn = new Promise<void>((resolve) => {
      this.endTurn = resolve;
    });
  }
  /** Whether the work still waits to learn whether its key is free. */
  get waiting(): boolean {
    return this.state === "pending";
  }
  /** The lookup found the key free: the statements' answers reach the work from now on. */
  free(): void {
    this.state = "free";
    this.endTurn();
  }
  /** The key is taken: the work's statements are abandoned from now on. True if the work was waiting. */
  abandon(): boolean {
    const waiting = this.state === "pending";
    this.state = "taken";
    this.endTurn();
    return waiting;
  }
  /** The key's lock was busy: the waiting statements are sent again in `tx`, the next attempt's. */
  retryOn(tx: Tx): void {
    this.tx = tx;
    const ended = this.endTurn;
    this.newTurn();
    ended();
  }
  get raw(): unknown {
    return this.tx.raw;
  }
  get pipelined(): boolean | undefined {
    return this.tx.pipelined;
  }
  private async gate<T>(send: (tx: Tx) => Promise<T>): Promise<T> {
    for (;;) {
      if (this.state === "free") return send(this.tx);
      if (this.state === "taken") throw new AbandonedWorkError();
      const turn = this.turn;
      const sent = send(this.tx);
      sent.catch(() => {});
      await turn;
      if (this.turn !== turn) continue; // sent in an aborted transaction: send it again (or be told)
      if ((this.state as SpeculativeTx["state"]) === "free") return sent; // changed meanwhile
      throw new AbandonedWorkError();
    }
  }
  query<R>(sql: string, params?: readonly unknown[]) {
    return this.gate((tx) => tx.query<R>(sql, params));
  }
  exec(sql: string): Promise<void> {
    return this.gate((tx) => tx.exec(sql));
  }
  final(sql: string, params?: readonly unknown[]): void {
    this.tx.final(sql, params);
  }
}
