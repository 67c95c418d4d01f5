/**
 * idem as a new user gets it: `npm pack` (which builds dist/ through `prepack`), the tarball installed
 * into fresh projects outside this repository, and used from there with plain node and tsc:
 * - a project with the peers at the lowest versions their ranges admit: every subpath export
 *   type-checks under `--strict` with `moduleResolution: nodenext` and `bundler`; a keyed request, its
 *   replay and one row run with plain `node` on the real PostgreSQL (when DATABASE_URL is set) and on
 *   PGlite; every subpath can be require()d from CommonJS; `npx idem --help`, `--version` and `migrate`
 *   work; the integrations, each with only its own peers, at their lowest too;
 * - the same project with every peer at the newest version its range admits (type-check, run, require);
 * - the manifest: every condition of every export resolves inside the tarball, and so do `main`,
 *   `types` and `typesVersions` (older resolvers); nothing of the repository's own (scripts,
 *   devDependencies, workspaces, overrides); publint and @arethetypeswrong/cli find no problem;
 * - every TypeScript block of README.md and docs/*.md (scripts/doc-blocks.mjs) and the examples the
 *   README quotes, type-checked against the tarball's declarations with the strictest settings teams use
 *   (strict, noUncheckedIndexedAccess, exactOptionalPropertyTypes, skipLibCheck false);
 * - a project with nothing but the tarball: what a library user installs, its size (the README's
 *   figures, written by scripts/package-size.mjs), and `idem migrate` without a database or PGlite says
 *   what to install in one line and creates nothing.
 */
import { execFile } from "node:child_process";
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { typecheckBlocks, typescriptBlocks } from "../../scripts/doc-blocks.mjs";
import { measure, readmeSizes } from "../../scripts/package-size.mjs";
import { DATABASE_URL, freshDatabase } from "../helpers/db.ts";

const run = promisify(execFile);
const ROOT = process.cwd();
const FIXTURE = join(ROOT, "test/package/fixture");
const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
/**
 * The integrations, each installed in a project of its own with only its own peers (what a user of
 * that stack installs); every other subpath is used from the project with the common peers.
 */
const INTEGRATIONS: Record<string, string[]> = {
  "idem/web": [],
  "idem/drizzle": ["drizzle-orm", "pg"],
  "idem/kysely": ["kysely", "pg"],
  "idem/knex": ["knex", "pg"],
  "idem/prisma": ["@prisma/client", "@prisma/adapter-pg"],
  "idem/nestjs": ["@nestjs/common", "@nestjs/core", "rxjs", "reflect-metadata"],
  "idem/mcp": ["@modelcontextprotocol/sdk", "zod"],
};
const SUBPATHS = Object.keys(pkg.exports as Record<string, unknown>)
  .filter((p) => p !== "./package.json")
  .map((p) => (p === "." ? "idem" : `idem/${p.slice(2)}`))
  .filter((p) => !(p in INTEGRATIONS));

const peerRanges = pkg.peerDependencies as Record<string, string>;
/**
 * The lowest version a peer range admits: every range is `^x.y.z`, or several of them joined by `||`
 * for a peer whose next major version works too (checked below).
 */
const lowest = (name: string) => peerRanges[name]!.split("||")[0]!.trim().replace(/^\^/, "");
/**
 * A package at the lowest or the newest version its peer range admits (npm resolves the range to its
 * newest); the tools that are no peers of idem at the versions this repository tests with.
 */
const spec = (name: string, at: "lowest" | "newest") =>
  name in peerRanges
    ? `${name}@${at === "lowest" ? lowest(name) : peerRanges[name]}`
    : `${name}@${pkg.devDependencies[name]}`;

/** What a user of every subpath installs. */
const COMMON = [
  "hono",
  "@hono/node-server",
  "pg",
  "postgres",
  "express",
  "fastify",
  "@electric-sql/pglite",
  "amqplib",
  "@nats-io/jetstream",
  "@nats-io/transport-node",
  "typescript",
  "@types/node",
  "@types/pg",
  "@types/express",
];

const NPM_FLAGS = ["--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"];

/** What the docs' TypeScript blocks and the examples they quote import besides the common peers. */
const DOCS_PEERS = [
  "@modelcontextprotocol/sdk",
  "zod",
  "@platformatic/kafka",
  "@aws-sdk/client-sqs",
  "stripe",
  "@types/aws-lambda",
];

