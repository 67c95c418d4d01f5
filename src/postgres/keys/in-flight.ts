/**
 * This process's calls in progress by key, and the duplicates waiting behind each one in memory
 * (holding no pooled connection): the key gate's in-process queue (gate.ts), which every mode passes.
 *
 * A call alone allocates nothing (its entry is null); the first duplicate makes the waiting list. When
 * the call ends, a finished key wakes every waiter at once (each reads the replay, side by side);
 * otherwise the key is handed to the first waiter only, which runs it, and the others keep waiting.
 */

/**
 * The id of a claim's key in this process's maps (in flight, finished): the scope's length keeps
 * ("ab", "c") and ("a", "bc") apart.
 */
export function keyIdOf(claim: { scope: string; key: string }): string {
  return `${claim.scope.length}:${claim.scope}${claim.key}`;
}

/** How a wait behind the call in flight ended. */
export type Woken = "finished" | "yours" | "timeout";

/** The duplicates waiting behind the call in flight for one key, in arrival order. */
type Waiters = Array<(woken: Woken) => void>;

export class KeysInFlight {
  private readonly calls = new Map<string, Waiters | null>();

  /** Whether a call for `id` is in progress in this process. */
  has(id: string): boolean {
    return this.calls.has(id);
  }

  /** Mark `id` as in progress by the caller (which ends it with `leave`). */
  enter(id: string): void {
    this.calls.set(id, null);
  }

  /** Wait behind the call in progress for `id`, at most `ms`. */
  wait(id: string, ms: number): Promise<Woken> {
    let waiters = this.calls.get(id);
    if (!waiters) {
      waiters = [];
      this.calls.set(id, waiters);
    }
    const list = waiters;
    return new Promise<Woken>((resolve) => {
      const wake = (woken: Woken) => {
        clearTimeout(timer);
        resolve(woken);
      };
      const timer = setTimeout(
        () => {
          const i = list.indexOf(wake);
          if (i >= 0) list.splice(i, 1);
          resolve("timeout");
        },
        Math.max(0, ms),
      );
      list.push(wake);
    });
  }

  /** The call for `id` ended: every waiter reads a finished key; otherwise the first one takes it. */
  leave(id: string, finished: boolean): void {
    const waiters = this.calls.get(id);
    if (finished || !waiters?.length) {
      this.calls.delete(id);
      if (waiters) for (const wake of waiters.splice(0)) wake("finished");
    } else waiters.shift()!("yours");
  }
}
