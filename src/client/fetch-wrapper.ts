/**
 * `withIdempotency(fetch)`: the client behind a `fetch`-shaped function, for code that already calls
 * fetch (or for libraries that accept a fetch implementation).
 *
 * Each call of a method in `keyMethods` (default POST and PATCH) is its own intent with a new key,
 * unless the caller already set the key header: then that key is used (and recorded) as is, which is
 * how a caller keeps one key across its own calls. Other methods are retried without a key (they are
 * idempotent by HTTP's definition, and a custom header would cost a CORS preflight in browsers).
 * Unlike `createClient`, a call that gives up after receiving a response returns that response, as
 * fetch would; calls that got no response still throw the typed errors.
 */
import { createClient, type IdemClient } from "./client.ts";
import { type ClientOptions, DEFAULT_KEY_HEADER, type FetchLike } from "./options.ts";

/** Options of {@link withIdempotency}: the client's options, and which methods get a key. */
export interface WithIdempotencyOptions extends Omit<ClientOptions, "fetch"> {
  /** Methods that get a key (and an intent). Default `["POST", "PATCH"]`. */
  keyMethods?: readonly string[];
}

/** A fetch-compatible function, with the client that does its work. */
export type IdempotentFetch = ((input: string | URL | Request, init?: RequestInit) => Promise<Response>) & {
  readonly client: IdemClient;
};

/**
 * Wrap `fetch` so that requests of `keyMethods` (POST and PATCH) get an intent, its idempotency key
 * (or the one the request already carries) and the client's retries; other methods go through
 * `requestWithoutKey`, with no key. A call that gives up after a response resolves to that response
 * (`giveUpWith: "response"`); one that got no response, or an uncertain operation, throws.
 */
export function withIdempotency(
  fetchFn: FetchLike | typeof fetch = (url: string, init: RequestInit) => globalThis.fetch(url, init),
  options: WithIdempotencyOptions = {},
): IdempotentFetch {
  const { keyMethods = ["POST", "PATCH"], ...clientOptions } = options;
  const client = createClient({ giveUpWith: "response", ...clientOptions, fetch: fetchFn as FetchLike });
  const keyed = new Set(keyMethods.map((m) => m.toUpperCase()));
  const keyHeader = options.keyHeader ?? DEFAULT_KEY_HEADER;

  const idempotentFetch = async (
    input: string | URL | Request,
    init: RequestInit = {},
  ): Promise<Response> => {
    let url: string | URL;
    let merged: RequestInit;
    if (typeof input !== "string" && !(input instanceof URL)) {
      url = input.url;
      const headers = new Headers(input.headers);
      for (const [name, value] of new Headers(init.headers)) headers.set(name, value);
      const hasBody = input.body !== null && init.body === undefined;
      merged = {
        method: input.method,
        signal: input.signal,
        ...init,
        headers,
        ...(hasBody && { body: await input.arrayBuffer() }),
      };
    } else {
      url = input;
      merged = init;
    }
    const method = (merged.method ?? "GET").toUpperCase();
    if (!keyed.has(method)) return client.requestWithoutKey(url, merged);
    const given = new Headers(merged.headers).get(keyHeader);
    const key = given?.replace(/^"(.*)"$/, "$1");
    // An unnamed intent (id = key): kept while pending, deleted once a final answer arrives.
    return client.request(key ? await client.intent(undefined, { key }) : await client.intent(), url, merged);
  };
  return Object.assign(idempotentFetch, { client });
}
