/**
 * `idem/prisma`: Prisma 7 (the `prisma-client` generator, `@prisma/adapter-pg`) joins idem's store to
 * its interactive transaction. The client is generated for this test into .idem/prisma-test (git-ignored);
 * `prisma generate` only needs the schema engine's path set, which it does not run, to download nothing.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { PrismaPg } from "@prisma/adapter-pg";
import { describe } from "vitest";
import { fromPrisma, type PrismaClientLike } from "../../src/orm/prisma.ts";
import { sayWhySkippedWithoutServer } from "../helpers/db.ts";
import { hasServer, ormContract } from "./harness.ts";

sayWhySkippedWithoutServer();

const run = promisify(execFile);

async function generatedClient(): Promise<new (options: object) => PrismaClientLike & Record<string, any>> {
  await run("node_modules/.bin/prisma", ["generate", "--schema", "test/orm/prisma/schema.prisma"], {
    timeout: 120_000,
    env: { ...process.env, PRISMA_SCHEMA_ENGINE_BINARY: "/bin/false", PRISMA_HIDE_UPDATE_MESSAGE: "1" },
  });
  const path = "../../.idem/prisma-test/client.ts"; // a variable: it exists only once generated
  return (await import(/* @vite-ignore */ path)).PrismaClient;
}

describe.skipIf(!hasServer)("Prisma with @prisma/adapter-pg", () => {
  ormContract(async (url) => {
    const PrismaClient = await generatedClient();
    const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: url, max: 10 }) });
    const idemDb = fromPrisma(prisma, { transaction: { maxWait: 30_000, timeout: 30_000 } });
    return {
      db: idemDb,
      async insert(tx, p) {
        const row = await idemDb.tx(tx).payment.create({ data: p });
        return row.id as number;
      },
    };
  });
});
