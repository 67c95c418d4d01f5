/**
 * Encryption at rest of saved answers and stored inputs: AES-256-GCM under named keys.
 *
 * A sealed value describes itself, so that values written before encryption was turned on (plain
 * bytes) are still read, and so that a value names the key it was sealed with (rotation without
 * downtime: seal with the current key, open with whichever key the value names):
 *
 *   0xFF 'i' 'd' 'm'   magic (0xFF never starts UTF-8 text, so no JSON or text reply is mistaken for it)
 *   0x01               format version
 *   n, id[n]           the key id (1..32 bytes of [A-Za-z0-9_.-])
 *   iv[12]             random per value
 *   ciphertext         as long as the plaintext
 *   tag[16]            GCM authentication tag
 *
 * The header (magic to key id) and a context string (the caller's: e.g. scope, key and column) are
 * authenticated as additional data, so a value moved to another key's row, or a key id edited, fails
 * to open like any tampered value: `SealedValueError`, never garbage.
 *
 * node:crypto only (OpenSSL's AES-GCM); no framework, no driver.
 */
import { createCipheriv, createDecipheriv, hkdfSync, randomFillSync } from "node:crypto";
import { checkedReply, type StoredResponse } from "./response.ts";

/** Seals bytes for storage and opens them again. */
export interface Sealer {
  /** The sealed form of `plain`, bound to `context` (opening needs the same context). */
  seal(plain: Uint8Array, context?: string): Uint8Array;
  /** The plaintext of a sealed value; a value that is not sealed (written before sealing) as it is. */
  open(stored: Uint8Array, context?: string): Uint8Array;
}

/** A sealed value that cannot be opened: tampered, truncated, sealed with a dropped key, or no sealer. */
export class SealedValueError extends Error {
  /** Always `"SealedValueError"`: the name logs and stack traces show. */
  override name = "SealedValueError";
  /**
   * Why: `altered` (it fails authentication, is truncated or malformed: no key can ever open it), or
   * `key-missing` (sealed with a key this process is not given, or read without a sealer: an instance
   * that has the key may open it).
   */
  readonly reason: "altered" | "key-missing";
  constructor(message: string, reason: "altered" | "key-missing", options?: { cause?: unknown }) {
    super(message, options);
    this.reason = reason;
  }
}

/** A sealing key that cannot be used (its id or its bytes): the message says which and how to fix it. */
export class SealingKeyError extends Error {
  /** Always `"SealingKeyError"`: the name logs and stack traces show. */
  override name = "SealingKeyError";
}

const MAGIC = [0xff, 0x69, 0x64, 0x6d] as const;
const VERSION = 1;
const IV_BYTES = 12;
const TAG_BYTES = 16;
const KEY_BYTES = 32;
const KEY_ID = /^[A-Za-z0-9_.-]{1,32}$/;
/** How a sealed value is kept in a JSON column (stored inputs): a string with this prefix. */
export const SEALED_JSON_PREFIX = "sealed:v1:";

/** Whether `stored` is a sealed value (starts with the magic and the version). */
export function isSealed(stored: Uint8Array | null | undefined): boolean {
  if (!stored || stored.length < 6) return false;
  return (
    stored[0] === MAGIC[0] &&
    stored[1] === MAGIC[1] &&
    stored[2] === MAGIC[2] &&
    stored[3] === MAGIC[3] &&
    stored[4] === VERSION
  );
}

/**
 * The plaintext length of a stored value, from its first 6 bytes and its stored length (a sealed
 * value's overhead is fixed by its key id's length): what `inspect` reports without opening it.
 */
export function plainLength(head: Uint8Array | null, storedLength: number): number {
  if (!head || !isSealed(head)) return storedLength;
  return Math.max(0, storedLength - (6 + head[5]! + IV_BYTES + TAG_BYTES));
}

/** One named 32-byte key. */
export interface SealingKey {
  /** Its name, stored in every value it seals: 1-32 characters of A-Z a-z 0-9 _ . - */
  id: string;
  /** Its 32 bytes (make one: `openssl rand -base64 32`). */
  key: Uint8Array;
}

/**
 * A sealer with several named keys that can seal with any of them: what a store needs to seal with the
 * key its database says is promoted (postgres/sealing-keys.ts) rather than with this process's first.
 */
