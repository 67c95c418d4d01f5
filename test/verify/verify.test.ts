/**
 * `idem verify` against the reference service (every invariant holds) and against a naive
 * check-then-insert server (caught): the library function, and the command (in process, and once in
 * a child process for its exit code). One service and one naive server serve the whole file.
 */
import { spawn } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { CliError } from "../../src/cli/shared.ts";
import { verifyCommand } from "../../src/cli/verify.ts";
import { listEffects, sqlEffects, type VerifyReport, verify } from "../../src/testing/index.ts";
import { KEY_1, KEY_2, type RunningService, startService } from "../app/service.ts";
import { backends, serverBackends } from "../helpers/db.ts";
import { type NaiveServer, startNaiveServer } from "./naive-server.ts";

const ENTRY = new URL("./fixtures/cli.ts", import.meta.url).pathname;
const PAYMENT = {
  method: "POST",
  path: "/v1/payments",
  body: '{"amount_cents":{{amount}},"currency":"eur"}',
};
const COUNT_SQL = "SELECT count(*) FROM payments WHERE amount_cents = {{amount}}";
const bearer = (key: string) => ({ authorization: `Bearer ${key}` });

/** The command line for a run against `url`, effects counted through GET /v1/payments. */
const cli = (url: string, ...more: string[]) => [
  "--url",
  url,
  "--path",
  "/v1/payments",
  "--body",
  PAYMENT.body,
  "--auth-bearer",
  KEY_1,
  "--auth-bearer-2",
  KEY_2,
  "--count-url",
  "/v1/payments",
  "--count-path",
  "data",
  "--match",
  "amount_cents={{amount}}",
  "--seed",
  "3",
  ...more,
];

function runChild(argv: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--conditions=source", "--import", "tsx", ENTRY, ...argv], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => {
      stdout += d;
    });
    child.stderr.on("data", (d) => {
      stderr += d;
    });
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

async function inProcess(argv: string[]): Promise<{ code: number; out: string }> {
  const log = vi.spyOn(console, "log").mockImplementation(() => {});
  try {
    const code = await verifyCommand(argv);
    return { code, out: log.mock.calls.map((c) => String(c[0])).join("\n") };
  } finally {
    log.mockRestore();
  }
}

let service: RunningService;
let naive: NaiveServer;
beforeAll(async () => {
  service = await startService(backends[0]!);
  // On the real server when there is one; otherwise in the service's PGlite (tables of its own),
  // since starting a second PGlite costs seconds.
  naive = await startNaiveServer(
    serverBackends[0] ? { backend: serverBackends[0] } : { db: service.open.db },
  );
});
afterAll(async () => {
  await naive?.stop();
  await service?.stop();
});

describe("verify() against the reference service", () => {
  let report: VerifyReport;
  beforeAll(async () => {
    report = await verify({
      url: service.url,
      request: PAYMENT,
      auth: bearer(KEY_1),
      secondAuth: bearer(KEY_2),
      effects: sqlEffects(service.open.db, COUNT_SQL),
      intents: 40,
      seed: 7,
    });
  });

  it("finds no violation under duplicates, concurrency, dropped replies, timeouts and probes", () => {
    expect(report.violations).toEqual([]);
    expect(report.ok).toBe(true);
  });

  it("checked the contract's fields on its problems: every 422 mismatch and the 400 without a key", () => {
    const fields = report.checks.find((c) => c.kinds.includes("problem-fields"))!;
    expect(fields.checked).toBeGreaterThanOrEqual(report.faults.mismatch! + 1);
    expect(fields.violations).toBe(0);
  });

  it("really exercised every fault and every check", () => {
    expect(report.intents).toBe(40);
    expect(report.outcomes).toEqual({ succeeded: 40, rejected: 0, unresolved: 0 });
    expect(report.faults).toMatchObject({
      duplicate: 10,
      concurrent: 10,
      drop: 10,
      timeout: 10,
      mismatch: 10,
      scope: 10,
    });
    expect(report.replies.dropped).toBe(10);
    expect(report.replies["timed-out"]).toBeGreaterThanOrEqual(10); // more if a retry was slow too
    expect(report.effects.counted).toBe(40);
    // Nothing was rejected, so "no effect for rejected requests" covers the changed-body probes only.
    for (const check of report.checks) expect(check.checked, check.name).toBeGreaterThan(0);
  });
});

describe.each(serverBackends)("verify() against the reference service on $name", (backend) => {
  let other: RunningService;
  beforeAll(async () => {
    other = await startService(backend);
  });
  afterAll(() => other?.stop());

  it("holds every invariant with real concurrency", async () => {
    const report = await verify({
      url: other.url,
      request: PAYMENT,
      auth: bearer(KEY_1),
      secondAuth: bearer(KEY_2),
      effects: sqlEffects(other.open.db, COUNT_SQL),
      intents: 24,
      concurrency: 12,
      seed: 11,
    });
    expect(report.violations).toEqual([]);
    expect(report.effects.counted).toBe(24);
  });
});

describe.each(serverBackends.slice(0, 1))(
  "verify() against the service's phases-mode payments on $name",
  (backend) => {
    let phases: RunningService;
    beforeAll(async () => {
      phases = await startService(backend, { paymentsMode: "phases" });
    });
    afterAll(() => phases?.stop());

    it("holds every invariant when each payment charges the provider simulator", async () => {
      const report = await verify({
        url: phases.url,
        request: PAYMENT,
        auth: bearer(KEY_1),
        secondAuth: bearer(KEY_2),
        effects: sqlEffects(phases.open.db, COUNT_SQL),
        intents: 24,
        concurrency: 12,
        seed: 13,
      });
      expect(report.violations).toEqual([]);
      expect(report.effects.counted).toBe(24);
    });
  },
);

