/**
 * What the Kafka publisher and consumer share: loading the client library, reading a broker list,
 * telling "the cluster is away" from "the message is wrong" in its errors.
 */

let loaded: Promise<typeof import("@platformatic/kafka")> | undefined;

/** The client library, imported once (and a clear error when it is not installed). */
export function kafkaLibrary(): Promise<typeof import("@platformatic/kafka")> {
  loaded ??= import("@platformatic/kafka").catch((err: unknown) => {
    loaded = undefined;
    throw new Error("idem/messaging/kafka needs @platformatic/kafka: npm install @platformatic/kafka", {
      cause: err,
    });
  });
  return loaded;
}

/**
 * The bootstrap brokers of a `kafka://host:port,host:port` URL, of a plain `host:port,host:port` list,
 * or of an array of either.
 */
export function kafkaBrokers(brokers: string | readonly string[]): string[] {
  const list = (typeof brokers === "string" ? [brokers] : brokers)
    .flatMap((b) => b.replace(/^kafka:\/\//, "").split(","))
    .map((b) => b.trim().replace(/\/+$/, ""))
    .filter((b) => b !== "");
  if (list.length === 0) throw new TypeError("no Kafka broker given (host:port, or kafka://host:port)");
  return list;
}

/**
 * Whether a client error says the cluster is away for now (a connection refused or lost, no answer in
 * time, a leader being elected, too few in-sync replicas) rather than that the message is wrong.
 */
export function kafkaUnavailable(err: unknown): boolean {
  const seen = new Set<unknown>();
  const walk = (e: unknown): boolean => {
    if (!(e instanceof Error) || seen.has(e)) return false;
    seen.add(e);
    const x = e as Error & { code?: unknown; canRetry?: unknown; errors?: unknown };
    if (x.code === "PLT_KFK_NETWORK" || x.code === "PLT_KFK_TIMEOUT" || x.canRetry === true) return true;
    if (Array.isArray(x.errors) && x.errors.some(walk)) return true;
    return walk(x.cause);
  };
  return walk(err);
}
