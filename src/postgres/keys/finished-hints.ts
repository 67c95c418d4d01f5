/**
 * Keys this process saw finished (saved or replayed), with when they expire (epoch ms): a retry of one
 * is read first with one lock-free statement (a finished key never changes until it expires). A hint
 * only: a key swept, expired or unknown here takes the locked path, and the read decides.
 *
 * Bounded, in two generations: when the newer holds half the capacity it becomes the older one, and the
 * older is dropped whole (the oldest go first). Not one eviction per key: `keys().next()` on a Map whose
 * front was deleted from skips the deleted entries each time (V8 keeps them until it rehashes), a cost
 * per saved key once full, when every request brings a new key (docs/decisions/finished-key-hints.md).
 */
export class FinishedHints {
  private newer = new Map<string, number>();
  private older = new Map<string, number>();

  /** `capacity`: how many keys at most (about 100 bytes each). */
  constructor(private readonly capacity = 10_000) {}

  /** When the key expires, if this process remembers it finished. */
  get(id: string): number | undefined {
    return this.newer.get(id) ?? this.older.get(id);
  }

  remember(id: string, expiresAtMs: number): void {
    if (this.newer.get(id) === expiresAtMs) return; // a replay of a key remembered already
    this.older.delete(id); // kept in the newer generation only
    this.newer.set(id, expiresAtMs);
    if (this.newer.size >= this.capacity / 2) {
      this.older = this.newer;
      this.newer = new Map();
    }
  }

  forget(id: string): void {
    this.newer.delete(id);
    this.older.delete(id);
  }
}
