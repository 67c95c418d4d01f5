/** The command line's contract with scripts: exit 2 and one line for bad usage, never a Node stack. */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { afterEach, describe, expect, it, vi } from "vitest";
import { main } from "../../src/cli/main.ts";
import { DATABASE_URL, freshDatabase } from "../helpers/db.ts";

afterEach(() => vi.restoreAllMocks());

async function runCli(argv: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  vi.spyOn(console, "log").mockImplementation((...a) => void out.push(a.join(" ")));
  vi.spyOn(console, "error").mockImplementation((...a) => void err.push(a.join(" ")));
  const code = await main(argv);
  return { code, out: out.join("\n"), err: err.join("\n") };
}

describe("idem's exit codes", () => {
  it("prints the version", async () => {
    const pkg = JSON.parse(readFileSync("package.json", "utf8"));
    expect(await runCli(["--version"])).toMatchObject({ code: 0, out: pkg.version });
  });

  it.each([
    [["relay", "--once", "--retention-hours", "-1"], /--retention-hours=-1/],
    [["sweep", "--retention-hours=-3"], /--retention-hours takes a positive number/],
    [["provider", "--port", "70000"], /--port takes a port number/],
    [["migrate", "--bogus"], /Unknown option '--bogus' \(idem migrate --help shows every option\)/],
    [["migrate", "--outbox-notify", "maybe"], /--outbox-notify takes on or off/],
    [["serve"], /unknown command "serve"/],
  ])("%j is bad usage: exit 2 and one line", async (argv, message) => {
    const { code, err } = await runCli(argv);
    expect(code).toBe(2);
    expect(err.split("\n")).toHaveLength(1);
    expect(err).toMatch(message);
  });

  it.each([[[]], [["keys"]]])("%j prints its usage to stderr and exits 2", async (argv) => {
    const { code, out, err } = await runCli(argv);
    expect(code).toBe(2);
    expect(out).toBe("");
    expect(err).toMatch(/^usage: idem/);
  });

  it("--help prints the usage to stdout and exits 0", async () => {
    for (const argv of [["--help"], ["keys", "--help"]]) {
      const { code, out, err } = await runCli(argv);
      expect(code).toBe(0);
      expect(out).toMatch(/^usage: idem/);
      expect(err).toBe("");
    }
  });
});

describe("idem migrate and idem sweep --json", () => {
  it("print what they did as JSON, on the embedded database", async () => {
    const dir = mkdtempSync(join(tmpdir(), "idem-cli-json-"));
    const before = process.env.IDEM_DATA_DIR;
    process.env.IDEM_DATA_DIR = join(dir, "pgdata");
    try {
      const first = await runCli(["migrate", "--json", "--database-url", ""]);
      expect(first.code).toBe(0);
      expect(JSON.parse(first.out).applied).toContain("0001_keys.sql");
      const check = await runCli(["migrate", "--check", "--json", "--database-url", ""]);
      expect(check.code).toBe(0);
      expect(JSON.parse(check.out)).toMatchObject({ pending: [] });
      const sweep = await runCli(["sweep", "--json", "--database-url", ""]);
      expect(sweep.code).toBe(0);
      expect(JSON.parse(sweep.out)).toMatchObject({ keyPartitions: [], inboxPartitions: [] });
    } finally {
      if (before === undefined) delete process.env.IDEM_DATA_DIR;
      else process.env.IDEM_DATA_DIR = before;
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
});

describe.skipIf(!DATABASE_URL)("a database that does not exist", () => {
  it("is reported as such, not as a server that cannot be reached", async () => {
    const url = new URL(DATABASE_URL ?? "");
    url.pathname = "/idem_no_such_db_35";
    const { code, err } = await runCli(["migrate", "--database-url", url.toString()]);
    expect(code).toBe(1);
    expect(err.split("\n")).toHaveLength(1);
    expect(err).toContain('database "idem_no_such_db_35" does not exist on the PostgreSQL server at');
    expect(err).toContain("createdb -h 127.0.0.1");
    expect(err).not.toContain("cannot reach");
  });
});

describe.skipIf(!DATABASE_URL)("idem migrate --outbox-notify", () => {
  it("drops the outbox's NOTIFY trigger with off and puts it back with on", async () => {
    const fresh = await freshDatabase();
    const count = async () => {
      const c = new pg.Client({ connectionString: fresh.url });
      await c.connect();
      try {
        const { rows } = await c.query(
          "SELECT count(*)::int AS n FROM pg_trigger WHERE tgrelid = 'idem.outbox'::regclass AND tgname = 'outbox_notify'",
        );
        return rows[0].n as number;
      } finally {
        await c.end();
      }
    };
    try {
      const off = await runCli(["migrate", "--outbox-notify", "off", "--database-url", fresh.url]);
      expect(off.code).toBe(0);
      expect(off.out).toContain("outbox NOTIFY trigger dropped");
      expect(await count()).toBe(0);
      expect((await runCli(["migrate", "--database-url", fresh.url])).code).toBe(0);
      expect(await count()).toBe(0); // a plain migrate leaves it off
      const on = await runCli(["migrate", "--outbox-notify=on", "--database-url", fresh.url]);
      expect(on.code).toBe(0);
      expect(await count()).toBe(1);
    } finally {
      await fresh.drop();
    }
  }, 60_000);
});
