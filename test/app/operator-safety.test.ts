/**
 * No operator action or forged reference can charge twice or break the service (issue 57), against the
 * reference service in phases mode over HTTP, its admin API with a real token, and `idem keys`:
 *
 * - forgetting a paid key is refused; the customer's retry replays (one payment, one provider charge)
 * - references carry nothing readable; forged, altered, foreign and unknown ones get one and the same 404
 * - a NUL or another control character on any route (the OpenAPI document's, the lookup, the admin
 *   API) is 400 or 404, never 500
 * - a settlement without what its phase needs is refused before anything changes, and a key is never
 *   left answering 500
 * - a stored reply no key can open is a definite, non-retryable problem that says so
 */
import { randomBytes, randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DEMO_ACCOUNTS } from "../../app/accounts.ts";
import { AesGcmSealer } from "../../src/core/index.ts";
import { idem } from "../helpers/cli.ts";
import { backends } from "../helpers/db.ts";
import { claimOf, paymentsRunner } from "../phases/helpers.ts";
import { KEY_1, KEY_2, pay, type RunningService, startService } from "./service.ts";

const backend = backends.find((b) => b.name === "pg") ?? backends[0]!;
const ACCOUNT = DEMO_ACCOUNTS[0];
const TOKEN = "Hq7vX2mR9pL4sK8wZ3nT6yB1";
const PAY = { amount_cents: 5000, currency: "eur" };
const REF = "idempotency-operation-ref";

