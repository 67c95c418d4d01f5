/**
 * What the SQS publisher and consumer share: loading the AWS SDK, making a client, queue URLs by name,
 * telling "SQS is away" from "the request is wrong" in its errors.
 */
import type { SQSClient, SQSClientConfig } from "@aws-sdk/client-sqs";

let loaded: Promise<typeof import("@aws-sdk/client-sqs")> | undefined;

/** The AWS SDK's SQS client, imported once (and a clear error when it is not installed). */
export function sqsLibrary(): Promise<typeof import("@aws-sdk/client-sqs")> {
  loaded ??= import("@aws-sdk/client-sqs").catch((err: unknown) => {
    loaded = undefined;
    throw new Error("idem/messaging/sqs needs @aws-sdk/client-sqs: npm install @aws-sdk/client-sqs", {
      cause: err,
    });
  });
  return loaded;
}

/** Where to reach SQS: a client of yours, or settings to make one (region, credentials: the SDK's). */
export interface SqsConnection {
  /** An SQS client to use (not destroyed by `close()`/`stop()`). */
  client?: SQSClient;
  /** The endpoint, for an SQS-compatible server (ElasticMQ, LocalStack...). Default: AWS's. */
  endpoint?: string;
  /** More client settings (region, credentials...). Default: the SDK's, from the environment. */
  clientConfig?: SQSClientConfig;
}

/** The client to use and whether it is ours to destroy. */
export async function sqsClient(c: SqsConnection): Promise<{ client: SQSClient; owned: boolean }> {
  if (c.client) return { client: c.client, owned: false };
  const lib = await sqsLibrary();
  const config: SQSClientConfig = { ...c.clientConfig };
  if (c.endpoint) config.endpoint = c.endpoint;
  return { client: new lib.SQSClient(config), owned: true };
}

/**
 * Whether an SDK error says SQS is away for now (no connection, a timeout, a 5xx, throttling) rather
 * than that the request is wrong (a queue that does not exist, no permission, a bad parameter).
 */
export function sqsUnavailable(err: unknown): boolean {
  const e = err as { $fault?: string; name?: string; $metadata?: { httpStatusCode?: number } };
  if (e?.$fault === "server") return true;
  if (e?.$fault === "client") return /throttl|RequestThrottled|OverLimit/i.test(e.name ?? "");
  return true; // no answer from SQS at all: a network error
}

/** A queue URL by name, asked once per name (`GetQueueUrl`); a URL is kept as it is. */
export function queueUrls(client: () => Promise<SQSClient>): (queue: string) => Promise<string> {
  const cache = new Map<string, Promise<string>>();
  return (queue) => {
    if (/^https?:\/\//.test(queue)) return Promise.resolve(queue);
    let url = cache.get(queue);
    if (!url) {
      url = (async () => {
        const lib = await sqsLibrary();
        const out = await (await client()).send(new lib.GetQueueUrlCommand({ QueueName: queue }));
        return out.QueueUrl!;
      })();
      url.catch(() => cache.delete(queue));
      cache.set(queue, url);
    }
    return url;
  };
}

/** Message attributes carry the headers; SQS allows ten, so past that they travel as one JSON. */
export const HEADERS_ATTRIBUTE = "idem-headers";
