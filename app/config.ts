/**
 * The reference service's configuration: every environment variable it reads, parsed and checked in
 * one place. `loadConfig(env)` fails at start-up naming the variable that is wrong; nothing else in
 * app/ reads the service's environment (app/main.ts wires what this returns).
 *
 * Environment (all optional):
 *   PORT                  HTTP port (default 3000; 0 picks a free one)
 *   HOST                  interface (default 127.0.0.1)
 *   DATABASE_URL          PostgreSQL (default: the embedded PGlite under .idem/, or IDEM_DATA_DIR); several
 *                         hosts with target_session_attrs=read-write run on postgres.js; ?pgbouncer=true optional
 *   IDEM_DATA_DIR         the embedded database's folder (default .idem/)
 *   IDEM_POOL_SIZE        connections in the pool (a whole number >= 1)
 *   IDEM_LISTEN_DATABASE_URL  straight to PostgreSQL for LISTEN when DATABASE_URL is a pooler
 *   IDEM_DB_DRIVER        pg, postgres or auto (default auto: postgres.js for several hosts)
 *   PROVIDER_URL          the payment provider (default: the simulator, started in this process)
 *   PROVIDER_PORT         port of that in-process simulator (default 4100; 0 picks a free one)
 *   PROVIDER_RETENTION_MS how long that simulator remembers a key and its charge (default 86400000, 24 h)
 *   PROVIDER_IDEMPOTENCY  false: the provider does not dedup by Idempotency-Key (lookup mode: charges carry
 *                         our reference and an unknown outcome is searched for before charging again);
 *                         the in-process simulator then runs without idempotency too (default true)
 *   PROVIDER_WEBHOOK_SECRET  the provider's webhook signing secret (whsec_...): POST /v1/webhooks/provider
 *                         takes its charge events; unset: a random secret shared with the in-process simulator
 *   IDEM_PAYMENTS_MODE    phases (default) or atomic (local payments only, no provider)
 *   IDEM_CARD_TOKEN_KEY   the HMAC key card numbers are tokenized under (at least 32 characters, e.g.
 *                         `openssl rand -hex 32`; one value for every instance); unset: a random key per process
 *   AMQP_URL / NATS_URL / KAFKA_URL / SQS_URL
 *                         the broker for receipt emails (default: an in-process transport)
 *   IDEM_DEMO=1           create the demo accounts on a real server too
 *   IDEM_OPTIONAL_KEY=1   let POSTs without a key through (the benchmark's baseline); never in production
 *   IDEM_RETENTION_HOURS  how long idempotency keys are kept (default 24)
 *   IDEM_ENCRYPTION_KEYS  encrypt saved replies and stored inputs at rest: `id:base64-32-bytes,...`,
 *                         the current key first (docs/operations.md, "Encryption at rest")
 *   METRICS_PORT          serve /metrics on its own port (on HOST) instead of the API's
 *   IDEM_METRICS_TOKEN    require `Authorization: Bearer <token>` on /metrics
 *   IDEM_ADMIN_TOKEN      turn on the operations console at /admin: `name:token,...` (one per person), each
 *                         token at least 128 bits (`openssl rand -base64 24`)
 *   LOG_LEVEL             pino level (default info)
 *   IDEM_REGION, IDEM_REGION_URLS, IDEM_ACCOUNT_HOMES   run as one of several regions (app/regions.ts)
 * HTTP limits (milliseconds unless said), enforced by app/server.ts:
 *   IDEM_HTTP_HEADERS_TIMEOUT_MS     a request's headers must arrive within this (default 10,000)
 *   IDEM_HTTP_REQUEST_TIMEOUT_MS     the whole request must arrive within this (default 15,000); a socket that
 *                                    never sends a byte is closed (with a 408) after it too. The handler's own
 *                                    time is not counted.
 *   IDEM_HTTP_KEEPALIVE_TIMEOUT_MS   an idle keep-alive connection is closed after this (default 5,000)
 *   IDEM_HTTP_IDLE_TIMEOUT_MS        any socket with no traffic for this long is closed (default 60,000)
 *   IDEM_HTTP_MAX_CONNECTIONS        open connections at most; further ones are refused (default 1,000)
 *   IDEM_DRAIN_MS                    on SIGTERM/SIGINT, in-flight requests get this long to finish (default 10,000)
 */
import { type Sealer, sealerFromEnv } from "idem";
import { parseAdminTokens } from "idem/admin";
import type { ReceiptsConfig } from "./receipts.ts";
import type { Regions } from "./regions.ts";
import { DEFAULT_LIMITS, type HttpLimits } from "./server.ts";

export type Env = Record<string, string | undefined>;