const admin = (svc: RunningService, method: string, path: string, body?: unknown) =>
  fetch(`${svc.url}/admin/api${path}`, {
    method,
    headers: {
      authorization: `Bearer ${TOKEN}`,
      ...(body === undefined ? {} : { "content-type": "application/json" }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });

const lookup = (svc: RunningService, ref: string, apiKey = KEY_1) =>
  fetch(`${svc.url}/v1/operations/${encodeURIComponent(ref)}`, {
    headers: { authorization: `Bearer ${apiKey}` },
  });

describe(`operator actions and references on the service (${backend.name})`, () => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend, {
      paymentsMode: "phases",
      providerIdempotency: false,
      adminTokens: `alice:${TOKEN}`,
    });
  });
  afterAll(async () => {
    await svc?.stop();
  });
  /** A charge at a provider without idempotency keys whose answer never came: only a person can tell. */
  const toReview = async (key: string) => {
    svc.provider!.failNext("late");
    await expect(
      paymentsRunner(svc.store, svc.providerUrl!, { noIdempotency: "none", timeoutMs: 300 }).run(
        claimOf(ACCOUNT.id, key, PAY),
        PAY,
      ),
    ).rejects.toMatchObject({ code: "operation-uncertain" });
  };
  const payments = () =>
    svc.count("SELECT count(*)::int AS n FROM payments WHERE account_id = $1", [ACCOUNT.id]);

  it("forgetting a paid key is refused; the retry replays: one payment, one charge", async () => {
    const key = randomUUID();
    const first = await pay(svc.url, { key });
    expect(first.status).toBe(201);
    const body = await first.text();
    const before = { payments: await payments(), charges: svc.provider!.charges().length };
    const forget = await admin(svc, "POST", "/keys/forget", {
      scope: ACCOUNT.id,
      key,
      reason: "customer says it failed",
    });
    expect(forget.status).toBe(409);
    expect(((await forget.json()) as { detail: string }).detail).toMatch(/saved answer \(201\)/);
    const retry = await pay(svc.url, { key });
    expect(retry.status).toBe(201);
    expect(retry.headers.get("idempotent-replayed")).toBe("true");
    expect(await retry.text()).toBe(body);
    expect(await payments()).toBe(before.payments);
    expect(svc.provider!.charges().length).toBe(before.charges);
    // The CLI says the same, and changes nothing either.
    if (svc.open.url) {
      const cli = await idem(
        "keys",
        "forget",
        ACCOUNT.id,
        key,
        "--reason",
        "ticket 7",
        "--database-url",
        svc.open.url,
      );
      expect(cli.code).toBe(1);
      expect(cli.err).toMatch(/saved answer \(201\)/);
    }
    expect((await pay(svc.url, { key })).status).toBe(201);
    expect(await payments()).toBe(before.payments);
  });

  it("a reference tells a reader nothing; forged, altered, foreign and unknown ones are one 404", async () => {
    const key = `order-${randomUUID()}`;
    const paid = await pay(svc.url, { key });
    const ref = paid.headers.get(REF)!;
    await paid.arrayBuffer();
    const raw = Buffer.from(ref.slice(3), "base64url");
    for (const view of [ref, raw.toString("latin1"), raw.toString("hex")]) {
      expect(view).not.toContain(ACCOUNT.id);
      expect(view).not.toContain(key);
      expect(view).not.toContain(Buffer.from(key).toString("hex"));
    }
    expect((await lookup(svc, ref)).status).toBe(201);
    const flipped = Buffer.from(raw);
    flipped[flipped.length - 17]! ^= 0x80;
    const old = (parts: string[]) => `op_${Buffer.from(JSON.stringify(parts)).toString("base64url")}`;
    const others = [
      old([ACCOUNT.id, key]), // the old readable form
      old([ACCOUNT.id, "k\u0000ey"]), // ... with a NUL: it was a 500
      old([ACCOUNT.id, "k\u0001"]),
      `op_${flipped.toString("base64url")}`,
      `op_${raw.subarray(0, raw.length - 3).toString("base64url")}`,
      `op_${randomBytes(90).toString("base64url")}`,
      "op_%00",
      "op_",
    ];
    const unknown = await lookup(svc, `op_${randomBytes(90).toString("base64url")}`);
    const expected = { status: unknown.status, body: await unknown.text() };
    expect(expected.status).toBe(404);
    for (const r of others) {
      const res = await lookup(svc, r);
      expect({ status: res.status, body: await res.text() }, r).toEqual(expected);
    }
    // Another account's reference: the same 404, to that account.
    const foreign = await lookup(svc, ref, KEY_2);
    expect({ status: foreign.status, body: await foreign.text() }).toEqual(expected);
  });

  it("a NUL or a control character anywhere: 400 or 404 on every route, never 500", async () => {
    const doc = (await (await fetch(`${svc.url}/openapi.json`)).json()) as {
      paths: Record<string, Record<string, unknown>>;
    };
    const tried: string[] = [];
    const statuses = new Map<number, number>();
    for (const [path, methods] of Object.entries(doc.paths)) {
      for (const method of Object.keys(methods)) {
        for (const bad of ["%00", "a%00b", "%01", "%7F", "%1B[2J"]) {
          const url = `${svc.url}${path.replace(/\{[^}]+\}/g, bad)}${path.includes("{") ? "" : `?limit=${bad}`}`;
          const res = await fetch(url, {
            method: method.toUpperCase(),
            headers: {
              authorization: `Bearer ${KEY_1}`,
              "content-type": "application/json",
              "idempotency-key": randomUUID(),
            },
            body:
              method === "get" || method === "head"
                ? undefined
                : JSON.stringify({ amount_cents: 1, currency: "e\u0000r" }),
          });
          await res.arrayBuffer();
          tried.push(`${method} ${url} ${res.status}`);
          statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
          expect(res.status, `${method} ${url}`).toBeGreaterThanOrEqual(400);
          expect(res.status, `${method} ${url}`).toBeLessThan(500);
        }
      }
    }
    expect(tried.length).toBeGreaterThan(20);
    // A NUL in a JSON body is refused before anything is claimed.
    const nulBody = await pay(svc.url, {
      key: randomUUID(),
      body: JSON.stringify({ amount_cents: 100, currency: "eur", card: "4242\u0000" }),
    });
    expect(nulBody.status).toBe(400);
    // The admin API: scope, key, ref, query values and bodies.
    const adminCases: Array<[string, string, unknown?]> = [
      ["GET", "/keys/find?scope=acct%00&key=k"],
      ["GET", "/keys/find?scope=acct&key=k%00"],
      ["GET", "/keys/find?scope=acct&key=k%1B"],
      [
        "GET",
        `/keys/find?ref=${encodeURIComponent(`op_${Buffer.from(JSON.stringify(["a", "b\u0000"])).toString("base64url")}`)}`,
      ],
      ["GET", "/keys/find?ref=op_%00"],
      ["GET", "/keys?state=needs_review%00"],
      ["GET", "/actions?scope=a%00"],
      ["GET", "/inbox?consumer=e%00"],
      ["POST", "/keys/forget", { scope: "acct\u0000", key: "k", reason: "r" }],
      ["POST", "/keys/forget", { scope: ACCOUNT.id, key: "k\u0000", reason: "r" }],
      ["POST", "/keys/settle", { scope: ACCOUNT.id, key: "k", note: "n\u0000", answer: { status: 201 } }],
      ["POST", "/inbox/unpark", { consumer: "c\u0000", message_id: "m" }],
      ["POST", "/outbox/requeue", { aggregate_id: "a\u0000" }],
    ];
    for (const [method, path, body] of adminCases) {
      const res = await admin(svc, method, path, body);
      expect([400, 404], `${method} ${path} ${JSON.stringify(body)}: ${res.status}`).toContain(res.status);
      await res.arrayBuffer();
    }
  });

  it("a settlement without what its phase needs is refused, changing nothing; the key never answers 500", async () => {
    const key = `order-${randomUUID()}`;
    await toReview(key);
    const state = async () => (await svc.store.inspect(ACCOUNT.id, key))?.state;
    expect(await state()).toBe("needs_review");

    const wrong = await admin(svc, "POST", "/keys/settle", {
      scope: ACCOUNT.id,
      key,
      resume: "charged",
      data: {},
      note: "found it",
    });
    expect(wrong.status).toBe(422);
    expect(((await wrong.json()) as { detail: string }).detail).toMatch(/needs chargeId/);
    const nowhere = await admin(svc, "POST", "/keys/settle", {
      scope: ACCOUNT.id,
      key,
      resume: "shipped",
      data: { chargeId: "ch_1" },
      note: "found it",
    });
    expect(nowhere.status).toBe(422);
    if (svc.open.url) {
      const cli = await idem(
        ...["keys", "settle", ACCOUNT.id, key, "--resume", "charged", "--data", "{}", "--note", "found"],
        ...["--database-url", svc.open.url],
      );
      expect(cli.code).toBe(1);
      expect(cli.err).toMatch(/needs chargeId.*nothing was changed/);
    }
    // Nothing changed: still in review, its retries told so (409), never 500.
    expect(await state()).toBe("needs_review");
    const meanwhile = await pay(svc.url, { key, body: JSON.stringify(PAY) });
    expect(meanwhile.status).toBe(409);
    expect(((await meanwhile.json()) as { type: string }).type).toMatch(/operation-uncertain/);

    // The right settlement: the charge the person found at the provider.
    const claimId = (await svc.store.inspect(ACCOUNT.id, key))!.claimId;
    const charge = svc.provider!.charges().find((c) => c.reference === `${ACCOUNT.id}:${claimId}`);
    expect(charge).toBeDefined();
    const settled = await admin(svc, "POST", "/keys/settle", {
      scope: ACCOUNT.id,
      key,
      resume: "charged",
      data: { chargeId: charge!.id },
      note: "provider dashboard: charged",
    });
    expect(settled.status).toBe(200);
    const done = await pay(svc.url, { key, body: JSON.stringify(PAY) });
    expect(done.status).toBe(201);
    expect(((await done.json()) as { charge: string }).charge).toBe(charge!.id);
  });

  it("a review recorded before its phases' needs: a bad settlement sends the key back to review, not to 500", async () => {
    const key = `order-${randomUUID()}`;
    await toReview(key);
    await svc.open.db.query("UPDATE idem.reviews SET phases = NULL WHERE key = $1", [key]);
    const settled = await admin(svc, "POST", "/keys/settle", {
      scope: ACCOUNT.id,
      key,
      resume: "charged",
      data: {},
      note: "found nothing, resume anyway",
    });
    expect(settled.status).toBe(200); // nothing to check it against
    for (let i = 0; i < 3; i++) {
      const res = await pay(svc.url, { key, body: JSON.stringify(PAY) });
      expect(res.status).toBe(409);
      expect(((await res.json()) as { type: string }).type).toMatch(/operation-uncertain/);
    }
    const [review] = (
      (await (await admin(svc, "GET", "/keys?state=needs_review")).json()) as {
        items: Array<{ key: string; reason: string }>;
      }
    ).items.filter((r) => r.key === key);
    expect(review!.reason).toMatch(/"charged" needs chargeId/);
  });
});

