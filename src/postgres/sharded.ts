/**
 * Sharding by scope: several PostgreSQL databases, each holding the keys and the effects of the
 * accounts routed to it. A request's claim, its work and its saved reply run in one transaction of its
 * account's shard, so they commit together there, and a retry (routed by the same scope) finds its key.
 *
 *   const store = new ShardedStore({
 *     shards: { eu1: await PostgresStore.open(dbEu1), eu2: await PostgresStore.open(dbEu2) },
 *     route: hashRoute(["eu1", "eu2"]), // or a lookup in your account directory
 *   });
 *   app.post("/v1/payments", auth, idempotency({ store, scope: (c) => c.var.accountId }), handler);
 *
 * The route must be stable for as long as keys are kept: an account moved to another shard must take
 * its live keys (and its data) along, or wait out the retention window before taking writes there.
 */
import { createHash } from "node:crypto";
import type {
  AtomicOutcome,
  AtomicRunOptions,
  AtomicStore,
  Claim,
  KeyInspection,
  OperationRefCodec,
  WorkResult,
} from "../core/index.ts";
import type { Tx } from "./db.ts";
import { shardedRefs } from "./secrets/ref-keys.ts";
import type { PostgresStore } from "./store.ts";

/** Options of a {@link ShardedStore}. */
export interface ShardedStoreOptions {
  /** The shards by name, each a store opened on its own database (all with the same retention). Required. */
  shards: Record<string, PostgresStore>;
  /** The shard of a scope (an account id). Must always give the same answer for a scope. Required. */
  route: (scope: string) => string;
  /**
   * The shard for plain transactions without a scope (`transaction(work)` with no `scope`: requests
   * without a key on optional-key routes). Default: none, such a call throws.
   */
  defaultShard?: string;
}

/** A shard name the router returned is not one of the shards. */
export class UnknownShardError extends Error {
  /** Always `"UnknownShardError"`: the name logs and stack traces show. */
  override name = "UnknownShardError";
  constructor(
    /** The name the router returned. */
    readonly shard: string,
  ) {
    super(`the router returned the shard ${JSON.stringify(shard)}, which is not configured`);
  }
}

/** An `AtomicStore` over several PostgreSQL databases, routed by scope. */
export class ShardedStore implements AtomicStore<Tx> {
  /** How long a key is kept, in ms (the same on every shard). */
  readonly retentionMs: number;
  /** The shards by name. */
  readonly shards: Readonly<Record<string, PostgresStore>>;
  /** Seals each key's operation reference with its shard's secret; opens any shard's (ref-keys.ts). */
  readonly refs: OperationRefCodec;
  private readonly route: (scope: string) => string;
  private readonly defaultShard: string | undefined;

  constructor(options: ShardedStoreOptions) {
    const stores = Object.values(options.shards);
    if (stores.length === 0) throw new Error("ShardedStore needs at least one shard");
    const retention = stores[0]!.retentionMs;
    if (stores.some((s) => s.retentionMs !== retention)) {
      // Clients are told one retention; a shard that forgot keys sooner would run some retries twice.
      throw new Error("every shard of a ShardedStore must have the same retentionMs");
    }
    if (options.defaultShard !== undefined && !(options.defaultShard in options.shards)) {
      throw new UnknownShardError(options.defaultShard);
    }
    this.retentionMs = retention;
    this.shards = { ...options.shards };
    this.route = options.route;
    this.defaultShard = options.defaultShard;
    this.refs = shardedRefs(
      (scope) => this.shardOf(scope),
      () => Object.values(this.shards),
    );
  }

  /** The store of a scope's shard. */
  shardOf(scope: string): PostgresStore {
    return this.byName(this.route(scope));
  }

  private byName(name: string): PostgresStore {
    const store = Object.hasOwn(this.shards, name) ? this.shards[name] : undefined;
    if (!store) throw new UnknownShardError(name);
    return store;
  }

  /** Claim, work and saved reply in one transaction of the claim's shard. */
  atomic(
    claim: Claim,
    work: (tx: Tx) => Promise<WorkResult>,
    options?: AtomicRunOptions<Tx>,
  ): Promise<AtomicOutcome> {
    return this.shardOf(claim.scope).atomic(claim, work, options);
  }

  /** One key as an operator sees it, read on its scope's shard (`PostgresStore.inspect`). */
  inspect(scope: string, key: string): Promise<KeyInspection | undefined> {
    return this.shardOf(scope).inspect(scope, key);
  }

  /**
   * A plain transaction: on the scope's shard when `options.scope` is given, otherwise on
   * `defaultShard` (an error when there is none: idem cannot guess where the work belongs).
   */
  transaction<T>(work: (tx: Tx) => Promise<T>, options: { scope?: string } = {}): Promise<T> {
    if (options.scope !== undefined) return this.shardOf(options.scope).transaction(work);
    if (this.defaultShard === undefined) {
      return Promise.reject(
        new Error("ShardedStore.transaction without a scope needs `defaultShard` (or pass { scope })"),
      );
    }
    return this.byName(this.defaultShard).transaction(work);
  }

  /** Retention on every shard (`PostgresStore.sweep`): the dropped buckets by shard. */
  async sweep(): Promise<Record<string, number[]>> {
    const out: Record<string, number[]> = {};
    for (const [name, store] of Object.entries(this.shards)) out[name] = (await store.sweep()).dropped;
    return out;
  }

  /** Create the current and next partitions on every shard. */
  async ensurePartitions(): Promise<void> {
    await Promise.all(Object.values(this.shards).map((s) => s.ensurePartitions()));
  }
}

/**
 * A router that spreads scopes over shards by a hash of the scope (SHA-256, first 4 bytes, modulo the
 * number of shards). Stable for a fixed list, in a fixed order; adding a shard moves most accounts, so
 * grow with a directory (`route: (scope) => directory.get(scope)`) rather than by changing the list.
 */
export function hashRoute(names: readonly string[]): (scope: string) => string {
  if (names.length === 0) throw new Error("hashRoute needs at least one shard name");
  const list = [...names];
  return (scope) => list[createHash("sha256").update(scope).digest().readUInt32BE(0) % list.length]!;
}
