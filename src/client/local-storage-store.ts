/**
 * Intents in the browser's `localStorage`, so a reload or a crashed tab retries with the same key.
 * One entry per intent under `<prefix><id>`. Storage is synchronous and per-origin; tabs of one
 * origin share it.
 */
import { type IntentRecord, type IntentStatus, type IntentStore, sortOldestFirst } from "./intent-store.ts";

/** The part of the Web Storage API this store uses (so tests can pass a stand-in). */
export interface StorageLike {
  readonly length: number;
  key(index: number): string | null;
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

export interface LocalStorageIntentStoreOptions {
  /** The storage to use. Default `globalThis.localStorage` (throws if there is none). */
  storage?: StorageLike;
  /** Prefix of every entry's name. Default `"idem:intent:"`. */
  prefix?: string;
}

export class LocalStorageIntentStore implements IntentStore {
  readonly #storage: StorageLike;
  readonly #prefix: string;

  constructor(options: LocalStorageIntentStoreOptions = {}) {
    const storage = options.storage ?? (globalThis as { localStorage?: StorageLike }).localStorage;
    if (!storage) throw new TypeError("LocalStorageIntentStore: no localStorage here; pass `storage`");
    this.#storage = storage;
    this.#prefix = options.prefix ?? "idem:intent:";
  }

  async create(record: IntentRecord): Promise<IntentRecord> {
    const existing = this.#read(this.#prefix + record.id);
    if (existing) return existing;
    this.#storage.setItem(this.#prefix + record.id, JSON.stringify(record));
    return record;
  }

  async get(id: string): Promise<IntentRecord | undefined> {
    return this.#read(this.#prefix + id);
  }

  async save(record: IntentRecord): Promise<void> {
    this.#storage.setItem(this.#prefix + record.id, JSON.stringify(record));
  }

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
