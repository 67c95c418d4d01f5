/**
 * Reading a request body once, into the one value that is both fingerprinted and handed to the handler
 * (`c.var.idempotency.body`, `req.idempotency.body`, `request.idempotency.body`, `ctx.body`).
 *
 * A body that can be read more than one way is refused before anything is claimed: a repeated form
 * field (unless the route declares it repeatable; its values then keep their order) or a duplicate
 * JSON object key at any depth. Otherwise two bodies with one fingerprint could mean two different
 * things to a handler that takes the first (or the last) of the repeated values.
 */
import { AmbiguousBodyError, InvalidBodyError } from "./errors.ts";

/** How a Content-Type is read: JSON (`application/json`, `*+json`), a form, or bytes. */
export function bodyKind(contentType: string | null | undefined): "json" | "form" | "raw" {
  const ct = (contentType ?? "").split(";")[0]!.trim().toLowerCase();
  if (ct === "application/json" || ct.endsWith("+json")) return "json";
  if (ct === "application/x-www-form-urlencoded") return "form";
  return "raw";
}

/** A form body's fields: one string each, an array (in the order sent) for repeatable fields. */
export type FormFields = Record<string, string | string[]>;

/** The body as read once: its kind, the value the handler acts on, and the bytes as they came. */
export type RequestBody =
  | { kind: "none"; value: undefined; bytes: Uint8Array }
  | { kind: "json"; value: unknown; bytes: Uint8Array }
  | { kind: "form"; value: FormFields; bytes: Uint8Array }
  | { kind: "raw"; value: Uint8Array; bytes: Uint8Array };

export interface ReadBodyOptions {
  /** Form fields that may appear more than once; their value is an array in the order sent. Default: none. */
  repeatable?: readonly string[];
}

/** JSON nested deeper than this is refused (400): deeper bodies are not payment requests, and it bounds recursion. */
export const MAX_JSON_DEPTH = 256;

const EMPTY = new Uint8Array(0);
/** The body of a request that has none (also what a failure answer is built with when none was read). */
export const NO_BODY: RequestBody = { kind: "none", value: undefined, bytes: EMPTY };
const utf8 = new TextDecoder("utf-8", { fatal: true });

function decode(bytes: Uint8Array): string {
  try {
    return utf8.decode(bytes);
  } catch {
    throw new InvalidBodyError("The request body is not valid UTF-8.");
  }
}

/**
 * Read a body by its Content-Type. Throws `InvalidBodyError` (not JSON or not UTF-8 when it says it is)
 * or `AmbiguousBodyError` (a repeated form field or a duplicate JSON key), both answered 400.
 */
export function readRequestBody(
  contentType: string | null | undefined,
  bytes: Uint8Array,
  options: ReadBodyOptions = {},
): RequestBody {
  if (bytes.length === 0) return NO_BODY;
  const kind = bodyKind(contentType);
  if (kind === "json") return { kind, value: parseStrictJson(decode(bytes)), bytes };
  if (kind === "form") return { kind, value: parseForm(decode(bytes), options.repeatable), bytes };
  return { kind, value: bytes, bytes };
}

/** A body a framework parsed before idem saw its bytes (e.g. `express.json()` without `keepRawBody`). */
export function parsedBody(value: unknown): RequestBody {
  if (value === undefined || value === null) return NO_BODY;
  return { kind: "json", value, bytes: EMPTY };
}

/** JSON with object keys sorted at every depth, so `{"b":1,"a":2}` and `{"a":2,"b":1}` are equal. */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== "object") return JSON.stringify(value) ?? "null";
  if (Array.isArray(value)) {
    let out = "[";
    for (let i = 0; i < value.length; i++) {
      if (i > 0) out += ",";
      if (i in value) out += canonicalJson(value[i]); // a hole stays empty, as join() leaves it
    }
    return `${out}]`;
  }
  const o = value as Record<string, unknown>;
  const keys = Object.keys(o).sort();
  let out = "{";
  for (const k of keys) {
    const v = o[k];
    if (v === undefined) continue;
    if (out.length > 1) out += ",";
    out += `${JSON.stringify(k)}:${canonicalJson(v)}`;
  }
  return `${out}}`;
}