export interface KeyedSealer extends Sealer {
  /** The key ids this sealer can open, its own choice for sealing first. */
  readonly ids: string[];
  /** `seal`, with the key named `id` (one of `ids`). */
  sealWith(id: string, plain: Uint8Array, context?: string): Uint8Array;
  /**
   * A 32-byte secret derived from the key named `id` for another use (`purpose`), e.g. sealing the
   * operation references: the same keys and the same rotation, never the same bytes. Optional.
   */
  derive?(id: string, purpose: string): Uint8Array;
}

/** Whether `sealer` can seal with a key it is told (`KeyedSealer`). */
export function isKeyedSealer(sealer: Sealer | undefined): sealer is KeyedSealer {
  const s = sealer as Partial<KeyedSealer> | undefined;
  return !!s && Array.isArray(s.ids) && typeof s.sealWith === "function";
}

/**
 * AES-256-GCM under one or more named keys. Used alone, the first key seals; every key opens the values
 * that name it. Given to a `PostgresStore`, it seals with the key the database records as promoted
 * (`idem keys promote`), which every running instance has been checked to open: see docs/operations.md.
 */
export class AesGcmSealer implements Sealer {
  /** The id of the key `seal` uses (the first given). */
  readonly currentId: string;
  private readonly keys = new Map<string, Buffer>();
  private readonly headers = new Map<string, Buffer>();

  constructor(keys: readonly SealingKey[]) {
    if (keys.length === 0) throw new SealingKeyError("AesGcmSealer needs at least one key");
    for (const { id, key } of keys) {
      if (!KEY_ID.test(id)) {
        throw new SealingKeyError(
          `sealing key id ${JSON.stringify(id)} must be 1-32 characters of A-Z a-z 0-9 _ . -`,
        );
      }
      if (this.keys.has(id)) throw new SealingKeyError(`sealing key id "${id}" is given twice`);
      if (key.length !== KEY_BYTES) {
        throw new SealingKeyError(
          `sealing key "${id}" is ${key.length} bytes, needs ${KEY_BYTES} (make one: openssl rand -base64 32)`,
        );
      }
      this.keys.set(id, Buffer.from(key));
    }
    this.currentId = keys[0]!.id;
    for (const id of this.keys.keys()) {
      const bytes = Buffer.from(id, "utf8");
      this.headers.set(id, Buffer.concat([Buffer.from([...MAGIC, VERSION, bytes.length]), bytes]));
    }
  }

  /** The key ids this sealer can open, the current one first. */
  get ids(): string[] {
    return [...this.keys.keys()];
  }

  /** Seal `plain` with the current key (`currentId`), bound to `context`. */
  seal(plain: Uint8Array, context = ""): Uint8Array {
    return this.sealWith(this.currentId, plain, context);
  }

  /** Seal `plain` with the key named `id`; a `SealingKeyError` when this sealer has no such key. */
  sealWith(id: string, plain: Uint8Array, context = ""): Uint8Array {
    const key = this.keys.get(id);
    const header = this.headers.get(id);
    if (!key || !header) throw new SealingKeyError(`cannot seal with key "${id}": it is not configured`);
    const iv = nextIv();
    const cipher = createCipheriv("aes-256-gcm", key, iv);
    cipher.setAAD(aad(header, context));
    const body = cipher.update(plain);
    cipher.final(); // GCM is a stream mode: nothing is held back
    return Buffer.concat([header, iv, body, cipher.getAuthTag()]);
  }

  /** HKDF-SHA256 of the key named `id`, for `purpose` (32 bytes): see `KeyedSealer.derive`. */
  derive(id: string, purpose: string): Uint8Array {
    const key = this.keys.get(id);
    if (!key) throw new SealingKeyError(`cannot derive from key "${id}": it is not configured`);
    return new Uint8Array(hkdfSync("sha256", key, new Uint8Array(0), `idem ${purpose}`, KEY_BYTES));
  }

