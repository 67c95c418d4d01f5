// Mutation testing (issue 21): `npm run mutate`. Not part of `npm test`: it runs the tests in
// vitest.mutation.config.ts once per mutant that they cover (coverageAnalysis "perTest"), which takes
// minutes. Narrow a run with `npm run mutate -- --mutate src/core/key.ts`.
// Reports: reports/mutation/mutation.json (mutation-testing-report-schema) and mutation.html.
/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  testRunner: "vitest",
  vitest: { configFile: "vitest.mutation.config.ts" },
  coverageAnalysis: "perTest",
  // Static mutants (module-level constants, evaluated once at import) would each need the whole test
  // set re-run in a fresh process: about 100 of them cost more than the other 1,000 together. They
  // are reported as Ignored and left out of the scores (reports/mutation/SUMMARY.md counts them).
  ignoreStatic: true,
  // The modules that guard money, in the order of issue 21. src/core/db.ts, store.ts and index.ts hold
  // types and re-exports only (no mutants). Then the phases runner (runner, claim, lease) and the relay.
  mutate: [
    "src/core/key.ts",
    "src/core/fingerprint.ts",
    "src/core/response.ts",
    "src/core/body.ts",
    "src/core/problem.ts",
    "src/core/sqlstate.ts",
    "src/core/operation-ref.ts",
    "src/core/errors.ts",
    "src/core/outcome.ts",
    "src/core/redact.ts",
    "src/core/sealing.ts",
    "src/core/lifecycle.ts",
    "src/postgres/store.ts",
    "src/postgres/atomic/runner.ts",
    "src/postgres/keys/row.ts",
    // What store.ts and atomic/runner.ts held until the key gate (issue 59): the lock, the clock, the gate.
    "src/postgres/keys/gate.ts",
    "src/postgres/keys/lock.ts",
    "src/postgres/keys/clock.ts",
    "src/client/deadline.ts",
    "src/client/retry-after.ts",
    "src/client/budget.ts",
    "src/client/backoff.ts",
    "src/client/answer.ts",
    "src/postgres/phases/runner.ts",
    "src/postgres/phases/local.ts",
    "src/postgres/phases/claim.ts",
    "src/postgres/phases/lease.ts",
    "src/messaging/relay.ts",
    "src/messaging/relay-sql.ts",
  ],
  reporters: ["json", "html", "clear-text", "progress"],
  jsonReporter: { fileName: "reports/mutation/mutation.json" },
  htmlReporter: { fileName: "reports/mutation/mutation.html" },
  // Re-test only mutants whose code or covering tests changed since the last run.
  incremental: true,
  incrementalFile: "reports/stryker-incremental.json",
  // The machine's two cores are shared; two test processes at most.
  concurrency: 2,
  timeoutMS: 5_000,
  tempDirName: ".stryker-tmp",
  cleanTempDir: "always",
  thresholds: { high: 85, low: 75, break: null },
};
