/**
 * Reads of one key's row without a lock, shared while they are in flight: a replay of a finished key
 * that comes while this process is already reading that key waits for the read on its way instead of
 * sending its own. A retry storm on one key (every client retrying the same payment at once) then costs
 * the database one read per round trip, not one per retry.
 *
 * Why this does not change an answer: a finished key row never changes until it expires, so a read
 * that started a moment earlier returns what a new one would. Whatever such a read does not settle
 * (no live row, an unfinished or compact one) sends the caller to the locked path, as before. The one
 * difference is a key forgotten by an operator while the read is on its way: the callers that joined
 * it get the answer a read sent just before the forget gets anyway.
 *
 * Nothing is kept once the read settles: this is not a cache.
 */
export class SharedReads<T> {
  private readonly reading = new Map<string, Promise<T>>();

  /**
   * The read of `id` in flight, or a new one from `start`. `joined` says whether it is another
   * caller's read: what it returns is then shared, and a joined caller that changes it copies it
   * first. Every caller resumes in the turn the read is answered, in the order they came, before
   * the first one's answer reaches any code that could change it.
   */
  read(id: string, start: () => Promise<T>): { result: Promise<T>; joined: boolean } {
    const current = this.reading.get(id);
    if (current) return { result: current, joined: true };
    // Out of the map before any caller resumes: a call that comes once the read is answered (when a
    // caller may already have changed what it got) starts a read of its own.
    const result = start().then(
      (value) => {
        this.reading.delete(id);
        return value;
      },
      (err: unknown) => {
        this.reading.delete(id);
        throw err;
      },
    );
    this.reading.set(id, result);
    return { result, joined: false };
  }

  /** How many keys are being read now (for tests). */
  get size(): number {
    return this.reading.size;
  }
}
