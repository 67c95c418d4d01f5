/**
 * Request bodies that can be sent more than once and stored with their intent: text or bytes.
 * Everything else a `fetch` body may be is converted once, up front, or refused (a stream can be
 * read only once, and FormData gets a new multipart boundary per send, so it is not the same bytes).
 */
import { UnreplayableBodyError } from "./errors.ts";
import type { StoredRequest } from "./intent-store.ts";

export type ReplayableBody = string | Uint8Array<ArrayBuffer>;
export interface Replayable {
  body?: ReplayableBody;
  contentType?: string;
}

/**
 * The body as text or bytes, and the content type it implies (fetch would have set it). Synchronous
 * for everything but a Blob, which is read once (the caller awaits the promise).
 */
export function toReplayable(body: BodyInit | null | undefined): Replayable | Promise<Replayable> {
  if (body === undefined || body === null) return {};
  if (typeof body === "string") return { body };
  if (body instanceof URLSearchParams) {
    return { body: body.toString(), contentType: "application/x-www-form-urlencoded;charset=UTF-8" };
  }
  // Bytes are copied: a caller reusing its buffer must not change what a retry sends.
  if (body instanceof ArrayBuffer) return { body: new Uint8Array(body.slice(0)) };
  if (ArrayBuffer.isView(body)) {
    return { body: new Uint8Array(body.buffer, body.byteOffset, body.byteLength).slice() };
  }
  if (typeof Blob !== "undefined" && body instanceof Blob) {
    return body.arrayBuffer().then((b): Replayable => {
      const bytes = new Uint8Array(b);
      return body.type ? { body: bytes, contentType: body.type } : { body: bytes };
    });
  }
  if (typeof FormData !== "undefined" && body instanceof FormData)
    throw new UnreplayableBodyError("FormData");
  throw new UnreplayableBodyError(
    typeof ReadableStream !== "undefined" && body instanceof ReadableStream ? "ReadableStream" : typeof body,
  );
}

export function storeBody(body: ReplayableBody | undefined): StoredRequest["body"] {
  if (body === undefined) return undefined;
  return typeof body === "string" ? { text: body } : { base64: bytesToBase64(body) };
}

export function loadBody(stored: StoredRequest["body"]): ReplayableBody | undefined {
  if (!stored) return undefined;
  return "text" in stored ? stored.text : base64ToBytes(stored.base64);
}

export function sameBody(a: StoredRequest["body"], b: StoredRequest["body"]): boolean {
  if (!a || !b) return !a && !b;
  if ("text" in a && "text" in b) return a.text === b.text;
  if ("base64" in a && "base64" in b) return a.base64 === b.base64;
  return false;
}

function bytesToBase64(bytes: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

function base64ToBytes(b64: string): Uint8Array<ArrayBuffer> {
  const binary = atob(b64);
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}