export interface ServiceConfig {
  port: number;
  host: string;
  /** Serve /metrics on this port instead of the API's. */
  metricsPort: number | undefined;
  /** Bearer token required on /metrics (IDEM_METRICS_TOKEN). */
  metricsToken: string | undefined;
  /** The operations console at /admin (IDEM_ADMIN_TOKEN, `name:token,...`; app/admin.ts); unset: off. */
  adminTokens: string | undefined;
  limits: HttpLimits;
  database: {
    url: string | undefined;
    dataDir: string | undefined;
    poolSize: number | undefined;
    listenUrl: string | undefined;
    driver: "pg" | "postgres" | "auto" | undefined;
  };
  /** Create the demo accounts even on a real server (IDEM_DEMO=1); the embedded database always has them. */
  demo: boolean;
  retentionMs: number;
  paymentsMode: "phases" | "atomic";
  provider: {
    /** An external provider; undefined: the simulator, in process (phases mode). */
    url: string | undefined;
    port: number;
    retentionMs: number | undefined;
    /** Whether the provider dedups by Idempotency-Key (PROVIDER_IDEMPOTENCY). */
    idempotency: boolean;
    /** PROVIDER_WEBHOOK_SECRET; undefined: a random one, given to the in-process simulator. */
    webhookSecret: string | undefined;
  };
  /** IDEM_CARD_TOKEN_KEY: the key card numbers are tokenized under; undefined: a random key per process. */
  cardTokenKey: string | undefined;
  /** Undefined when IDEM_ENCRYPTION_KEYS is unset: stored in clear. */
  sealer: Sealer | undefined;
  requireKey: boolean;
  logLevel: string | undefined;
  receipts: ReceiptsConfig;
  regions: Regions | undefined;
}

/** The service's settings from `env`; a value that does not parse is an error naming its variable. */
export function loadConfig(env: Env = process.env): ServiceConfig {
  const retentionHours = Number(env.IDEM_RETENTION_HOURS ?? 24);
  if (!(retentionHours > 0)) {
    throw new Error(
      `IDEM_RETENTION_HOURS must be a positive number of hours, got ${env.IDEM_RETENTION_HOURS}`,
    );
  }
  const mode = env.IDEM_PAYMENTS_MODE ?? "phases";
  if (mode !== "phases" && mode !== "atomic") {
    throw new Error(`IDEM_PAYMENTS_MODE must be phases or atomic, got ${mode}`);
  }
  const driver = env.IDEM_DB_DRIVER || undefined;
  if (driver !== undefined && driver !== "pg" && driver !== "postgres" && driver !== "auto") {
    throw new Error(`IDEM_DB_DRIVER must be pg, postgres or auto, got ${driver}`);
  }
  return {
    port: portFrom(env, "PORT", 3000),
    host: env.HOST ?? "127.0.0.1",
    metricsPort: env.METRICS_PORT ? portFrom(env, "METRICS_PORT", 0) : undefined,
    metricsToken: env.IDEM_METRICS_TOKEN,
    adminTokens: adminTokensFrom(env),
    limits: httpLimitsFromEnv(env),
    database: {
      url: env.DATABASE_URL || undefined,
      dataDir: env.IDEM_DATA_DIR,
      poolSize: wholeFrom(env, "IDEM_POOL_SIZE"),
      listenUrl: env.IDEM_LISTEN_DATABASE_URL || undefined,
      driver,
    },
    demo: env.IDEM_DEMO === "1",
    retentionMs: retentionHours * 3_600_000,
    paymentsMode: mode,
    provider: {
      url: env.PROVIDER_URL || undefined,
      port: portFrom(env, "PROVIDER_PORT", 4100),
      retentionMs: wholeFrom(env, "PROVIDER_RETENTION_MS"),
      idempotency: providerIdempotencyFrom(env),
      webhookSecret: env.PROVIDER_WEBHOOK_SECRET || undefined,
    },
    cardTokenKey: cardTokenKeyFrom(env),
    sealer: sealerFromEnv(env),
    requireKey: env.IDEM_OPTIONAL_KEY !== "1",
    logLevel: env.LOG_LEVEL,
    receipts: receiptsConfigFromEnv(env),
    regions: regionsFromEnv(env),
  };
}

const LIMIT_VARS: Record<keyof HttpLimits, string> = {
  headersTimeoutMs: "IDEM_HTTP_HEADERS_TIMEOUT_MS",
  requestTimeoutMs: "IDEM_HTTP_REQUEST_TIMEOUT_MS",
  keepAliveTimeoutMs: "IDEM_HTTP_KEEPALIVE_TIMEOUT_MS",
  idleTimeoutMs: "IDEM_HTTP_IDLE_TIMEOUT_MS",
  maxConnections: "IDEM_HTTP_MAX_CONNECTIONS",
  drainMs: "IDEM_DRAIN_MS",
};

