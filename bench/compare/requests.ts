/** Requests to a variant's server from this process (fetch), outside the wrk slices. */
import { BODY, PATH } from "./handler.ts";

const HEADERS = { "content-type": "application/json" };

/** One POST of the payment; its status, 0 when there was no answer. */
export function post(
  base: string,
  key: string | undefined,
  extra: Record<string, string> = {},
): Promise<number> {
  return fetch(`${base}${PATH}`, {
    method: "POST",
    headers: { ...HEADERS, ...(key ? { "idempotency-key": key } : {}), ...extra },
    body: BODY,
    signal: AbortSignal.timeout(15_000),
  }).then(
    async (r) => {
      await r.arrayBuffer();
      return r.status;
    },
    () => 0, // no answer (connection reset, timeout)
  );
}

/** Send `keys` requests, `concurrency` at a time; how many were answered 2xx. */
export async function send(base: string, keys: (string | undefined)[], concurrency: number): Promise<number> {
  let ok = 0;
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < keys.length) {
        const key = keys[next++];
        const status = await post(base, key);
        if (status >= 200 && status < 300) ok++;
      }
    }),
  );
  return ok;
}