/** What the fingerprint hashes for a body: sorted JSON, the form's pairs sorted by name, or the bytes. */
export function canonicalBytes(body: RequestBody): string | Uint8Array {
  switch (body.kind) {
    case "none":
      return "";
    case "json":
      return canonicalJson(body.value);
    case "form":
      return canonicalFormFields(body.value);
    case "raw":
      return body.value;
  }
}

/**
 * A form's fields re-encoded with names sorted; a repeatable field's values stay in the order sent
 * (their order counts). Without repeated fields this equals the earlier canonical form (pairs sorted
 * by name, then value), so keys saved before keep their fingerprints.
 */
function canonicalFormFields(fields: FormFields): string {
  const out = new URLSearchParams();
  for (const name of Object.keys(fields).sort()) {
    const v = fields[name]!;
    if (typeof v === "string") out.append(name, v);
    else for (const one of v) out.append(name, one);
  }
  return out.toString();
}

function parseForm(text: string, repeatable: readonly string[] | undefined): FormFields {
  const entries: Array<[string, string | string[]]> = [];
  const seen = new Map<string, number>();
  for (const [name, value] of new URLSearchParams(text)) {
    const many = repeatable?.includes(name) ?? false;
    const at = seen.get(name);
    if (at === undefined) {
      seen.set(name, entries.length);
      entries.push([name, many ? [value] : value]);
    } else if (many) {
      (entries[at]![1] as string[]).push(value);
    } else {
      throw new AmbiguousBodyError(
        `The form field "${name}" is sent more than once; send it once (this route does not accept it repeated).`,
      );
    }
  }
  return Object.fromEntries(entries); // own properties, even for a field named __proto__
}

/**
 * JSON.parse, after a scan that refuses what JSON.parse would read silently one way among several:
 * duplicate object keys (JSON.parse keeps the last), numbers too large for a double (JSON.parse makes
 * them Infinity, which serializes as null), and nesting deeper than MAX_JSON_DEPTH.
 *
 * Why a scanner of our own: JSON.parse cannot be asked about duplicates, and the npm parsers that see
 * them build a whole syntax tree per request (@humanwhocodes/momoa, with locations for every token) or
 * are unmaintained. This one walks the text once over character codes, keeps only the keys of the open
 * objects, and leaves the values to JSON.parse, at a third of JSON.parse's own time
 * (docs/decisions/strict-json-scanner.md).
 */
export function parseStrictJson(text: string): unknown {
  const problem = scanJson(text);
  if (problem) throw problem;
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new InvalidBodyError(`The request body is not valid JSON (${(err as Error).message}).`);
  }
}

/** One open object (the keys seen so far) or array (keys null), and how many members it has. */
interface Open {
  keys: Set<string> | null;
  count: number;
}

/** Returns the error to throw, or undefined when JSON.parse may read `text` without ambiguity. */
function scanJson(text: string): InvalidBodyError | AmbiguousBodyError | undefined {
  const scan = new JsonScanner(text);
  if (!scan.run()) return new InvalidBodyError("The request body is not valid JSON.");
  if (scan.duplicate !== undefined) {
    return new AmbiguousBodyError(
      `The JSON body has the key "${scan.duplicate.slice(0, 64)}" more than once in one object; send each key once.`,
    );
  }
  if (scan.tooBig !== undefined) {
    return new InvalidBodyError(`The JSON number ${scan.tooBig.slice(0, 40)} is too large.`);
  }
  return undefined;
}

/** The scan itself: one pass, character codes only (a class: V8 keeps its fields in registers). */
class JsonScanner {
  i = 0;
  duplicate: string | undefined;
  tooBig: string | undefined;
  private readonly open: Open[] = [];
  constructor(private readonly text: string) {}

