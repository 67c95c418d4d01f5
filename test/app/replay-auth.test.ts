/**
 * Replay authorization in the reference service (issue 18): a saved answer is replayed only to a caller
 * whose API key the database still knows, past the 30 s key cache.
 */
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createAccount, revokeApiKey } from "../../app/accounts.ts";
import { backends } from "../helpers/db.ts";
import { pay, type RunningService, startService } from "./service.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;

for (const mode of ["atomic", "phases"] as const) {
  describe(`replay authorization (${mode} payments on ${backend.name})`, () => {
    let svc: RunningService;
    beforeAll(async () => {
      svc = await startService(backend, { paymentsMode: mode });
    });
    afterAll(async () => {
      await svc?.stop();
    });

    it("answers 401 with nothing of the payment to a replay after the API key was revoked", async () => {
      const { id: account, apiKey } = await createAccount(svc.open.db, "revoked soon");
      const key = randomUUID();
      const body = JSON.stringify({ amount_cents: 4321, currency: "eur" });
      const first = await pay(svc.url, { key, apiKey, body });
      expect(first.status).toBe(201);
      const payment = (await first.json()) as { id: string; amount_cents: number };
      // The key is now in the service's 30 s cache; the replay must still be refused at once.
      expect(await revokeApiKey(svc.open.db, apiKey)).toBe(true);
      const replay = await pay(svc.url, { key, apiKey, body });
      expect(replay.status).toBe(401);
      expect(replay.headers.get("content-type")).toBe("application/problem+json");
      expect(replay.headers.get("idempotent-replayed")).toBeNull();
      expect(replay.headers.get("location")).toBeNull();
      const text = await replay.text();
      expect(JSON.parse(text).status).toBe(401);
      expect(text).not.toContain(payment.id);
      expect(text).not.toContain("4321");
      expect(text).not.toContain("pay_");
      // Nothing ran twice: still exactly one payment for the account.
      expect(
        await svc.count("SELECT count(*)::int AS n FROM payments WHERE account_id = $1", [account]),
      ).toBe(1);
      expect(await revokeApiKey(svc.open.db, apiKey)).toBe(false);
    });

    it("still replays the saved answer byte for byte to a key that was not revoked", async () => {
      const { apiKey } = await createAccount(svc.open.db, "kept");
      const key = randomUUID();
      const first = await pay(svc.url, { key, apiKey });
      const firstBody = await first.text();
      expect(first.status).toBe(201);
      const replay = await pay(svc.url, { key, apiKey });
      expect(replay.status).toBe(201);
      expect(replay.headers.get("idempotent-replayed")).toBe("true");
      expect(await replay.text()).toBe(firstBody);
    });

    it("refuses the replay of a keyed pattern route (orders) after revocation too", async () => {
      const { apiKey } = await createAccount(svc.open.db, "orders");
      const key = randomUUID();
      const order = () =>
        fetch(`${svc.url}/v1/orders`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${apiKey}`,
            "content-type": "application/json",
            "idempotency-key": key,
          },
          body: JSON.stringify({ amount_cents: 777 }),
        });
      const first = await order();
      expect(first.status).toBe(201);
      const { id } = (await first.json()) as { id: string };
      await revokeApiKey(svc.open.db, apiKey);
      const replay = await order();
      expect(replay.status).toBe(401);
      expect(await replay.text()).not.toContain(id);
    });
  });
}

const CLI = new URL("../../app/cli.ts", import.meta.url).pathname;
const run = promisify(execFile);

describe.skipIf(backend.name === "pglite")("npm run payments -- accounts revoke", () => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend);
  });
  afterAll(async () => {
    await svc?.stop();
  });

  it("revokes a key (exit 0; replays refused), and says so in one line when there is none (exit 1)", async () => {
    const { apiKey } = await createAccount(svc.open.db, "revoked by the command");
    const key = randomUUID();
    expect((await pay(svc.url, { key, apiKey })).status).toBe(201);
    const argv = ["--conditions=source", "--import", "tsx", CLI, "accounts", "revoke", "--api-key", apiKey];
    const args = [...argv, "--database-url", svc.open.url!];
    const ok = await run(process.execPath, args);
    expect(ok.stdout.trim()).toBe("api key revoked");
    expect((await pay(svc.url, { key, apiKey })).status).toBe(401);
    const again = await run(process.execPath, args).catch((e: { code: number; stderr: string }) => e);
    expect((again as { code: number }).code).toBe(1);
    expect((again as { stderr: string }).stderr.trim()).toBe(
      "idem-payments: no such API key (already revoked, or mistyped)",
    );
  }, 30_000);
});
