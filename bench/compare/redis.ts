/** The peers' Redis: checked before the run, and every key the run wrote deleted after it. */
import { createClient } from "@redis/client";

export const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";

/** Delete every key whose name contains the run's nonce. */
export async function redisCleanup(run: string): Promise<void> {
  const client = await createClient({ url: REDIS_URL }).connect();
  try {
    for await (const batch of client.scanIterator({ MATCH: `*${run}*`, COUNT: 1000 })) {
      const keys = (Array.isArray(batch) ? batch : [batch]) as string[];
      if (keys.length) await client.unlink(keys);
    }
  } finally {
    client.destroy();
  }
}

/** Fails with what to set when Redis does not answer. */
export async function checkRedis(): Promise<void> {
  const client = createClient({ url: REDIS_URL, socket: { connectTimeout: 3000, reconnectStrategy: false } });
  client.on("error", () => {});
  try {
    await client.connect();
    await client.ping();
  } catch (err) {
    throw new Error(
      `Redis at ${REDIS_URL} is not reachable (set REDIS_URL): the peers need it (${(err as Error).message})`,
    );
  } finally {
    if (client.isOpen) client.destroy();
  }
}