  /**
   * Open a sealed value with the key it names; a value that is not sealed comes back as it is. A
   * `SealedValueError` when it was tampered with, is truncated, or names a key this sealer lacks.
   */
  open(stored: Uint8Array, context = ""): Uint8Array {
    if (!isSealed(stored)) return stored;
    const idLength = stored[5]!;
    const start = 6 + idLength;
    if (stored.length < start + IV_BYTES + TAG_BYTES) {
      throw new SealedValueError(`a sealed value is truncated (${stored.length} bytes)`, "altered");
    }
    const buf = Buffer.from(stored.buffer, stored.byteOffset, stored.byteLength);
    const id = buf.toString("utf8", 6, start);
    const key = this.keys.get(id);
    if (!key) {
      throw new SealedValueError(
        `a value was sealed with key "${id}", which is not configured (keys: ${this.ids.join(", ")}): ` +
          "keep a key until every value sealed with it has expired",
        "key-missing",
      );
    }
    const decipher = createDecipheriv("aes-256-gcm", key, buf.subarray(start, start + IV_BYTES));
    decipher.setAAD(aad(buf.subarray(0, start), context));
    decipher.setAuthTag(buf.subarray(buf.length - TAG_BYTES));
    const body = decipher.update(buf.subarray(start + IV_BYTES, buf.length - TAG_BYTES));
    try {
      decipher.final();
    } catch {
      throw new SealedValueError(
        `a value sealed with key "${id}" failed authentication: it was altered, or moved from another row`,
        "altered",
      );
    }
    return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  }
}

/*
 * Random IVs, drawn from a pool refilled 4 KiB at a time: one call into OpenSSL per 341 values instead
 * of one per value (it was a third of a seal's time). Random 96-bit IVs are safe for 2^32 values per
 * key (NIST SP 800-38D); rotating keys yearly keeps far below that.
 */
const ivPool = Buffer.alloc(IV_BYTES * 341);
let ivAt = ivPool.length;

function nextIv(): Buffer {
  if (ivAt + IV_BYTES > ivPool.length) {
    randomFillSync(ivPool);
    ivAt = 0;
  }
  const iv = Buffer.from(ivPool.subarray(ivAt, ivAt + IV_BYTES)); // a copy: the pool is refilled later
  ivAt += IV_BYTES;
  return iv;
}

function aad(header: Uint8Array, context: string): Buffer {
  return Buffer.concat([header, Buffer.from(context, "utf8")]);
}

/**
 * The sealer described by an environment variable (default `IDEM_ENCRYPTION_KEYS`), or undefined when
 * it is unset or empty. Its value: comma-separated `id:base64` pairs of 32-byte keys, the current one
 * first, e.g. `k2:<base64>,k1:<base64>`. Throws `SealingKeyError` (one line, naming the variable and
 * the key) for anything else.
 */
export function sealerFromEnv(
  env: Record<string, string | undefined> = process.env,
  name = "IDEM_ENCRYPTION_KEYS",
): AesGcmSealer | undefined {
  const value = env[name]?.trim();
  if (!value) return undefined;
  const keys: SealingKey[] = [];
  for (const part of value.split(",")) {
    const item = part.trim();
    const colon = item.indexOf(":");
    if (colon <= 0) {
      throw new SealingKeyError(
        `${name}: expected id:base64-key pairs separated by commas, got "${clip(item)}"`,
      );
    }
    const id = item.slice(0, colon);
    const b64 = item.slice(colon + 1).trim();
    if (!/^[A-Za-z0-9+/_-]+={0,2}$/.test(b64)) {
      throw new SealingKeyError(`${name}: key "${id}" is not base64 (make one: openssl rand -base64 32)`);
    }
    keys.push({ id, key: Buffer.from(b64, "base64") });
  }
  try {
    return new AesGcmSealer(keys);
  } catch (err) {
    if (err instanceof SealingKeyError) throw new SealingKeyError(`${name}: ${err.message}`);
    throw err;
  }
}

function clip(s: string): string {
  // Never echo a whole secret into a log line.
  return s.length > 8 ? `${s.slice(0, 8)}...` : s;
}

// ---- what stores use: plain when there is no sealer, and sealed values never returned unopened ----

/** The bytes to store for `plain`: sealed when there is a sealer, else as they are. */
export function sealBytes(sealer: Sealer | undefined, plain: Uint8Array, context: string): Uint8Array {
  return sealer ? sealer.seal(plain, context) : plain;
}

/**
 * The plaintext of stored bytes. A value written before sealing was turned on is returned as it is;
 * a sealed value read without a sealer is a `SealedValueError`, never handed out as ciphertext.
 */
