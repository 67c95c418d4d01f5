/**
 * The import rules of the library (npm run check:imports, part of npm test). The layout they keep:
 *   src/core       the protocol: no I/O, no driver, no framework; imports nothing else of src/
 *   src/http       framework adapters: translate to the core's lifecycle; never the PostgreSQL store
 *   src/mcp        MCP tools (a door like the adapters) and the agent-side helper: core and client only
 *   src/postgres   the store, its drivers, phases mode, migrations (drivers are typed structurally), in
 *                  layers: db.ts, tx-end.ts, uuid7.ts; drivers/, schema/, secrets/; keys/ (a request
 *                  meeting its key: row, live clause, lock, clock, gate); the modes atomic/, statement/,
 *                  phases/ (each one attempt at the key, none importing another); admin/; then store.ts,
 *                  sharded.ts, index.ts
 *   src/client, src/messaging, src/testing, src/cli   build on the above
 *   app/, examples/ use idem as users do: only through its public entry points (`idem/*`)
 * and no cycles anywhere (src, app, bench, examples): no file cycle, and no folder cycle either. Each
 * folder of src/ names the folders it may import (FOLDERS below); the table is checked to have no cycle
 * when this file loads, so no folder imports one that imports it back.
 */
const { exports: entries } = require("./package.json");

/** The files behind the package's public entry points (their `source` condition), as path patterns. */
const PUBLIC_ENTRIES = Object.values(entries)
  .map((e) => (typeof e === "object" && e.source ? e.source.replace(/^\.\//, "") : undefined))
  .filter(Boolean)
  .map((f) => `^${f.replace(/[.]/g, "\\.")}$`);

/**
 * The folders of src/ and the folders each may import (besides itself), from the ground up. Telemetry
 * reaches client, postgres and messaging through hooks they expose (their observe.ts), so observability
 * sits above them.
 */
const FOLDERS = {
  core: [],
  client: ["core"],
  postgres: ["core"],
  messaging: ["core", "postgres"],
  observability: ["core", "client", "messaging"],
  http: ["core", "observability"],
  mcp: ["core", "client"],
  orm: ["core", "postgres"],
  reconcile: ["core", "postgres"],
  admin: ["core", "postgres", "messaging"],
  nest: ["core", "http"],
  lambda: ["core", "http", "messaging"],
  webhooks: ["core", "http", "messaging", "postgres"],
  testing: ["core", "client", "postgres", "reconcile"],
  cli: ["core", "admin", "messaging", "observability", "postgres", "reconcile", "testing"],
};

/** Throws when FOLDERS has a cycle (a folder that may import, through others, one importing it back). */
function assertNoFolderCycle(folders) {
  const state = {};
  const visit = (f, path) => {
    if (state[f] === "done") return;
    if (state[f] === "open")
      throw new Error(`.dependency-cruiser.cjs: folder cycle ${[...path, f].join(" -> ")}`);
    state[f] = "open";
    for (const g of folders[f] ?? []) visit(g, [...path, f]);
    state[f] = "done";
  };
  for (const f of Object.keys(folders)) visit(f, []);
}
assertNoFolderCycle(FOLDERS);

const folderRules = Object.entries(FOLDERS).map(([folder, allowed]) => ({
  name: `${folder}-imports-only-${allowed.length ? allowed.join("-") : "itself"}`,
  severity: "error",
  comment: `src/${folder} may import only ${allowed.length ? allowed.map((f) => `src/${f}`).join(", ") : "itself"} (FOLDERS): no folder imports one that imports it back.`,
  from: { path: `^src/${folder}/` },
  to: {
    path: `^src/(?!(?:${[folder, ...allowed].join("|")})/)[^/]+/`,
  },
}));

module.exports = {
  forbidden: [
    ...folderRules,
    {
      name: "no-cycles",
      severity: "error",
      comment: "A cycle makes two files one: split the shared part out.",
      from: { path: "^(src|app|bench|examples)/" },
      to: { circular: true },
    },
    {
      name: "core-imports-no-package",
      severity: "error",
      comment: "The core is framework-free and driver-free: only Node's built-ins.",
      from: { path: "^src/core" },
      to: { dependencyTypes: ["npm", "npm-dev", "npm-optional", "npm-peer", "npm-no-pkg", "npm-unknown"] },
    },
    {
      name: "core-imports-only-core",
      severity: "error",
      comment: "Nothing in the core depends on a layer above it.",
      from: { path: "^src/core" },
      to: { path: "^src/(?!core/)" },
    },
    {
      name: "http-imports-no-postgres",
      severity: "error",
      comment: "Adapters talk to the core's lifecycle and store interfaces, not to the PostgreSQL store.",
      from: { path: "^src/http" },
      to: { path: "^src/postgres" },
    },
    {
      name: "mcp-imports-no-postgres-or-http",
      severity: "error",
      comment: "The MCP door talks to the core's lifecycle and store interfaces, like the HTTP adapters.",
      from: { path: "^src/mcp" },
      to: { path: "^src/(postgres|http)" },
    },
    {
      name: "postgres-modes-import-no-store",
      severity: "error",
      comment:
        "A mode (atomic, single-statement, phases) is one attempt at a key: it reaches the store through keys/ interfaces, never store.ts, the sharded store, the entry or the operator tools.",
      from: { path: "^src/postgres/(atomic|statement|phases)/" },
      to: { path: "^src/postgres/((store|sharded|index)\\.ts$|admin/)" },
    },
    {
      name: "postgres-modes-import-no-other-mode",
      severity: "error",
      comment:
        "What two modes share belongs to keys/ (the key gate, the lookup, the lock), not to one of them.",
      from: { path: "^src/postgres/(atomic|statement|phases)/" },
      to: { path: "^src/postgres/(atomic|statement|phases)/", pathNot: "^src/postgres/$1/" },
    },
    {
      name: "postgres-keys-import-no-mode",
      severity: "error",
      comment: "keys/ is what every mode stands on: it imports no mode, no operator tool and not the store.",
      from: { path: "^src/postgres/keys/" },
      to: { path: "^src/postgres/((atomic|statement|phases|admin)/|(store|sharded|index)\\.ts$)" },
    },
    {
      name: "postgres-base-imports-no-keys",
      severity: "error",
      comment:
        "Drivers, the schema and the secrets are below the keys: they import none of keys/, the modes, admin/ or the store.",
      from: { path: "^src/postgres/(drivers|schema|secrets)/|^src/postgres/(db|tx-end|uuid7)\\.ts$" },
      to: {
        path: "^src/postgres/((keys|atomic|statement|phases|admin)/|(store|sharded|index|outbox)\\.ts$)",
      },
    },
    {
      name: "app-and-examples-use-public-entries",
      severity: "error",
      comment: "The reference service and the examples import idem as users do: `idem/*`, never src/ files.",
      from: { path: "^(app|examples)/" },
      to: { path: "^src/", pathNot: PUBLIC_ENTRIES },
    },
    {
      name: "library-imports-no-app-test-bench",
      severity: "error",
      from: { path: "^src" },
      to: { path: "^(app|test|bench|examples)/" },
    },
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    tsConfig: { fileName: "tsconfig.json" },
    tsPreCompilationDeps: true,
    enhancedResolveOptions: {
      exportsFields: ["exports"],
      conditionNames: ["source", "import", "node", "default", "types"],
      extensions: [".ts", ".js", ".json"],
    },
  },
};
