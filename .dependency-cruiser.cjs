/**
 * The import rules of the library (npm run check:imports, part of npm test). The layout they keep:
 *   src/core       the protocol: no I/O, no driver, no framework; imports nothing else of src/
 *   src/http       framework adapters: translate to the core's lifecycle; never the PostgreSQL store
 *   src/mcp        MCP tools (a door like the adapters) and the agent-side helper: core and client only
 *   src/postgres   the store, its drivers, phases mode, migrations (drivers are typed structurally)
 *   src/client, src/messaging, src/testing, src/cli   build on the above
 *   app/, examples/ use idem as users do: only through its public entry points (`idem/*`)
 * and no cycles anywhere (src, app, bench, examples).
 */
const { exports: entries } = require("./package.json");

/** The files behind the package's public entry points (their `source` condition), as path patterns. */
const PUBLIC_ENTRIES = Object.values(entries)
  .map((e) => (typeof e === "object" && e.source ? e.source.replace(/^\.\//, "") : undefined))
  .filter(Boolean)
  .map((f) => `^${f.replace(/[.]/g, "\\.")}$`);

module.exports = {
  forbidden: [
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
