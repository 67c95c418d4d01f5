/**
 * The provider simulator's HTTP plumbing (provider.ts and provider-refunds.ts answer through it): a
 * bounded body read, a JSON answer, the Stripe-like error body, and a request held until its client
 * gives up.
 */
import type { IncomingMessage, ServerResponse } from "node:http";

/** The largest request body the simulator reads; a larger one is answered 413. */
export const BODY_LIMIT = 64 * 1024;

/** A body over the limit (`readBody`). */
export class BodyTooLargeError extends Error {}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * The request's body as text, at most `limit` bytes. Read with the stream's events rather than
 * `for await`: the async iterator costs a promise and a callback per chunk and showed in the
 * simulator's profile under the phases bench.
 */
export function readBody(req: IncomingMessage, limit = BODY_LIMIT): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size <= limit) chunks.push(chunk);
      else reject(new BodyTooLargeError()); // the rest is read and dropped: the answer can still go out
    });
    req.on("end", () =>
      resolve(chunks.length === 1 ? chunks[0]!.toString("utf8") : Buffer.concat(chunks).toString("utf8")),
    );
    req.on("error", reject);
  });
}

/** Answer `status` with `body` as JSON (a string is sent as it is). */
export function send(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

/** A Stripe-like error body. */
export function errorBody(type: string, code: string, message: string, extra: Record<string, unknown> = {}) {
  return { error: { type, code, message, ...extra } };
}

/** Hold a request without an answer for `ms`, or until its client hangs up. */
export function holdUntilClosed(res: ServerResponse, ms: number): Promise<void> {
  return new Promise<void>((resolve) => {
    const t = setTimeout(resolve, ms);
    res.once("close", () => {
      clearTimeout(t);
      resolve();
    });
  });
}