  /** True when the text is one JSON value (objects and arrays scanned member by member). */
  run(): boolean {
    const open = this.open;
    if (!this.value()) return false;
    while (open.length > 0) {
      const top = open[open.length - 1]!;
      this.ws();
      const c = this.text.charCodeAt(this.i);
      if (c === (top.keys ? 0x7d /* } */ : 0x5d) /* ] */) {
        open.pop();
        this.i++;
        continue;
      }
      if (top.count > 0) {
        if (c !== 0x2c /* , */) return false;
        this.i++;
      }
      top.count++;
      if (!(top.keys ? this.member(top.keys) : this.value())) return false;
    }
    this.ws();
    return this.i === this.text.length;
  }

  private ws(): void {
    const text = this.text;
    let i = this.i;
    for (; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) break;
    }
    this.i = i;
  }

  /** The index after the string that opens at i, or -1. */
  private str(): number {
    const text = this.text;
    for (let j = this.i + 1; j < text.length; j++) {
      const c = text.charCodeAt(j);
      if (c === 0x22) return j + 1;
      if (c === 0x5c) j++;
      else if (c < 0x20) return -1;
    }
    return -1;
  }

  /** A value at i: a scalar is skipped; an object or array is opened (run() scans its members). */
  private value(): boolean {
    this.ws();
    const text = this.text;
    const c = text.charCodeAt(this.i);
    if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
      if (this.open.length >= MAX_JSON_DEPTH) return false;
      this.open.push({ keys: c === 0x7b ? new Set() : null, count: 0 });
      this.i++;
      return true;
    }
    if (c === 0x22) {
      const end = this.str();
      this.i = end;
      return end > 0;
    }
    if (c === 0x74 /* t */ && text.startsWith("true", this.i)) this.i += 4;
    else if (c === 0x66 /* f */ && text.startsWith("false", this.i)) this.i += 5;
    else if (c === 0x6e /* n */ && text.startsWith("null", this.i)) this.i += 4;
    else return this.number();
    return true;
  }

  /** -?(0|[1-9]digits)(.digits)?([eE][+-]?digits)? at i. */
  private number(): boolean {
    const text = this.text;
    const start = this.i;
    let i = start;
    if (text.charCodeAt(i) === 0x2d) i++;
    const first = text.charCodeAt(i);
    if (first === 0x30) i++;
    else if (first >= 0x31 && first <= 0x39) i = digits(text, i);
    else return false;
    let plain = true;
    if (text.charCodeAt(i) === 0x2e) {
      const end = digits(text, i + 1);
      if (end === i + 1) return false;
      i = end;
    }
    const e = text.charCodeAt(i);
    if (e === 0x65 || e === 0x45) {
      plain = false;
      i++;
      const sign = text.charCodeAt(i);
      if (sign === 0x2b || sign === 0x2d) i++;
      const end = digits(text, i);
      if (end === i) return false;
      i = end;
    }
    // Only an exponent, or more than 308 digits, can overflow a double.
    if ((!plain || i - start > 308) && !Number.isFinite(Number(text.slice(start, i)))) {
      this.tooBig ??= text.slice(start, i);
    }
    this.i = i;
    return true;
  }

  /** `"name": value` at i, in an object whose keys so far are `keys`. */
  private member(keys: Set<string>): boolean {
    this.ws();
    const text = this.text;
    if (text.charCodeAt(this.i) !== 0x22) return false;
    const end = this.str();
    if (end < 0) return false;
    const raw = text.slice(this.i + 1, end - 1);
    let name: string;
    if (raw.includes("\\")) {
      try {
        name = JSON.parse(`"${raw}"`) as string;
      } catch {
        return false;
      }
    } else name = raw;
    if (keys.has(name)) this.duplicate ??= name;
    else keys.add(name);
    this.i = end;
    this.ws();
    if (text.charCodeAt(this.i) !== 0x3a /* : */) return false;
    this.i++;
    return this.value();
  }
}

function digits(text: string, i: number): number {
  for (; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x30 || c > 0x39) break;
  }
  return i;
}
