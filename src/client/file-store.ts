/**
 * Intents in files, for Node: one JSON file per intent in a directory, so a process that crashes
 * or restarts finds its pending intents (and their keys) again. Import from `idem/client/file`.
 *
 * Every write goes to a temporary file that is flushed to disk and then renamed over the real one,
 * so a crash leaves either the old record or the new one, never half of one. File names are the
 * SHA-256 of the intent id, so any id is a safe name.
 */
import { createHash, randomBytes } from "node:crypto";
import { link, mkdir, open, readdir, readFile, rename, unlink } from "node:fs/promises";
import { join } from "node:path";
import { type IntentRecord, type IntentStatus, type IntentStore, sortOldestFirst } from "./intent-store.ts";

/** Options of {@link FileIntentStore}. */
export interface FileIntentStoreOptions {
  /** The directory (created if missing). Default `".idem/client-intents"` under the working directory. */
  dir?: string;
  /** Flush each write to the disk before renaming it into place (survives power loss). Default true. */
  fsync?: boolean;
}

/** Intents as files in a directory (one per intent, written atomically): they survive a restart. */
export class FileIntentStore implements IntentStore {
  /** The directory the intents are in. */
  readonly dir: string;
  readonly #fsync: boolean;
  #ready: Promise<unknown> | undefined;

  constructor(options: FileIntentStoreOptions = {}) {
    this.dir = options.dir ?? ".idem/client-intents";
    this.#fsync = options.fsync ?? true;
  }

  /** Insert `record` unless an intent with its id exists; resolve to whichever record is stored. */
  async create(record: IntentRecord): Promise<IntentRecord> {
    const file = await this.#pathOf(record.id);
    const tmp = await this.#writeTemp(record);
    try {
      // link() fails with EEXIST when the intent exists: create-if-absent in one atomic step.
      await link(tmp, file);
      return record;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
      const existing = await this.#read(file);
      if (!existing) throw new Error(`FileIntentStore: unreadable intent file ${file}`);
      return existing;
    } finally {
      await unlink(tmp).catch(() => {});
    }
  }

  /** The record with this id, or undefined. */
  async get(id: string): Promise<IntentRecord | undefined> {
    return this.#read(await this.#pathOf(id));
  }

  /** Replace the stored record with this id (insert it if missing). */
  async save(record: IntentRecord): Promise<void> {
    const file = await this.#pathOf(record.id);
    const tmp = await this.#writeTemp(record);
    await rename(tmp, file);
  }

  /** Every record, or those with the given status, oldest first. */
  async list(filter: { status?: IntentStatus } = {}): Promise<IntentRecord[]> {
    await this.#mkdir();
    const out: IntentRecord[] = [];
    for (const name of await readdir(this.dir)) {
      if (!name.endsWith(".json")) continue;
      const r = await this.#read(join(this.dir, name));
      if (r && (!filter.status || r.status === filter.status)) out.push(r);
    }
    return sortOldestFirst(out);
  }

  /** Remove the record with this id (nothing when there is none). */
  async delete(id: string): Promise<void> {
    await unlink(await this.#pathOf(id)).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== "ENOENT") throw err;
    });
  }

  async #pathOf(id: string): Promise<string> {
    await this.#mkdir();
    return join(this.dir, `${createHash("sha256").update(id).digest("hex")}.json`);
  }

  #mkdir(): Promise<unknown> {
    this.#ready ??= mkdir(this.dir, { recursive: true }).catch((err) => {
      this.#ready = undefined;
      throw err;
    });
    return this.#ready;
  }

  async #writeTemp(record: IntentRecord): Promise<string> {
    const tmp = join(this.dir, `.${randomBytes(8).toString("hex")}.tmp`);
    const handle = await open(tmp, "w");
    try {
      await handle.writeFile(JSON.stringify(record));
      if (this.#fsync) await handle.sync();
    } finally {
      await handle.close();
    }
    return tmp;
  }

  async #read(file: string): Promise<IntentRecord | undefined> {
    let raw: string;
    try {
      raw = await readFile(file, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw err;
    }
    try {
      return JSON.parse(raw) as IntentRecord;
    } catch {
      return undefined;
    }
  }
}