export function openBytes(sealer: Sealer | undefined, stored: Uint8Array, context: string): Uint8Array {
  if (sealer) return sealer.open(stored, context);
  if (isSealed(stored)) {
    throw new SealedValueError(
      "a stored value is sealed, but the store was opened without a sealer",
      "key-missing",
    );
  }
  return stored;
}

/** The JSON value to store for a JSON input: with a sealer, one string `sealed:v1:<base64>`. */
export function sealJson(sealer: Sealer | undefined, value: unknown, context: string): unknown {
  if (!sealer) return value ?? null;
  const plain = new TextEncoder().encode(JSON.stringify(value ?? null));
  return SEALED_JSON_PREFIX + Buffer.from(sealer.seal(plain, context)).toString("base64");
}

/** Saved answer headers as stored: sealed with a sealer (`sealJson`), as they are otherwise. */
export function sealHeaders(
  sealer: Sealer | undefined,
  headers: Array<[string, string]>,
  scope: string,
  key: string,
): string {
  return JSON.stringify(sealJson(sealer, headers, sealContext(scope, key, "headers")));
}

/** Saved answer headers as read back (`sealHeaders`' inverse); none stored: none. */
export function openHeaders(
  sealer: Sealer | undefined,
  stored: unknown,
  scope: string,
  key: string,
): Array<[string, string]> {
  const h = openJson(sealer, stored, sealContext(scope, key, "headers"));
  return Array.isArray(h) ? (h as Array<[string, string]>) : [];
}

/**
 * The saved answer of a finished key, opened and checked: what a replay sends (atomic and phases mode
 * alike). A value that cannot be opened throws `SealedValueError`, a damaged one `DamagedReplyError`.
 */
export function openReply(
  sealer: Sealer | undefined,
  row: { status: unknown; headers: unknown; body: Uint8Array | null },
  scope: string,
  key: string,
): StoredResponse {
  const headers = openJson(sealer, row.headers, sealContext(scope, key, "headers"));
  const body = openBytes(sealer, row.body ?? new Uint8Array(), sealContext(scope, key, "body"));
  return checkedReply(row.status, headers, body);
}

/**
 * A phases key's data as written: in clear, only the phase's `data` (the SQL merges it into the row's);
 * with a sealer, the whole value (`before` merged with `data`), sealed (the SQL replaces the row's).
 */
export function phaseDataParam(
  sealer: Sealer | undefined,
  claim: { scope: string; key: string },
  before: object,
  data: object | undefined,
): string {
  if (!sealer) return JSON.stringify(data ?? {});
  return JSON.stringify(
    sealJson(sealer, { ...before, ...data }, sealContext(claim.scope, claim.key, "phase_data")),
  );
}

/** A phases key's data as stored (`phaseDataParam`'s), opened when sealed. */
export function openPhaseData(
  sealer: Sealer | undefined,
  stored: unknown,
  scope: string,
  key: string,
): Record<string, unknown> {
  const data = openJson(sealer, stored, sealContext(scope, key, "phase_data"));
  return data && typeof data === "object" && !Array.isArray(data) ? (data as Record<string, unknown>) : {};
}

/** The JSON input a stored JSON value holds (`sealJson`'s inverse; a value stored in clear as it is). */
export function openJson(sealer: Sealer | undefined, stored: unknown, context: string): unknown {
  if (typeof stored !== "string" || !stored.startsWith(SEALED_JSON_PREFIX)) return stored;
  const bytes = Buffer.from(stored.slice(SEALED_JSON_PREFIX.length), "base64");
  if (!isSealed(bytes)) {
    throw new SealedValueError("a stored input looks sealed but is not a sealed value", "altered");
  }
  return JSON.parse(new TextDecoder().decode(openBytes(sealer, bytes, context)));
}

/**
 * The context a stored value is bound to: its key and which column it is. A reply's headers are sealed
 * with its body (they carry ids, e.g. `Location`), kept in their JSON column as `sealed:v1:<base64>`.
 */
export function sealContext(
  scope: string,
  key: string,
  column: "body" | "headers" | "request" | "phase_data",
): string {
  return `${column}\0${scope.length}:${scope}\0${key}`;
}
