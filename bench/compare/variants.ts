/**
 * The servers the comparison runs, one child process each (bench/compare/server.ts builds them). Every
 * keyed variant is compared with the bare handler on its own framework, measured in the same rounds.
 */

export type Framework = "express" | "hono" | "fastify" | "nest" | "node";

export interface Variant {
  name: string;
  /** As shown in the results table. */
  label: string;
  /** As shown in the chart. */
  short: string;
  framework: Framework;
  /**
   * bare: no middleware, the INSERT autocommitted; idem: atomic mode on the pg pipeline driver; hand: a
   * hand-written keyed handler (hand.ts), the yardstick; peer: from npm.
   */
  kind: "bare" | "idem" | "hand" | "peer";
  /** What holds a key claimed by a request that crashed, from the peer's documentation. */
  stuckUntil?: string;
}

const FRAMEWORK_NAMES: Record<Framework, string> = {
  express: "Express",
  hono: "Hono",
  fastify: "Fastify",
  nest: "NestJS",
  node: "node:http",
};

export const VARIANTS: readonly Variant[] = [
  {
    name: "bare-express",
    short: "bare, Express",
    label: "bare handler, Express 5",
    framework: "express",
    kind: "bare",
  },
  { name: "bare-hono", short: "bare, Hono", label: "bare handler, Hono", framework: "hono", kind: "bare" },
  {
    name: "bare-fastify",
    short: "bare, Fastify",
    label: "bare handler, Fastify",
    framework: "fastify",
    kind: "bare",
  },
  {
    name: "bare-nest",
    short: "bare, NestJS",
    label: "bare handler, NestJS 12 on Express",
    framework: "nest",
    kind: "bare",
  },
  {
    name: "bare-node",
    short: "bare, node:http",
    label: "bare handler, node:http",
    framework: "node",
    kind: "bare",
  },
  {
    name: "idem-express",
    short: "idem/express",
    label: "idem/express, pg pipeline",
    framework: "express",
    kind: "idem",
  },
  { name: "idem-hono", short: "idem/hono", label: "idem/hono, pg pipeline", framework: "hono", kind: "idem" },
  {
    name: "idem-fastify",
    short: "idem/fastify",
    label: "idem/fastify, pg pipeline",
    framework: "fastify",
    kind: "idem",
  },
  {
    name: "idem-nest",
    short: "idem/nestjs",
    label: "idem/nestjs (on Express), pg pipeline",
    framework: "nest",
    kind: "idem",
  },
  { name: "idem-node", short: "idem/node", label: "idem/node, pg pipeline", framework: "node", kind: "idem" },
  {
    name: "idem-statement",
    short: "idem single statement",
    label: "idem/node, single-statement mode (claim + INSERT + reply in one statement)",
    framework: "node",
    kind: "idem",
  },
  {
    name: "hand-tx",
    short: "hand-tx",
    label: "hand-written transaction, node:http, pg pipeline",
    framework: "node",
    kind: "hand",
  },
  ...(["express", "hono", "fastify", "nest"] as const).map(
    (framework): Variant => ({
      name: `hand-tx-${framework}`,
      short: `hand-tx, ${FRAMEWORK_NAMES[framework]}`,
      label: `hand-written transaction, ${FRAMEWORK_NAMES[framework]}, pg pipeline`,
      framework,
      kind: "hand",
    }),
  ),
  {
    name: "hand-cte",
    short: "hand-cte",
    label: "hand-written single statement, node:http",
    framework: "node",
    kind: "hand",
  },
  {
    name: "express-idempotency",
    short: "express-idempotency",
    label: "express-idempotency + Redis",
    framework: "express",
    kind: "peer",
    stuckUntil: "the key's TTL, 24 h",
  },
  {
    name: "node-idempotency",
    short: "@node-idempotency/core",
    label: "@node-idempotency/core + Redis (Express)",
    framework: "express",
    kind: "peer",
    stuckUntil: "the key's TTL, 24 h",
  },
  {
    name: "powertools",
    short: "Powertools idempotency",
    label: "Powertools idempotency, cache layer on Redis (Express)",
    framework: "express",
    kind: "peer",
    stuckUntil: "the in-progress expiry, 10 s",
  },
];

/**
 * The variants a run measures: all, or those named in BENCH_COMPARE_ONLY (comma-separated; the bare
 * handlers and hand-tx of their frameworks come with them, hand-tx on node:http always, and hand-cte
 * with single-statement mode).
 */
export function chosenVariants(): readonly Variant[] {
  const only = process.env.BENCH_COMPARE_ONLY?.split(",").filter(Boolean);
  if (!only?.length) return VARIANTS;
  const named = VARIANTS.filter(
    (v) =>
      only.includes(v.name) ||
      v.name === "hand-tx" ||
      (v.name === "hand-cte" && only.includes("idem-statement")),
  );
  return VARIANTS.filter(
    (v) =>
      named.includes(v) ||
      ((v.kind === "bare" || isHandTx(v)) && named.some((n) => n.framework === v.framework)),
  );
}

/** hand-tx on any framework (`hand-tx`, `hand-tx-express`, ...). */
export const isHandTx = (v: Variant) => v.kind === "hand" && v.name.startsWith("hand-tx");

/**
 * The hand-written variant an idem variant is compared with, among `variants`: hand-cte for
 * single-statement mode (the same one-statement shape), else the hand-tx on its framework.
 */
export function handTxOf(v: Variant, variants: readonly Variant[]): Variant | undefined {
  if (v.name === "idem-statement") return variants.find((h) => h.name === "hand-cte");
  return variants.find((h) => isHandTx(h) && h.framework === v.framework);
}

export function variant(name: string): Variant {
  const v = VARIANTS.find((x) => x.name === name);
  if (!v) throw new Error(`unknown variant ${name}; one of: ${VARIANTS.map((x) => x.name).join(", ")}`);
  return v;
}

export function bareOf(v: Variant): Variant {
  return VARIANTS.find((x) => x.kind === "bare" && x.framework === v.framework)!;
}

/** Pool size of every variant's PostgreSQL pool. */
export const POOL_SIZE = 10;
/** The scope idem's variants key under (a real service takes it from authentication). */
export const SCOPE = "acct_bench";
/**
 * What the Powertools variant tells Powertools about the time left, as a Lambda context would: an
 * in-progress key is considered abandoned after this long.
 */
export const POWERTOOLS_REMAINING_MS = 10_000;
