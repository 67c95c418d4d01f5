/**
 * Intents and where they are kept.
 *
 * An intent is one side effect the caller means to cause once ("charge order 42"). It gets its
 * idempotency key when it begins; every attempt, in this process or after a restart, sends that key.
 * The store keeps the key next to the request it belongs to, so that a restarted process can list
 * what is still pending and send it again with the same key.
 */
import type { OperationState } from "./answer.ts";
import { newIdempotencyKey } from "./key.ts";

/** Where an intent stands. */
export const IntentStatus = {
  /**
   * No final answer yet. It may or may not have taken effect: resending it with its key is safe
   * until the server forgets the key (`expiresAt`).
   */
  pending: "pending",
  /**
   * A final answer (2xx or a final 4xx such as 402 or 422) arrived; `outcome.status` holds it.
   * (Only named intents are kept in this state; unnamed ones are deleted when done.)
   */
  done: "done",
  /** The caller gave up on it for good (`client.abandon`). Its key is never reused. */
  abandoned: "abandoned",
  /**
   * The server answered `operation_state: "uncertain"`: an external call started and its outcome
   * cannot be established. Never resent automatically (with either key): `lastAnswer.operationRef`
   * goes to a person, who settles it and then calls `client.abandon`.
   */
  uncertain: "uncertain",
} as const;
/** One of the values of {@link IntentStatus}. */
export type IntentStatus = (typeof IntentStatus)[keyof typeof IntentStatus];

/** A request as stored with its intent: enough to send it again after a restart. */
export interface StoredRequest {
  /** The HTTP method. */
  method: string;
  /** Absolute URL (or as given, when it was relative and there was no base to resolve it against). */
  url: string;
  /**
   * Header pairs, lower-cased. Credentials (`authorization`, `cookie`, `proxy-authorization`) and the
   * idempotency-key header are never stored: give credentials through the client's `headers` option.
   */
  headers: [string, string][];
  /** The body: text as is, bytes as base64. Absent for requests without one. */
  body?: { text: string } | { base64: string };
}

/** One intent, as kept by a store. Plain JSON-compatible data. */
export interface IntentRecord {
  /**
   * The caller's id for the intent (e.g. "checkout-42"), unique in a store. An intent begun without
   * one gets its key as id; such unnamed intents are deleted from the store once they are done.
   */
  id: string;
  /** The idempotency key sent with every attempt. */
  key: string;
  /** Where the intent stands: pending, done, or uncertain ({@link IntentStatus}). */
  status: IntentStatus;
  /** The request, recorded before its first attempt is sent. Absent until then. */
  request?: StoredRequest;
  /**
   * Attempts made so far, over every process that worked on it. Each is counted in the store
   * before it is sent, so a process killed mid-attempt leaves it counted.
   */
  attempts: number;
  /** The final answer's status, once `status` is `done`. */
  outcome?: { status: number };
  /**
   * What the server last said about the operation: the status, and, when the server sent them,
   * `operationState`, `safeNewKey` (a new key cannot duplicate it: see `client.retryWithNewKey`) and
   * `operationRef` (for an operator). Recorded when a call ends.
   */
  lastAnswer?: IntentAnswer;
  /**
   * When the server forgets the key (its `Idempotency-Expires`, ISO 8601), as last reported. After
   * it, the same key would be new to the server, so the client refuses to send it again.
   */
  expiresAt?: string;
  /** ISO 8601 timestamps. */
  createdAt: string;
  /** ISO 8601: when the record was last saved. */
  updatedAt: string;
}

/** What the server last said about an intent's operation. */
export interface IntentAnswer {
  /** The response status. */
  status: number;
  /** The operation's state, when the server reported one. */
  operationState?: OperationState;
  /** True only when the server said a new key cannot duplicate the operation. */
  safeNewKey?: boolean;
  /** The server's reference of the operation, for an operator. */
  operationRef?: string;
}

/** A handle on an intent: its record, or its id. */
export type IntentRef = IntentRecord | string;

/**
 * Where intents are kept. Implementations: {@link MemoryIntentStore}, `LocalStorageIntentStore`,
 * `FileIntentStore` (`idem/client/file`), `PostgresIntentStore` (`idem/client/postgres`).
 */
