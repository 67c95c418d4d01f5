/**
 * Prisma (`idem/prisma`, Prisma 7 with a driver adapter such as `@prisma/adapter-pg`): idem joins
 * Prisma's interactive transaction.
 *
 *   const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString }) });
 *   const idemDb = fromPrisma(prisma);
 *   const store = await PostgresStore.open(idemDb);
 *   app.post("/charges", idempotency({ store, scope }), async (c) => {
 *     const tx = idemDb.tx(c.var.idempotency.tx);     // Prisma's transaction client
 *     const charge = await tx.charge.create({ data: { ... } });
 *     return c.json(charge, 201);                      // the create, the key and this reply commit together
 *   });
 *
 * The store's statements run as `tx.$queryRawUnsafe` (statements that return rows) or
 * `tx.$executeRawUnsafe` (the others, for their row count). Interactive transactions have a time limit
 * (`timeout`, Prisma's default 5 s): give `fromPrisma` one that covers your handler.
 */
import { type OrmDb, ormDb } from "./shared.ts";

export type { OrmDb } from "./shared.ts";

/** The slice of a Prisma client (or of its transaction client) used here. */
export interface PrismaRawLike {
  /** Run a query with `$1..$n` parameters; resolves with its rows. */
  $queryRawUnsafe<T = unknown>(query: string, ...values: any[]): Promise<T>;
  /** Run a statement with `$1..$n` parameters; resolves with the rows affected. */
  $executeRawUnsafe(query: string, ...values: any[]): Promise<number>;
}
/** The slice of a `PrismaClient` used here: raw SQL, interactive transactions, disconnect. */
export interface PrismaClientLike extends PrismaRawLike {
  /** Run `fn` in an interactive transaction. */
  $transaction<R>(
    fn: (tx: any) => Promise<R>,
    options?: { maxWait?: number; timeout?: number; isolationLevel?: any },
  ): Promise<R>;
  /** Close the client's connections. */
  $disconnect(): Promise<void>;
}

/** The transaction client `prisma.$transaction(async (tx) => ...)` hands its callback (any for an untyped client). */
export type PrismaTransaction<P extends PrismaClientLike> = 0 extends 1 & P
  ? any
  : Parameters<Parameters<P["$transaction"]>[0]>[0];

/** Statements whose rows the store reads: queries, and writes with RETURNING. */
const RETURNS_ROWS = /^\s*(select|with|values|table)\b|\breturning\b/i;
/**
 * A query of a function returning void (an advisory lock, the outbox's NOTIFY sent after a commit),
 * whose column Prisma cannot deserialize.
 */
const RETURNS_VOID = /^\s*select\s+(pg_advisory_xact_lock|pg_notify)\(/i;

/**
 * Prisma reports a failed raw statement as its own error (P2010), with the driver adapter's error in
 * `meta` (`driverAdapterError.cause.originalCode` is the SQLSTATE); the store reads `code`.
 */
function prismaDriverError(err: unknown): unknown {
  type Meta = { driverAdapterError?: { cause?: { originalCode?: unknown; originalMessage?: unknown } } };
  const cause = (err as { meta?: Meta } | null)?.meta?.driverAdapterError?.cause;
  const code = cause?.originalCode;
  if (typeof code !== "string" || !/^[0-9A-Z]{5}$/.test(code)) return err;
  const message = typeof cause?.originalMessage === "string" ? cause.originalMessage : (err as Error).message;
  return Object.assign(new Error(message, { cause: err }), { code });
}

/**
 * A `Db` for idem's store on a Prisma client (PostgreSQL, with a driver adapter). `transaction` is
 * passed to `$transaction` (e.g. `{ timeout: 15_000 }`). `close()` disconnects when `owned` (default).
 */
export function fromPrisma<P extends PrismaClientLike>(
  prisma: P,
  options: { owned?: boolean; transaction?: { maxWait?: number; timeout?: number } } = {},
): OrmDb<PrismaTransaction<P>> {
  return ormDb<PrismaRawLike, PrismaTransaction<P>>({
    name: "prisma",
    root: prisma,
    async query(on, sql, params) {
      if (RETURNS_ROWS.test(sql) && !RETURNS_VOID.test(sql)) {
        const rows = await on.$queryRawUnsafe<any[]>(sql, ...params);
        return { rows, rowCount: rows.length };
      }
      return { rows: [], rowCount: await on.$executeRawUnsafe(sql, ...params) };
    },
    transaction: (fn) => prisma.$transaction(fn, options.transaction),
    driverError: prismaDriverError,
    async close() {
      if (options.owned ?? true) await prisma.$disconnect();
    },
  });
}