describe(`a stored reply no key can open, on the service (${backend.name})`, () => {
  let svc: RunningService;
  beforeAll(async () => {
    svc = await startService(backend, {
      paymentsMode: "atomic",
      sealer: new AesGcmSealer([{ id: "k1", key: randomBytes(32) }]),
    });
  });
  afterAll(async () => {
    await svc?.stop();
  });

  it("is a definite problem, not retried, that says so: not a 503 asking for a retry", async () => {
    const key = randomUUID();
    const first = await pay(svc.url, { key });
    expect(first.status).toBe(201);
    const ref = first.headers.get(REF)!;
    await first.arrayBuffer();
    // Someone with write access flips a byte of the sealed reply.
    await svc.open.db.query(
      "UPDATE idem.keys SET body = set_byte(body, octet_length(body) - 20, (get_byte(body, octet_length(body) - 20) + 1) % 256) WHERE key = $1",
      [key],
    );
    for (const res of [await pay(svc.url, { key }), await lookup(svc, ref)]) {
      expect(res.status).toBe(500);
      expect(res.headers.get("retry-after")).toBeNull();
      const problem = (await res.json()) as Record<string, unknown>;
      expect(problem).toMatchObject({
        type: "urn:idem:problem:stored-value-unreadable",
        operation_state: "uncertain",
        retry_same_key: false,
        safe_new_key: false,
      });
      expect(String(problem.detail)).toMatch(/altered.*do not retry/);
    }
    expect(
      await svc.count("SELECT count(*)::int AS n FROM payments WHERE account_id = $1", [ACCOUNT.id]),
    ).toBe(1);
  });
});
