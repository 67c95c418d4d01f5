/**
 * Intents in the browser's `localStorage`, so a reload or a crashed tab retries with the same key.
 * One entry per intent under `<prefix><id>`. Storage is synchronous and per-origin; tabs of one
 * origin share it.
 */
import { type IntentRecord, type IntentStatus, type IntentStore, sortOldestFirst } from "./intent-store.ts";

/** The part of the Web Storage API this store uses (so tests can pass a stand-in). */
export interface StorageLike {
  /** How many entries there are. */
  readonly length: number;
  /** The name of the entry at `index`, or null. */
  key(index: number): string | null;
  /** The entry's value, or null. */
  getItem(key: string): string | null;
  /** Set the entry's value. */
  setItem(key: string, value: string): void;
  /** Remove the entry. */
  removeItem(key: string): void;
}

/** Options of {@link LocalStorageIntentStore}. */
export interface LocalStorageIntentStoreOptions {
  /** The storage to use. Default `globalThis.localStorage` (throws if there is none). */
  storage?: StorageLike;
  /** Prefix of every entry's name. Default `"idem:intent:"`. */
  prefix?: string;
}

/** An {@link IntentStore} in the browser's `localStorage` (see the module's notes). */
export class LocalStorageIntentStore implements IntentStore {
  readonly #storage: StorageLike;
  readonly #prefix: string;

  constructor(options: LocalStorageIntentStoreOptions = {}) {
    const storage = options.storage ?? (globalThis as { localStorage?: StorageLike }).localStorage;
    if (!storage) throw new TypeError("LocalStorageIntentStore: no localStorage here; pass `storage`");
    this.#storage = storage;
    this.#prefix = options.prefix ?? "idem:intent:";
  }

  /** Insert `record` unless an intent with its id exists; resolve to whichever record is stored. */
  async create(record: IntentRecord): Promise<IntentRecord> {
    const existing = this.#read(this.#prefix + record.id);
    if (existing) return existing;
    this.#storage.setItem(this.#prefix + record.id, JSON.stringify(record));
    return record;
  }

  /** The record with this id, or undefined. */
  async get(id: string): Promise<IntentRecord | undefined> {
    return this.#read(this.#prefix + id);
  }

  /** Replace the stored record with this id (insert it if missing). */
  async save(record: IntentRecord): Promise<void> {
    this.#storage.setItem(this.#prefix + record.id, JSON.stringify(record));
  }

  /** Every record, or those with the given status, oldest first. */
  async list(filter: { status?: IntentStatus } = {}): Promise<IntentRecord[]> {
    const out: IntentRecord[] = [];
    for (let i = 0; i < this.#storage.length; i++) {
      const name = this.#storage.key(i);
      if (name === null || !name.startsWith(this.#prefix)) continue;
      const r = this.#read(name);
      if (r && (!filter.status || r.status === filter.status)) out.push(r);
    }
    return sortOldestFirst(out);
  }

  /** Remove the record with this id (nothing when there is none). */
  async delete(id: string): Promise<void> {
    this.#storage.removeItem(this.#prefix + id);
  }

  #read(name: string): IntentRecord | undefined {
    const raw = this.#storage.getItem(name);
    if (raw === null) return undefined;
    try {
      return JSON.parse(raw) as IntentRecord;
    } catch {
      return undefined; // not ours, or damaged: skip rather than break listing
    }
  }
}
