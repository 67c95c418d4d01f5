/**
 * NOTIFYs sent after a transaction commits, from outside it, for the drivers that run idem's
 * transactions (`Tx.notifyAfterCommit`). The outbox's wake-up used to be a NOTIFY inside every
 * transaction that wrote an event, and PostgreSQL makes each notifying transaction wait for one lock,
 * for the whole cluster, through its commit: busy writers committed one at a time
 * (docs/decisions/outbox-notify.md). Here the writers' transactions notify nobody; a relay is woken by one
 * NOTIFY of its own per burst of commits.
 *
 * Coalesced per database: the first commit after a quiet spell is announced at once; the commits that
 * come while that NOTIFY is under way, and for `gapMs` after it, share the next one. A relay wakes
 * within a round trip of the first commit, and the NOTIFYs of a busy writer stay few (at most one per
 * `gapMs` plus a round trip). A NOTIFY that fails is dropped: relays also poll.
 */
export class AfterCommitNotifier {
  readonly #pending = new Set<string>();
  #busy = false;

  constructor(
    private readonly send: (channel: string) => Promise<unknown>,
    private readonly gapMs = 5,
  ) {}

  /** Announce `channels` (one or more), now or with the next NOTIFY. */
  notify(channels: Iterable<string>): void {
    for (const c of channels) this.#pending.add(c);
    if (!this.#busy) this.#flush();
  }

  readonly #flush = (): void => {
    if (this.#pending.size === 0) {
      this.#busy = false;
      return;
    }
    this.#busy = true;
    const channels = [...this.#pending];
    this.#pending.clear();
    Promise.all(channels.map((c) => this.send(c).catch(() => {}))).then(() => {
      setTimeout(this.#flush, this.gapMs).unref?.(); // a quiet process may exit meanwhile
    });
  };
}

/** The statement the notifier sends, once per channel. */
export const NOTIFY_SQL = "SELECT pg_notify($1, '')";

/**
 * Collects, per transaction, the channels to announce once it commits (`Tx.notifyAfterCommit`).
 * `add` answers true the first time in the transaction.
 */
export class CommitChannels {
  channels: Set<string> | undefined;
  add(channel: string): boolean {
    if (this.channels) {
      this.channels.add(channel);
      return false;
    }
    this.channels = new Set([channel]);
    return true;
  }
}