describe("verify() against a naive check-then-insert server", () => {
  let report: VerifyReport;
  beforeAll(async () => {
    report = await verify({
      url: naive.url,
      request: PAYMENT,
      auth: bearer(KEY_1),
      secondAuth: bearer(KEY_2),
      effects: listEffects({
        url: `${naive.url}/v1/payments`,
        headers: bearer(KEY_1),
        path: "data",
        match: { amount_cents: "{{amount}}" },
      }),
      intents: 40,
      seed: 7,
    });
  });

  it("reports double effects and divergent answers where copies raced", () => {
    expect(report.ok).toBe(false);
    const doubled = report.violations.filter((v) => v.kind === "double-effect");
    expect(doubled.length).toBeGreaterThan(0);
    expect(report.violationsByKind["replay-mismatch"]).toBeGreaterThan(0);
    expect(report.effects.counted).toBeGreaterThan(40);
  });

  it("reports every changed body replayed instead of 422, and every key shared across accounts", () => {
    expect(report.violationsByKind["changed-body-accepted"]).toBe(report.faults.mismatch);
    expect(report.violationsByKind["cross-account"]).toBe(report.faults.scope);
  });

  it("reports that its problem answers do not say what the client may do next", () => {
    // Its only error answer here is the 400 to the request sent without a key: plain JSON, no fields.
    const fields = report.violations.filter((v) => v.kind === "problem-fields");
    expect(fields).toHaveLength(1);
    expect(fields[0]!.message).toMatch(
      /^the request without its key: answered 400 application\/json, not application\/problem\+json/,
    );
    expect(report.checks.find((c) => c.kinds.includes("problem-fields"))).toMatchObject({ violations: 1 });
  });

  it("finds nothing wrong with what the naive server does get right: lost replies, timeouts", () => {
    expect(report.violationsByKind["stuck-in-flight"]).toBeUndefined();
    expect(report.violationsByKind.unresolved).toBeUndefined();
    expect(report.replies.dropped).toBe(10);
  });
});

describe("idem verify (the command)", () => {
  it("exits 0 with a clean JSON report against the reference service", async () => {
    const { code, out } = await inProcess(cli(service.url, "--intents", "16", "--json"));
    const report = JSON.parse(out) as VerifyReport;
    expect(report.violations).toEqual([]);
    expect(code).toBe(0);
    expect(report.effects.counted).toBe(16);
  });

  it("exits 1 in a child process against the naive server, naming the violations", async () => {
    const { code, stdout, stderr } = await runChild(cli(naive.url, "--intents", "16", "--json"));
    expect(stderr).toBe("");
    expect(code).toBe(1);
    const report = JSON.parse(stdout) as VerifyReport;
    expect(report.ok).toBe(false);
    expect(Object.keys(report.violationsByKind)).toEqual(
      expect.arrayContaining(["double-effect", "replay-mismatch", "changed-body-accepted", "cross-account"]),
    );
  });

  it("prints a summary table without --json", async () => {
    const { code, out } = await inProcess(
      cli(naive.url, "--intents", "8", "--faults", "concurrent,mismatch"),
    );
    expect(code).toBe(1);
    expect(out).toMatch(/invariant\s+checked\s+violations/);
    expect(out).toMatch(/one effect per succeeded intent\s+8\s+[1-8]\n/);
    expect(out).toMatch(/422 for a changed body\s+2\s+2\n/);
    expect(out).toContain("FAILED:");
  });

  it("exits 1 with the fix when the API cannot be reached", async () => {
    const err = await verifyCommand([
      "--url",
      "http://127.0.0.1:9",
      "--path",
      "/x",
      "--faults",
      "drop",
    ]).catch((e) => e);
    expect(err).toBeInstanceOf(CliError);
    expect(err.exitCode).toBe(1);
    expect(err.message).toMatch(/cannot reach the API at http:\/\/127\.0\.0\.1:9 .*fix --url/);
  });

  it("exits 1 with the fix when effects cannot be counted", async () => {
    const argv = cli(service.url, "--intents", "2", "--json");
    argv[argv.indexOf("data")] = "items";
    const err = await inProcess(argv).catch((e) => e);
    expect(err).toBeInstanceOf(CliError);
    expect(err.exitCode).toBe(1);
    expect(err.message).toMatch(/"items" is not a JSON array: fix --count-url, --count-path or --match$/);
  });

  it("prints help (exit 0) and refuses bad usage (exit 2)", async () => {
    const { code, out } = await inProcess(["--help"]);
    expect(code).toBe(0);
    expect(out).toContain("usage: idem verify");
    for (const argv of [
      [],
      ["--url", "http://x", "--path", "/p", "--faults", "drop,explode"],
      ["--url", "http://x", "--path", "/p", "--count-url", "/p"],
      ["--url", "http://x", "--path", "/p", "--faults", "scope", "--body", PAYMENT.body],
      ["--url", "http://x", "--path", "/p", "--body", "{{amonut}}"],
      ["--url", "http://x", "--path", "/p", "--intents", "0"],
      ["--url", "http://x", "--path", "/p", "--faults", "mismatch", "--body", "{}"],
      ["--url", "http://x", "--path", "/p", "--faults", "drop", "--count-sql", "SELECT 1"],
    ]) {
      vi.stubEnv("DATABASE_URL", ""); // --count-sql without a database
      vi.stubEnv("IDEM_VERIFY_URL", "");
      const err = await verifyCommand(argv)
        .catch((e) => e)
        .finally(() => vi.unstubAllEnvs());
      expect(err, argv.join(" ")).toBeInstanceOf(CliError);
      expect(err.exitCode, argv.join(" ")).toBe(2);
    }
  });
});