export interface IntentStore {
  /** Insert `record` unless an intent with its id exists; resolve to whichever record is stored. */
  create(record: IntentRecord): Promise<IntentRecord>;
  /** The record with this id, or undefined. */
  get(id: string): Promise<IntentRecord | undefined>;
  /** Replace the stored record with this id (insert it if missing). */
  save(record: IntentRecord): Promise<void>;
  /** Every record, or those with the given status, oldest first. */
  list(filter?: { status?: IntentStatus }): Promise<IntentRecord[]>;
  /** Remove the record with this id (nothing when there is none). */
  delete(id: string): Promise<void>;
}

/** A fresh pending intent record with a new random key. `id` defaults to the key. */
export function newIntentRecord(id?: string, now?: Date): IntentRecord {
  const key = newIdempotencyKey();
  const at = now ? now.toISOString() : isoNow();
  return { id: id ?? key, key, status: IntentStatus.pending, attempts: 0, createdAt: at, updatedAt: at };
}

let minuteMs = Number.NaN;
let minutePrefix = "";

/**
 * `new Date(ms).toISOString()`, the same string, for a fraction of the cost (the client stamps every
 * intent: docs/decisions/client-iso-timestamps.md): the "YYYY-MM-DDTHH:MM:" part is kept for
 * the current minute and only seconds and milliseconds are formatted.
 */
export function isoNow(ms: number = Date.now()): string {
  const into = ms - minuteMs;
  if (!(into >= 0 && into < 60_000)) {
    // Before 1970 (negative remainders) and after 9999 (six-digit years): the plain way.
    if (!(ms >= 0 && ms < 253_402_300_800_000)) return new Date(ms).toISOString();
    minuteMs = ms - (ms % 60_000);
    minutePrefix = new Date(minuteMs).toISOString().slice(0, 17);
    return isoNow(ms);
  }
  const s = Math.floor(into / 1000);
  const milli = Math.floor(into - s * 1000);
  return `${minutePrefix}${s < 10 ? "0" : ""}${s}.${milli < 100 ? (milli < 10 ? "00" : "0") : ""}${milli}Z`;
}

/** Intent ids are 1..255 visible ASCII characters, like keys. */
export function assertIntentId(id: string): void {
  if (typeof id !== "string" || !/^[\x21-\x7e]{1,255}$/.test(id)) {
    throw new TypeError(`Intent id must be 1..255 visible ASCII characters, got ${JSON.stringify(id)}`);
  }
}

export function sortOldestFirst(records: IntentRecord[]): IntentRecord[] {
  return records.sort((a, b) =>
    a.createdAt < b.createdAt ? -1 : a.createdAt > b.createdAt ? 1 : a.id < b.id ? -1 : 1,
  );
}

/**
 * Intents in this process's memory only: lost on restart. The default store; good for tests.
 * Records are copied in and out (top-level fields; a stored request is never modified in place).
 */
export class MemoryIntentStore implements IntentStore {
  readonly #records = new Map<string, IntentRecord>();

  /** Insert `record` unless an intent with its id exists; resolve to whichever record is stored. */
  async create(record: IntentRecord): Promise<IntentRecord> {
    const existing = this.#records.get(record.id);
    if (existing) return { ...existing };
    this.#records.set(record.id, { ...record });
    return record;
  }

  /** The record with this id, or undefined. */
  async get(id: string): Promise<IntentRecord | undefined> {
    const r = this.#records.get(id);
    return r && { ...r };
  }

  /** Replace the stored record with this id (insert it if missing). */
  async save(record: IntentRecord): Promise<void> {
    this.#records.set(record.id, { ...record });
  }

  /** Every record, or those with the given status, oldest first. */
  async list(filter: { status?: IntentStatus } = {}): Promise<IntentRecord[]> {
    const out: IntentRecord[] = [];
    for (const r of this.#records.values()) {
      if (!filter.status || r.status === filter.status) out.push({ ...r });
    }
    return sortOldestFirst(out);
  }

  /** Remove the record with this id (nothing when there is none). */
  async delete(id: string): Promise<void> {
    this.#records.delete(id);
  }
}
