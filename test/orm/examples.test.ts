/**
 * The integration examples (examples/web.ts, drizzle.ts, kysely.ts, knex.ts, prisma.ts, nestjs.ts) run, each on a
 * fresh database, and print what the README says; the README shows each snippet as it is in the file.
 */
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { DATABASE_URL, freshDatabase } from "../helpers/db.ts";

const run = promisify(execFile);
const EXAMPLES = ["web", "drizzle", "kysely", "knex", "prisma", "nestjs"];

/** The part of an example the README shows: between `// #region snippet` and `// #endregion snippet`. */
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
      const fresh = await freshDatabase("idem_example");
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
        expect(second![1]).toBe(first![1]);
        expect(JSON.parse(first![1]!)).toMatchObject({ id: 1 });
        expect(stdout).toContain("payments in the table: 1");
      } finally {
        await fresh.drop();
      }
    },
    150_000,
  );
});

describe("README", () => {
  it.each(EXAMPLES)("shows the snippet of examples/%s.ts as it is in the file", (name) => {
    expect(readFileSync("README.md", "utf8")).toContain(snippetOf(name));
  });
});
