/**
 * The integration examples (examples/web.ts, express.ts, fastify.ts, node.ts, drizzle.ts, kysely.ts,
 * knex.ts, prisma.ts, nestjs.ts) run, each twice on a fresh database (each run makes its own key and checks
 * one payment was added), and print what their docs page says; they refuse to run without DATABASE_URL;
 * the page of each (docs/express.md, docs/orms.md, ...) shows its snippet as it is.
 */
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { DATABASE_URL, freshDatabase } from "../helpers/db.ts";

const run = promisify(execFile);
const EXAMPLES = ["web", "express", "fastify", "node", "drizzle", "kysely", "knex", "prisma", "nestjs"];

/** The docs page that shows each example's snippet. */
const PAGE: Record<string, string> = {
  web: "docs/web.md",
  express: "docs/express.md",
  fastify: "docs/fastify.md",
  node: "docs/node.md",
  drizzle: "docs/orms.md",
  kysely: "docs/orms.md",
  knex: "docs/orms.md",
  prisma: "docs/orms.md",
  nestjs: "docs/nestjs.md",
};

/** The part of an example its docs page shows: between `// #region snippet` and `// #endregion snippet`. */
function snippetOf(name: string): string {
  const text = readFileSync(`examples/${name}.ts`, "utf8");
  const match = /\/\/ #region snippet\n([\s\S]*?)\/\/ #endregion snippet/.exec(text);
  if (!match) throw new Error(`examples/${name}.ts has no snippet region`);
  return match[1]!.trim();
}

describe.skipIf(!DATABASE_URL)("integration examples", () => {
  it.each(EXAMPLES)(
    "examples/%s.ts: the retry replays the same bytes and one payment exists",
    async (name) => {
      const fresh = await freshDatabase("example");
      try {
        if (name === "prisma") {
          await run("node_modules/.bin/prisma", ["generate", "--schema", "examples/prisma/schema.prisma"], {
            timeout: 120_000,
            env: {
              ...process.env,
              PRISMA_SCHEMA_ENGINE_BINARY: "/bin/false",
              PRISMA_HIDE_UPDATE_MESSAGE: "1",
            },
          });
        }
        // Twice on the same database: each run makes its own key and checks its own payment.
        for (const round of [1, 2]) {
          const { stdout } = await run(
            "node_modules/.bin/tsx",
            ["--conditions=source", `examples/${name}.ts`],
            {
              timeout: 120_000,
              env: { ...process.env, DATABASE_URL: fresh.url },
            },
          );
          const first = /attempt 1: 201 replayed=false (.+)/.exec(stdout);
          const second = /attempt 2: 201 replayed=true (.+)/.exec(stdout);
          expect(first, stdout).not.toBeNull();
          expect(second?.[1]).toBe(first?.[1]);
          expect(JSON.parse(first?.[1] ?? "null")).toMatchObject({ id: round });
          expect(stdout).toContain("payments added: 1");
        }
      } finally {
        await fresh.drop();
      }
    },
    150_000,
  );
});

describe.skipIf(!DATABASE_URL)("an integration example's own check", () => {
  it("refuses to run without DATABASE_URL (exit 2, one line that says what to set)", async () => {
    const env: NodeJS.ProcessEnv = { ...process.env };
    delete env.DATABASE_URL;
    const err = await run("node_modules/.bin/tsx", ["--conditions=source", "examples/web.ts"], { env }).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e,
    );
    expect(err?.code).toBe(2);
    expect(err?.stderr).toContain("set DATABASE_URL to a PostgreSQL database this example may write to");
  }, 60_000);
});

describe("the docs pages", () => {
  it.each(EXAMPLES)("show the snippet of examples/%s.ts as it is in the file", (name) => {
    expect(readFileSync(PAGE[name] ?? "", "utf8")).toContain(snippetOf(name));
  });
});
