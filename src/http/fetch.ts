/**
 * What the adapters share on the Fetch API's objects (hono.ts, web.ts, home-region.ts, the Nest
 * interceptor): a `StoredResponse` as a `Response` and back, and a hang-up read from an AbortSignal.
 * Internal: imported by relative path, not exported from an entry point.
 */
import type { StoredResponse } from "../core/response.ts";
import type { HangUp } from "../core/store.ts";

/** Statuses whose responses never carry a body (a set of statuses, not a body). */
export const NULL_BODY_STATUSES: ReadonlySet<number> = new Set([101, 204, 205, 304]);

/** A saved or owed answer as a `Response` (no body for 101, 204, 205, 304 or an empty one). */
export function toResponse(r: StoredResponse): Response {
  const empty = NULL_BODY_STATUSES.has(r.status) || r.body.length === 0;
  return new Response(empty ? null : (r.body as Uint8Array<ArrayBuffer>), {
    status: r.status,
    headers: headersInit(r.headers),
  });
}

/**
 * The pairs as a plain object when every name is there once (the usual case), else as `Headers`
 * (repeated Set-Cookie). A plain object is what @hono/node-server's lightweight Response writes out
 * without building a `Headers`; elsewhere both mean the same.
 */
function headersInit(pairs: ReadonlyArray<readonly [string, string]>): Record<string, string> | Headers {
  const record: Record<string, string> = {};
  for (const [k, v] of pairs) {
    const name = k.toLowerCase();
    if (Object.hasOwn(record, name) || name === "__proto__") {
      const headers = new Headers();
      for (const [n, value] of pairs) headers.append(n, value);
      return headers;
    }
    record[name] = v;
  }
  return record;
}

/** A handler's `Response`, read whole (Set-Cookie stays one pair per cookie). */
export async function toStored(res: Response): Promise<StoredResponse> {
  return { status: res.status, headers: [...res.headers], body: new Uint8Array(await res.arrayBuffer()) };
}

/**
 * The request's signal, looked at only when the store asks (just before its commit): `signal` is a
 * function so that a lazily built request (Hono on @hono/node-server) is not built for it.
 */
export class SignalHangUp implements HangUp {
  constructor(private readonly signal: () => AbortSignal) {}
  get aborted(): boolean {
    return this.signal().aborted;
  }
}
