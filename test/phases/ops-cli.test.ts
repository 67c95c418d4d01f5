/** `idem keys` (inspect, list, settle, forget) and `idem audit`, through the dispatcher, with its exit codes. */
import { mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { crashAt } from "../../src/testing/faults.ts";
import { idem } from "../helpers/cli.ts";
import { sayWhySkippedWithoutServer, serverBackends } from "../helpers/db.ts";
import { claimOf, openWorld, type World } from "./helpers.ts";

sayWhySkippedWithoutServer();

const PAY = { amount_cents: 1_100, currency: "eur" };

describe.each(serverBackends.slice(0, 1))("idem keys and idem audit on $name", (backend) => {
  let w: World;
  let url: string;
  beforeAll(async () => {
    w = await openWorld(backend, { idempotency: false });
    url = w.open.url!;
    // Keys made an hour ago by the database's own clock: one done, one abandoned, one in review.
    w.now.ms = Date.now() - 3_600_000;
    await w.runner({ noIdempotency: "search" }).run(claimOf("acct", "paid", PAY), PAY);
    await expect(
      w
        .runner({ noIdempotency: "search", faults: crashAt("after-claim") })
        .run(claimOf("acct", "stuck", PAY), PAY),
    ).rejects.toBeInstanceOf(SimulatedCrashError);
    w.provider.failNext("late");
    await expect(
      w.runner({ noIdempotency: "none", timeoutMs: 300 }).run(claimOf("acct", "unknown", PAY), PAY),
    ).rejects.toMatchObject({ code: "operation-uncertain" });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("inspect: by scope and key or by operation_ref, as text or JSON; 1 for no such key, 2 for bad usage", async () => {
    const text = await idem("keys", "inspect", "acct", "paid", "--database-url", url);
    expect(text.code).toBe(0);
    expect(text.out).toMatch(/state\s+done/);
    expect(text.out).toMatch(/saved answer\s+201, \d+ bytes/);
    const byRef = await idem(
      "keys",
      "inspect",
      "--ref",
      w.store.refs.encode("acct", "stuck"),
      "--json",
      "--database-url",
      url,
    );
    expect(byRef.code).toBe(0);
    expect(JSON.parse(byRef.out)).toMatchObject({
      scope: "acct",
      key: "stuck",
      state: "in_progress",
      recoveryPoint: "started",
    });
    expect((await idem("keys", "inspect", "acct", "nope", "--database-url", url)).code).toBe(1);
    const bad = await idem("keys", "inspect", "--ref", "not-a-ref", "--database-url", url);
    expect(bad.code).toBe(2);
    expect(bad.err).toContain("op_");
  });

  it("list: keys waiting for a person, and unfinished keys", async () => {
    const review = await idem("keys", "list", "--state", "needs_review", "--json", "--database-url", url);
    // Without --state: the keys waiting for a person, the same list.
    expect((await idem("keys", "list", "--json", "--database-url", url)).out).toBe(review.out);
    expect(review.code).toBe(0);
    expect(JSON.parse(review.out)).toMatchObject([
      { scope: "acct", key: "unknown", recoveryPoint: "started" },
    ]);
    const unfinished = await idem("keys", "list", "--state", "unfinished", "--json", "--database-url", url);
    expect(JSON.parse(unfinished.out).map((k: { key: string }) => k.key)).toEqual(["stuck"]);
    expect((await idem("keys", "list", "--state", "everything", "--database-url", url)).code).toBe(2);
  });

  it("audit: built-in checks and the user's own SQL; exit 1 on violations, metrics written", async () => {
    const dir = await mkdtemp(join(tmpdir(), "idem-audit-"));
    const checks = join(dir, "checks.sql");
    await writeFile(
      checks,
      `-- name: payment-has-receipt
-- every payment has its receipt event
SELECT p.id FROM payments p
  LEFT JOIN idem.outbox o ON o.aggregate_id = p.charge_id AND o.topic = 'receipt-email'
 WHERE o.id IS NULL;
`,
    );
    await w.db.query(
      "INSERT INTO payments (charge_id, scope, key, amount_cents) VALUES ('ch_by_hand', 'acct', 'x', 1)",
    );
    const metrics = join(dir, "idem.prom");
    const run = await idem(
      "audit",
      "--sql",
      checks,
      "--review-max-hours",
      "0.5",
      "--metrics",
      metrics,
      "--database-url",
      url,
    );
    expect(run.code).toBe(1);
    expect(run.out).toMatch(/ok\s+one-answer-per-key/);
    expect(run.out).toMatch(/VIOLATED\s+unfinished-past-leases.*\(1 row/);
    expect(run.out).toContain('"key":"stuck"');
    expect(run.out).toMatch(/VIOLATED\s+review-too-old.*\(1 row/);
    expect(run.out).toMatch(/VIOLATED\s+payment-has-receipt.*\(1 row/);
    expect(await readFile(metrics, "utf8")).toContain('idem_audit_violations{check="payment-has-receipt"} 1');

    await writeFile(checks, "-- name: nothing-wrong\nSELECT 1 WHERE false\n");
    expect(
      (
        await idem(
          "audit",
          "--no-builtin",
          "--sql",
          checks,
          "--record",
          "--by",
          "cron",
          "--database-url",
          url,
        )
      ).code,
    ).toBe(0);
    await writeFile(checks, "SELECT 1\n");
    expect((await idem("audit", "--sql", checks, "--database-url", url)).code).toBe(2);
  });

  it("settle: refused without a note; recorded with one; the key then replays the settled answer", async () => {
    expect(
      (await idem("keys", "settle", "acct", "unknown", "--answer", "402", "--database-url", url)).code,
    ).toBe(2);
    const done = await idem(
      "keys",
      "settle",
      "acct",
      "unknown",
      "--answer",
      "402",
      "--body",
      '{"error":"refunded"}',
      "--note",
      "charge refunded by hand",
      "--by",
      "ops",
      "--database-url",
      url,
    );
    expect(done.code).toBe(0);
    expect(done.out).toContain("settled acct unknown by ops");
    expect(
      (
        await idem(
          "keys",
          "settle",
          "acct",
          "unknown",
          "--resume",
          "started",
          "--note",
          "again",
          "--database-url",
          url,
        )
      ).code,
    ).toBe(1);
    const after = await idem("keys", "list", "--state", "needs_review", "--json", "--database-url", url);
    expect(JSON.parse(after.out)).toEqual([]);
    const out = await w.runner({ noIdempotency: "none" }).run(claimOf("acct", "unknown", PAY), PAY);
    expect(out).toMatchObject({ kind: "replayed", response: { status: 402 } });
  });

  it("list --state expiring: the keys whose retention ends within the hour", async () => {
    const args = ["keys", "list", "--state", "expiring", "--json", "--database-url", url];
    // Made an hour ago: with 24 h of retention none expires within the hour; with 1.5 h, all do.
    expect(JSON.parse((await idem(...args)).out)).toEqual([]);
    const soon = JSON.parse((await idem(...args, "--retention-hours", "1.5")).out);
    expect(soon.map((k: { key: string }) => k.key).sort()).toEqual(["paid", "stuck", "unknown"]);
  });

  it("forget: needs a reason; a paid key only from a person who reversed it; all recorded", async () => {
    expect((await idem("keys", "forget", "acct", "paid", "--database-url", url)).code).toBe(2);
    const forget = (...more: string[]) =>
      idem(
        "keys",
        "forget",
        "--ref",
        w.store.refs.encode("acct", "paid"),
        "--reason",
        "customer support ticket 42",
        "--by",
        "ops",
        "--database-url",
        url,
        ...more,
      );
    // Its saved 201 says the charge happened: a retry after forgetting would charge again.
    const refused = await forget();
    expect(refused.code).toBe(1);
    expect(refused.err).toMatch(/saved answer \(201\) says the operation took effect/);
    expect(refused.err).toContain("--effect-reversed");
    expect((await idem("keys", "inspect", "acct", "paid", "--database-url", url)).code).toBe(0);
    const gone = await forget("--effect-reversed");
    expect(gone.code).toBe(0);
    expect(gone.out).toContain("forgot acct paid (was done at done) by ops");
    expect((await idem("keys", "inspect", "acct", "paid", "--database-url", url)).code).toBe(1);
    const { rows } = await w.db.query<{ actor: string; action: string; key: string; reason: string }>(
      "SELECT actor, action, key, reason FROM idem.admin_actions ORDER BY id",
    );
    // The audit run recorded with --record (the console shows it as the last run).
    expect(rows.shift()).toEqual({ actor: "cron", action: "audit.run", key: null, reason: null });
    expect(rows).toEqual([
      { actor: "ops", action: "key.settle", key: "unknown", reason: "charge refunded by hand" },
      {
        actor: "ops",
        action: "key.forget.effect-reversed",
        key: "paid",
        reason: "customer support ticket 42",
      },
    ]);
  });
  // Last: its hostile row stays in the table the tests above list and audit.
  it("prints stored terminal escape sequences escaped, never raw (list, inspect, JSON)", async () => {
    // A hostile stored row: a scope and key holding ESC sequences (clear screen, retitle), a C1 CSI and
    // a right-to-left override.
    const scope = "acct\u001b]0;owned\u0007";
    const key = "k\u001b[2J\u009b31m\u202eevil";
    await expect(
      w.runner({ faults: crashAt("after-claim") }).run(claimOf(scope, key, PAY), PAY),
    ).rejects.toBeInstanceOf(SimulatedCrashError);
    // biome-ignore lint/suspicious/noControlCharactersInRegex: looking for raw control characters
    const raw = /[\u001b\u0007\u009b\u202e]/;
    const list = await idem("keys", "list", "--state", "unfinished", "--database-url", url);
    expect(list.code).toBe(0);
    expect(list.out).toContain("k\\u001b[2J\\u009b31m\\u202eevil");
    expect(list.out).not.toMatch(raw);
    const json = await idem("keys", "list", "--state", "unfinished", "--json", "--database-url", url);
    expect(json.out).not.toMatch(raw);
    expect(JSON.parse(json.out)).toContainEqual(expect.objectContaining({ scope, key })); // the same values
    // Such a scope or key is refused before anything is asked of the database (the key rules), and
    // the refusal prints nothing raw either.
    const refused = await idem("keys", "inspect", scope, key, "--database-url", url);
    expect(refused.code).toBe(2);
    expect(refused.err).not.toMatch(raw);
  });
});