function duBytes(dir: string): number {
  let total = 0;
  const walk = (d: string) => {
    for (const entry of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, entry.name);
      if (entry.isDirectory()) walk(p);
      else if (entry.isFile()) total += statSync(p).size;
    }
  };
  walk(dir);
  return total;
}

const mb = (bytes: number) => `${(bytes / 1024 / 1024).toFixed(2)} MB`;

/**
 * tsc's errors, less those inside other packages' declarations (with skipLibCheck false they are
 * checked too): under exactOptionalPropertyTypes @nats-io/nats-core's classes do not implement its own
 * interfaces, which is the NATS client's to fix, not idem's. idem's declarations are checked in full.
 */
function errorsOutsideOtherPackages(output: string): string[] {
  const errors: string[] = [];
  for (const line of output.split("\n")) {
    if (/^\S.*error TS\d+/.test(line)) errors.push(line);
    else if (line.startsWith(" ") && errors.length) errors[errors.length - 1] += `\n${line}`;
  }
  return errors.filter((e) => !/^node_modules\/(?!idem\/)/.test(e));
}

describe("the packed tarball, installed in a fresh project", () => {
  let work: string;
  let tarball: string;
  /** With every common peer at the lowest version its range admits. */
  let full: string;
  /** The same, at the newest. */
  let newest: string;
  let bare: string;

  beforeAll(async () => {
    work = mkdtempSync(join(tmpdir(), "idem-consumer-"));
    const { stdout } = await run("npm", ["pack", "--pack-destination", work, "--loglevel=error"], {
      cwd: ROOT,
      maxBuffer: 16 * 1024 * 1024,
    });
    tarball = join(work, stdout.trim().split("\n").at(-1)!);
    full = join(work, "full");
    newest = join(work, "newest");
    bare = join(work, "bare");
    for (const dir of [full, newest, bare]) {
      mkdirSync(dir);
      writeFileSync(
        join(dir, "package.json"),
        JSON.stringify({ name: "consumer", private: true, type: "module" }, null, 2),
      );
    }
    cpSync(FIXTURE, full, { recursive: true });
    cpSync(FIXTURE, newest, { recursive: true });
    const lowestPeers = COMMON.map((name) => spec(name, "lowest"));
    const newestPeers = COMMON.map((name) => spec(name, "newest"));
    await Promise.all([
      run("npm", ["install", tarball, ...lowestPeers, ...NPM_FLAGS], { cwd: full }),
      run("npm", ["install", tarball, ...newestPeers, ...NPM_FLAGS], { cwd: newest }),
      run("npm", ["install", tarball, ...NPM_FLAGS], { cwd: bare }),
    ]);
  }, 300_000);

  // Asynchronous, with time: a synchronous rm of the integrations' node_modules trees blocked vitest's
  // worker past its 60 s hook timeout and its RPC timeout (seen with six integration projects).
  afterAll(async () => {
    if (work) await rm(work, { recursive: true, force: true });
  }, 300_000);

  it("holds built JavaScript, declarations, source maps, the SQL and the CLI, and no sources or tests", async () => {
    const { stdout } = await run("tar", ["-tzf", tarball]);
    const files = stdout.split("\n").filter(Boolean);
    expect(files).toContain("package/dist/index.js");
    expect(files).toContain("package/dist/index.d.ts");
    expect(files).toContain("package/dist/index.js.map");
    expect(files).toContain("package/dist/cli/main.js");
    expect(files).toContain("package/sql/0001_keys.sql");
    expect(files).toContain("package/bin/idem.js");
    // The operations console's page, served by idem/admin's adminConsole.
    for (const asset of ["index.html", "console.js", "look.css", "console.css"])
      expect(files).toContain(`package/dist/admin/console/${asset}`);
    expect(
      files.filter((f) => /\/(src|app|test|bench)\//.test(f) || (f.endsWith(".ts") && !f.endsWith(".d.ts"))),
    ).toEqual([]);
    const declarations = files.filter((f) => f.endsWith(".d.ts"));
    for (const f of declarations.slice(0, 5)) {
      const text = readFileSync(join(full, "node_modules/idem", f.slice("package/".length)), "utf8");
      expect(text).not.toMatch(/from "\.{1,2}\/[^"]+\.ts"/);
    }
    console.log(`tarball ${mb(statSync(tarball).size)}, ${files.length} files`);
  });

  it("has a manifest whose every condition resolves inside the tarball, and complete metadata", () => {
    const installed = JSON.parse(readFileSync(join(bare, "node_modules/idem/package.json"), "utf8"));
    const missing: string[] = [];
    for (const [subpath, target] of Object.entries(installed.exports as Record<string, unknown>)) {
      const paths = typeof target === "string" ? { default: target } : (target as Record<string, string>);
      for (const [condition, path] of Object.entries(paths)) {
        if (!existsSync(join(bare, "node_modules/idem", path)))
          missing.push(`${subpath} ${condition}: ${path}`);
      }
    }
    expect(missing).toEqual([]);
    expect(JSON.stringify(installed.exports)).not.toContain('"source"');
    // What a user installs carries nothing of the repository's own: no install scripts (a `prepare`
    // makes npm run, or flag, a script at every install), no devDependencies, workspaces or overrides.
    for (const field of ["scripts", "devDependencies", "workspaces", "overrides"])
      expect(installed[field], field).toBeUndefined();
    // For resolvers that predate `exports` (TypeScript's node10, old bundlers): the same files.
    const root = installed.exports["."] as Record<string, string>;
    expect({ main: installed.main, types: installed.types }).toEqual({
      main: root.default,
      types: root.types,
    });
    for (const [subpath, [types]] of Object.entries(
      installed.typesVersions["*"] as Record<string, string[]>,
    )) {
      expect(types, subpath).toBe((installed.exports[`./${subpath}`] as Record<string, string>).types);
      expect(existsSync(join(bare, "node_modules/idem", types!)), subpath).toBe(true);
    }
    expect(existsSync(join(bare, "node_modules/idem/LICENSE"))).toBe(true);
    for (const field of ["license", "repository", "homepage", "bugs", "keywords", "sideEffects"]) {
      expect(installed[field], field).toBeDefined();
    }
    // The repository's own package.json keeps its `source` conditions (tests, npm start, benchmarks).
    expect(JSON.stringify(pkg.exports)).toContain('"source"');
    expect(existsSync(join(ROOT, ".package.json.prepack"))).toBe(false);
    // Every peer range is `^x.y.z` (or such ranges joined by `||`): the first one's lower bound is what
    // the full project installs.
    for (const [name, range] of Object.entries(peerRanges))
      expect(range, name).toMatch(/^\^\d+\.\d+\.\d+( \|\| \^\d+\.\d+\.\d+)*$/);
  });

  it("passes publint and @arethetypeswrong/cli", async () => {
    const bin = (name: string) => join(ROOT, "node_modules/.bin", name);
    const publint = await run(bin("publint"), ["--strict", join(bare, "node_modules/idem")]).catch(
      (err: { stdout?: string; stderr?: string }) => {
        throw new Error(`publint failed:\n${err.stdout}${err.stderr}`);
      },
    );
    expect(publint.stdout).toContain("All good!");
    // Every entry point under node10 (main/types/typesVersions), node16 from ES modules and bundlers.
    // One rule is set aside: "cjs-resolves-to-esm" (a require() that reaches an ES module), which
    // @arethetypeswrong/cli 0.18 reports as an error; Node 20.19+ (idem's engines) require()s ES
    // modules, and the test "require()s every subpath from CommonJS" below does it for every subpath.
    const attw = await run(
      bin("attw"),
      [tarball, "--ignore-rules", "cjs-resolves-to-esm", "--format", "ascii"],
      {
        maxBuffer: 16 * 1024 * 1024,
      },
    ).catch((err: { stdout?: string; stderr?: string }) => {
      throw new Error(`@arethetypeswrong/cli found problems:\n${err.stdout}${err.stderr}`);
    });
    expect(attw.stdout).toContain("No problems found");
  }, 120_000);

  it("type-checks every documented call under strict, noUncheckedIndexedAccess, exactOptionalPropertyTypes and skipLibCheck false", async () => {
    // The pages for MCP, Kafka and SQS, Lambda and webhooks use their peers (and the examples their
    // dev tools: stripe's test signer, aws-lambda's event types): installed here for this check.
    await run("npm", ["install", ...DOCS_PEERS.map((name) => spec(name, "lowest")), ...NPM_FLAGS], {
      cwd: full,
    });
    // The README's integrations (Drizzle, Kysely, Knex, NestJS, Prisma) need peers this project does
    // not install: each is installed in a project of its own below, and type-checked in the repository.
    const elsewhere = ["drizzle", "kysely", "knex", "nestjs", "prisma"].map((n) => `examples/${n}.ts`);
    const blocks = typescriptBlocks().filter(
      (b) => !(b.mark?.kind === "from" && elsewhere.includes(b.mark.reason ?? "")),
    );
    const errors = await typecheckBlocks(blocks, {
      dir: full,
      compilerOptions: {
        strict: true,
        noUncheckedIndexedAccess: true,
        exactOptionalPropertyTypes: true,
        skipLibCheck: false,
        module: "nodenext",
        moduleResolution: "nodenext",
        target: "es2022",
        lib: ["es2023", "dom"],
        types: ["node"],
        noEmit: true,
        allowImportingTsExtensions: true,
      },
    });
    // idem's declarations, the blocks and the examples must be clean. Errors inside other packages'
    // declarations are theirs: PGlite's need @types/emscripten, and @nats-io/nats-core's classes do not
    // implement their own interfaces under exactOptionalPropertyTypes.
    // Likewise the MCP SDK's client transport class against its own Transport interface.
    const ours = errors.filter(
      (e) =>
        !/^node_modules\/(?!idem\/)/.test(e) &&
        !e.includes("'StreamableHTTPClientTransport' is not assignable to parameter of type 'Transport'"),
    );
    expect(ours).toEqual([]);
    expect(blocks.length).toBeGreaterThan(40);
  }, 240_000);

  it("installs only what the library imports at run time", () => {
    const installed = JSON.parse(readFileSync(join(bare, "node_modules/.package-lock.json"), "utf8"));
    const names = Object.keys(installed.packages as Record<string, unknown>).map((p) =>
      p.replace(/^.*node_modules\//, ""),
    );
    for (const forbidden of ["pino", "prom-client", "hono", "pg", "tsx", "typescript"]) {
      expect(names).not.toContain(forbidden);
    }
    console.log(
      `a library user installs ${mb(duBytes(join(bare, "node_modules")))}: ${names.sort().join(", ")}`,
    );
    // The README's figures are measured, not typed: within 10 % of this tarball and this install.
    const sizes = measure(tarball, bare);
    const stated = readmeSizes();
    expect(stated, "README.md's <!-- package-size --> block").toBeDefined();
    const off = (said: number, bytes: number) => Math.abs(said - bytes / 1024 / 1024) / (bytes / 1024 / 1024);
    expect(off(stated!.installedMb, sizes.installedBytes), "run node scripts/package-size.mjs").toBeLessThan(
      0.1,
    );
    expect(off(stated!.tarballMb, sizes.tarballBytes), "run node scripts/package-size.mjs").toBeLessThan(0.1);
  });

  for (const resolution of ["nodenext", "bundler"] as const) {
    it(`type-checks every subpath with the strictest settings and moduleResolution ${resolution} (lowest peers)`, async () => {
      const module = resolution === "nodenext" ? "nodenext" : "esnext";
      const failure = await run(
        join(full, "node_modules/.bin/tsc"),
        [
          "--noEmit",
          "--strict",
          "--noUncheckedIndexedAccess",
          "--exactOptionalPropertyTypes",
          "--skipLibCheck",
          "false",
          "--module",
          module,
          "--moduleResolution",
          resolution,
          "--target",
          "es2022",
          "--types",
          "node",
          "types.ts",
        ],
        { cwd: full },
      ).then(
        () => "",
        (err: { stdout?: string }) => err.stdout ?? "tsc failed",
      );
      expect(errorsOutsideOtherPackages(failure)).toEqual([]);
    }, 120_000);
  }

  it("type-checks, runs and require()s with every peer at the newest version its range admits", async () => {
    const versions = JSON.parse(readFileSync(join(newest, "node_modules/.package-lock.json"), "utf8"));
    await run(
      join(newest, "node_modules/.bin/tsc"),
      ["--noEmit", "--strict", "--module", "nodenext", "--target", "es2022", "--types", "node", "types.ts"],
      { cwd: newest },
    ).catch((err: { stdout?: string }) => {
      throw new Error(`tsc failed:\n${err.stdout}`);
    });
    const { stdout } = await run(process.execPath, ["run.mjs"], {
      cwd: newest,
      env: { ...process.env, DATABASE_URL: "" },
    });
    expect(JSON.parse(stdout)).toEqual({ first: 201, second: 201, replayed: "true", same: true, rows: 1 });
    const required = await run(process.execPath, ["--no-warnings", "require.cjs", ...SUBPATHS], {
      cwd: newest,
    });
    expect(Object.keys(JSON.parse(required.stdout)).sort()).toEqual([...SUBPATHS].sort());
    const at = (name: string) => versions.packages[`node_modules/${name}`]?.version;
    console.log(
      `newest peers: ${COMMON.filter((n) => n in peerRanges)
        .map((n) => `${n}@${at(n)}`)
        .join(", ")}`,
    );
  }, 120_000);

  it("runs a keyed request and its replay with plain node on PGlite", async () => {
    const { stdout } = await run(process.execPath, ["run.mjs"], {
      cwd: full,
      env: { ...process.env, DATABASE_URL: "" },
    });
    expect(JSON.parse(stdout)).toEqual({ first: 201, second: 201, replayed: "true", same: true, rows: 1 });
  }, 60_000);

  it.skipIf(!DATABASE_URL)(
    "runs a keyed request and its replay with plain node on the real PostgreSQL",
    async () => {
      const db = await freshDatabase("consumer");
      try {
        const { stdout } = await run(process.execPath, ["run.mjs"], {
          cwd: full,
          env: { ...process.env, DATABASE_URL: db.url },
        });
        expect(JSON.parse(stdout)).toEqual({
          first: 201,
          second: 201,
          replayed: "true",
          same: true,
          rows: 1,
        });
      } finally {
        await db.drop();
      }
    },
    60_000,
  );

  it("require()s every subpath from CommonJS", async () => {
    const { stdout } = await run(process.execPath, ["--no-warnings", "require.cjs", ...SUBPATHS], {
      cwd: full,
    });
    const loaded = JSON.parse(stdout) as Record<string, number>;
    expect(Object.keys(loaded).sort()).toEqual([...SUBPATHS].sort());
    for (const n of Object.values(loaded)) expect(n).toBeGreaterThan(0);
  });

  it("runs the CLI with plain node: --help, --version and migrate", async () => {
    const help = await run("npx", ["idem", "--help"], { cwd: full });
    expect(help.stdout).toContain("usage: idem <command>");
    expect(help.stdout).not.toMatch(/\bserve\b/);
    const version = await run("npx", ["idem", "--version"], { cwd: full });
    expect(version.stdout.trim()).toBe(pkg.version);
    if (DATABASE_URL) {
      const db = await freshDatabase("consumer");
      try {
        const migrated = await run("npx", ["idem", "migrate"], {
          cwd: full,
          env: { ...process.env, DATABASE_URL: db.url },
        });
        expect(migrated.stdout).toContain("applied 0001_keys.sql");
      } finally {
        await db.drop();
      }
    }
  }, 60_000);

  it("installs each integration with only its own peers, and imports and requires it", async () => {
    const results = await Promise.all(
      Object.entries(INTEGRATIONS).map(async ([subpath, peers]) => {
        const dir = join(work, subpath.replace("/", "-"));
        mkdirSync(dir);
        writeFileSync(
          join(dir, "package.json"),
          JSON.stringify({ name: "consumer", private: true, type: "module" }),
        );
        const versions = peers.map((name) => spec(name, "lowest"));
        await run("npm", ["install", tarball, ...versions, ...NPM_FLAGS], { cwd: dir });
        const imported = await run(
          process.execPath,
          [
            "--input-type=module",
            "-e",
            `const m = await import(${JSON.stringify(subpath)}); console.log(Object.keys(m).length);`,
          ],
          { cwd: dir },
        );
        const required = await run(
          process.execPath,
          ["--no-warnings", "-e", `console.log(Object.keys(require(${JSON.stringify(subpath)})).length);`],
          { cwd: dir },
        );
        return { subpath, peers, imported: Number(imported.stdout), required: Number(required.stdout) };
      }),
    );
    for (const r of results) {
      expect(r.imported, r.subpath).toBeGreaterThan(0);
      expect(r.required, r.subpath).toBe(r.imported);
    }
    console.log(
      `integrations, each with only its peers: ${results.map((r) => `${r.subpath} (${r.peers.join(", ") || "none"})`).join("; ")}`,
    );
  }, 300_000);

  it("idem migrate without a database or PGlite says what to install and creates nothing", async () => {
    const err = await run("npx", ["idem", "migrate"], {
      cwd: bare,
      env: { ...process.env, DATABASE_URL: "" },
    }).then(
      () => undefined,
      (e: { code: number; stderr: string }) => e,
    );
    expect(err?.code).toBe(1);
    const lines = err!.stderr.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain("npm install @electric-sql/pglite");
    expect(existsSync(join(bare, ".idem"))).toBe(false);
  });
});