/** The HTTP limits; a value that is not a whole number >= 1 is a start-up error naming it. */
export function httpLimitsFromEnv(env: Env): HttpLimits {
  const limits = { ...DEFAULT_LIMITS };
  for (const name of Object.keys(LIMIT_VARS) as (keyof HttpLimits)[]) {
    limits[name] = wholeFrom(env, LIMIT_VARS[name]) ?? limits[name];
  }
  return limits;
}

/** A whole number >= 1, or undefined when the variable is unset or empty. */
function wholeFrom(env: Env, name: string): number | undefined {
  const raw = env[name];
  if (raw === undefined || raw === "") return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a whole number >= 1, got ${raw}`);
  return n;
}

/** A port: a usage error naming the variable when it is not 0..65535. */
export function portFrom(env: Env, name: string, fallback: number): number {
  const raw = env[name];
  const port = raw === undefined || raw === "" ? fallback : Number(raw);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new Error(`${name} must be a port number from 0 to 65535, got ${raw}`);
  }
  return port;
}

/**
 * PROVIDER_IDEMPOTENCY: whether the payment provider dedups by Idempotency-Key (default true; `false`
 * for lookup mode). Read by the service (its routes and its completer) and by `idemRunners`, so that
 * every path that charges agrees.
 */
export function providerIdempotencyFrom(env: Env): boolean {
  const v = env.PROVIDER_IDEMPOTENCY?.trim().toLowerCase();
  if (v === undefined || v === "" || v === "true" || v === "1") return true;
  if (v === "false" || v === "0") return false;
  throw new Error(`PROVIDER_IDEMPOTENCY must be true or false, got ${env.PROVIDER_IDEMPOTENCY}`);
}

/** The provider's base URL: PROVIDER_URL, else the in-process simulator's (PROVIDER_PORT, default 4100). */
export function providerUrlOf(config: ServiceConfig): string {
  return config.provider.url ?? `http://127.0.0.1:${config.provider.port}`;
}

/** IDEM_ADMIN_TOKEN, checked here so that a weak or malformed token stops the start, naming it. */
function adminTokensFrom(env: Env): string | undefined {
  const value = env.IDEM_ADMIN_TOKEN || undefined;
  parseAdminTokens(value, "IDEM_ADMIN_TOKEN");
  return value;
}

/** At least this many characters in IDEM_CARD_TOKEN_KEY (64 hex digits are 32 bytes). */
const MIN_CARD_TOKEN_KEY = 32;

function cardTokenKeyFrom(env: Env): string | undefined {
  const key = env.IDEM_CARD_TOKEN_KEY;
  if (key === undefined || key === "") return undefined;
  if (key.trim().length < MIN_CARD_TOKEN_KEY) {
    throw new Error(
      `IDEM_CARD_TOKEN_KEY must be at least ${MIN_CARD_TOKEN_KEY} characters (e.g. openssl rand -hex 32), got ${key.trim().length}`,
    );
  }
  return key;
}

/** The receipt worker's broker: AMQP_URL, else NATS_URL, else KAFKA_URL, else SQS_URL, else in process. */
export function receiptsConfigFromEnv(env: Env): ReceiptsConfig {
  const config: ReceiptsConfig = {};
  if (env.AMQP_URL) config.amqpUrl = env.AMQP_URL;
  if (env.NATS_URL) config.natsUrl = env.NATS_URL;
  if (env.KAFKA_URL) config.kafkaUrl = env.KAFKA_URL;
  if (env.SQS_URL) config.sqsUrl = env.SQS_URL;
  return config;
}

/** The regions from IDEM_REGION, IDEM_REGION_URLS and IDEM_ACCOUNT_HOMES; undefined without IDEM_REGION. */
export function regionsFromEnv(env: Env): Regions | undefined {
  const region = env.IDEM_REGION?.trim();
  if (!region) return undefined;
  const urls = pairs("IDEM_REGION_URLS", env.IDEM_REGION_URLS ?? "");
  const homes = pairs("IDEM_ACCOUNT_HOMES", env.IDEM_ACCOUNT_HOMES ?? "");
  for (const home of [region, ...Object.values(homes)]) {
    if (!(home in urls)) throw new Error(`IDEM_REGION_URLS has no URL for the region "${home}"`);
  }
  return { region, urls, homes };
}

function pairs(name: string, text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of text.split(",").filter((p) => p.trim())) {
    const at = part.indexOf("=");
    if (at <= 0) throw new Error(`${name}: write it as name=value,name=value (got "${part}")`);
    out[part.slice(0, at).trim()] = part.slice(at + 1).trim();
  }
  return out;
}
