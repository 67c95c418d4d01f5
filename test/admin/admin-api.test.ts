/**
 * The admin API (`idem/admin`'s `adminHandler` over `Operations`), called with Fetch API requests as any
 * adapter would, on real keys made by a phases runner against the provider simulator: one paid, one
 * abandoned under a lease, one whose outcome is unknown (in review). A person finds a key by the ref a
 * customer pastes, reads its story, settles or forgets it; requeues parked outbox events, unparks inbox
 * messages, runs the audit. Every change must be in `admin_actions` with who did it.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adminHandler, bearerTokens, Operations, parseAdminTokens } from "../../src/admin/index.ts";
import { encodeOperationRef } from "../../src/core/index.ts";
import { Inbox } from "../../src/messaging/inbox.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { crashAt } from "../../src/testing/faults.ts";
import { claimOf, LEASE_MS, openWorld, serverOrEmbedded, type World } from "../phases/helpers.ts";

const PAY = { amount_cents: 1_100, currency: "eur" };
const ALICE = "alice:token-of-alice-0123456789";
const BOB = "bob:token-of-bob-000000000000";

describe.each(serverOrEmbedded.slice(0, 1))("the admin API on $name", (backend) => {
  let w: World;
  let api: (method: string, path: string, body?: unknown, token?: string | null) => Promise<Response>;
  /** A POST whose body is sent as text/plain. */
  let handlerWithText: (body: string) => Promise<Response>;
  const get = async (path: string) => {
    const res = await api("GET", path);
    return { status: res.status, body: (await res.json()) as Record<string, any> };
  };
  const post = async (path: string, body: unknown) => {
    const res = await api("POST", path, body);
    return { status: res.status, type: res.headers.get("content-type"), body: (await res.json()) as any };
  };

  beforeAll(async () => {
    w = await openWorld(backend, { idempotency: false });
    w.now.ms = Date.now() - 3_600_000; // keys made an hour ago
    await w.runner({ noIdempotency: "search" }).run(claimOf("acct", "paid", PAY), PAY);
    w.now.ms = Date.now() - 10_000; // its lease (30 s) still held now
    await expect(
      w
        .runner({ noIdempotency: "search", faults: crashAt("after-claim") })
        .run(claimOf("acct", "stuck", PAY), PAY),
    ).rejects.toBeInstanceOf(SimulatedCrashError);
    w.provider.failNext("late");
    await expect(
      w.runner({ noIdempotency: "none", timeoutMs: 300 }).run(claimOf("acct", "unknown", PAY), PAY),
    ).rejects.toMatchObject({ code: "operation-uncertain" });
    const handler = adminHandler({
      operations: new Operations({ store: w.store }),
      authorize: bearerTokens(parseAdminTokens(`${ALICE},${BOB}`)),
    });
    handlerWithText = (body) =>
      handler(
        new Request("http://admin.test/admin/api/keys/forget", {
          method: "POST",
          headers: { authorization: `Bearer ${ALICE.split(":")[1]}`, "content-type": "text/plain" },
          body,
        }),
      );
    api = (method, path, body, token = ALICE.split(":")[1]) =>
      handler(
        new Request(`http://admin.test/admin/api${path}`, {
          method,
          headers: {
            ...(token === null ? {} : { authorization: `Bearer ${token}` }),
            ...(body === undefined ? {} : { "content-type": "application/json" }),
          },
          body: body === undefined ? undefined : JSON.stringify(body),
        }),
      );
  });
  afterAll(async () => {
    await w?.close();
  });

  it("refuses requests without a valid token (401, problem+json) and names the token's holder", async () => {
    for (const token of [null, "wrong-token-0123456789", `${ALICE.split(":")[1]}x`]) {
      const res = await api("GET", "/keys?state=unfinished", undefined, token);
      expect(res.status).toBe(401);
      expect(res.headers.get("content-type")).toBe("application/problem+json");
      expect(res.headers.get("www-authenticate")).toContain("Bearer");
    }
    expect((await api("GET", "/nothing-here")).status).toBe(404);
    expect(() => parseAdminTokens("alice:short")).toThrow(/16 characters/);
    expect(parseAdminTokens("just-one-token-here")).toEqual([
      { name: "admin", token: "just-one-token-here" },
    ]);
  });

  it("answers an authorize hook's own refusal as it is, and a failing hook with a 500 that tells nothing", async () => {
    const operations = new Operations({ store: w.store });
    const errors: unknown[] = [];
    const forbidden = adminHandler({
      operations,
      authorize: () => new Response("not in the support group", { status: 403 }),
    });
    const res = await forbidden(new Request("http://admin.test/admin/api/keys?state=unfinished"));
    expect([res.status, await res.text()]).toEqual([403, "not in the support group"]);
    const broken = adminHandler({
      operations,
      authorize: () => {
        throw new Error("sso down: secret detail");
      },
      onError: (err) => errors.push(err),
    });
    const failed = await broken(new Request("http://admin.test/admin/api/keys?state=unfinished"));
    expect(failed.status).toBe(500);
    expect(await failed.text()).not.toContain("secret");
    expect(errors).toHaveLength(1);
  });

  it("refuses bodies that are not a JSON object (400), before touching anything", async () => {
    const res = await api("POST", "/keys/forget", "[1]");
    expect(res.status).toBe(400);
    const text = await handlerWithText("not json");
    expect(text.status).toBe(400);
    expect(((await text.json()) as { detail: string }).detail).toContain("application/json");
  });

  it("finds a key by the operation_ref a customer pastes, with its recorded story", async () => {
    const ref = encodeOperationRef("acct", "paid");
    const byRef = await get(`/keys/find?ref=${encodeURIComponent(` ${ref} `)}`);
    expect(byRef.status).toBe(200);
    expect(byRef.body.key).toMatchObject({ scope: "acct", key: "paid", state: "done" });
    // The key's own ref names its claim: what its answers carried (Idempotency-Operation-Ref).
    expect(byRef.body.key.ref).toBe(encodeOperationRef("acct", "paid", byRef.body.key.claimId));
    const kinds = byRef.body.timeline.map((e: { kind: string }) => e.kind);
    expect(kinds[0]).toBe("claimed");
    expect(kinds).toContain("answer-saved");
    expect(kinds.at(-1)).toBe("expires");
    // Phases mode records the key's history: the claim's lease, the call, the recovery point, the answer.
    expect(kinds).toEqual(["claimed", "call-begun", "recovery-point", "answer-saved", "expires"]);
    expect(byRef.body.notRecorded.join(" ")).not.toMatch(/takeovers/);

    const stuck = await get("/keys/find?scope=acct&key=stuck");
    const lease = stuck.body.timeline.find((e: { kind: string }) => e.kind === "lease");
    expect(lease.text).toContain(stuck.body.key.lease.token); // the fencing token
    const unknown = await get(`/keys/find?ref=${encodeOperationRef("acct", "unknown")}`);
    expect(unknown.body.key.state).toBe("needs_review");
    expect(unknown.body.timeline.map((e: { kind: string }) => e.kind)).toEqual(
      expect.arrayContaining(["call-begun", "review-opened"]),
    );

    expect((await get("/keys/find?ref=op_notours")).status).toBe(400);
    expect((await get("/keys/find?scope=acct&key=never")).status).toBe(404);
  });

  it("lists keys waiting for a person, unfinished, and expiring", async () => {
    const review = await get("/keys?state=needs_review");
    expect(review.body.items.map((r: { key: string }) => r.key)).toEqual(["unknown"]);
    const unfinished = await get("/keys?state=unfinished");
    expect(unfinished.body.items.map((k: { key: string }) => k.key)).toEqual(["stuck"]);
    // Retention 24 h: the key claimed an hour ago expires in 23 h, the others in about 24 h.
    const soon = await get(`/keys?state=expiring&within_seconds=${23.5 * 3600}`);
    expect(soon.body.items.map((k: { key: string }) => k.key)).toEqual(["paid"]);
    const all = await get(`/keys?state=expiring&within_seconds=${25 * 3600}`);
    expect(all.body.items.map((k: { key: string }) => k.key)).toEqual(["paid", "stuck", "unknown"]);
    expect((await get("/keys?state=everything")).status).toBe(400);
  });

  it("forgets a key only with a reason, never in review or under a live lease; recorded", async () => {
    const unknown = await post("/keys/forget", { scope: "acct", key: "unknown", reason: "customer asked" });
    expect(unknown.status).toBe(409);
    expect(unknown.body.detail).toMatch(/settle/);
    expect((await post("/keys/forget", { scope: "acct", key: "stuck" })).status).toBe(400);
    const leased = await post("/keys/forget", { scope: "acct", key: "stuck", reason: "reset" });
    expect(leased.status).toBe(409);
    expect(leased.body.detail).toMatch(/lease/);

    w.now.ms = Date.now() + LEASE_MS; // the crashed worker's lease is over
    const done = await post("/keys/forget", {
      ref: encodeOperationRef("acct", "stuck"),
      reason: "the customer's payment failed before the provider; they retry with the same key",
    });
    expect(done.status).toBe(200);
    expect(done.body.forgotten).toMatchObject({ key: "stuck", state: "in_progress" });
    expect((await get("/keys/find?scope=acct&key=stuck")).status).toBe(404);
    expect(await w.db.query("SELECT 1 FROM idem.keys WHERE key = 'stuck'")).toMatchObject({ rows: [] });
    const actions = await get("/actions?scope=acct&key=stuck");
    expect(actions.body.actions).toMatchObject([
      { actor: "alice", action: "key.forget", reason: expect.stringMatching(/retry with the same key/) },
    ]);
  });

  it("settles a key in review on the record: who, how, why; then the key replays the answer", async () => {
    expect(
      (await post("/keys/settle", { scope: "acct", key: "unknown", answer: { status: 201 } })).status,
    ).toBe(400); // no note
    const settled = await post("/keys/settle", {
      ref: encodeOperationRef("acct", "unknown"),
      answer: { status: 402, body: { error: "card declined at the provider" } },
      note: "provider dashboard: the charge was declined",
    });
    expect(settled.status).toBe(200);
    expect(settled.body.review).toMatchObject({ settledBy: "alice", key: "unknown" });
    const again = await post("/keys/settle", {
      scope: "acct",
      key: "unknown",
      answer: { status: 201 },
      note: "twice",
    });
    expect(again.status).toBe(409);

    const story = await get(`/keys/find?ref=${encodeOperationRef("acct", "unknown")}`);
    expect(story.body.key).toMatchObject({ state: "done", saved: { status: 402 } });
    const settledEvent = story.body.timeline.find((e: { kind: string }) => e.kind === "review-settled");
    expect(settledEvent.text).toContain("alice");
    expect(story.body.actions).toMatchObject([
      { actor: "alice", action: "key.settle", reason: "provider dashboard: the charge was declined" },
    ]);
    expect((await get("/keys?state=needs_review")).body.items).toEqual([]);
  });

  it("shows parked outbox events and requeues an aggregate's; recorded", async () => {
    const first = await w.db.transaction((tx) =>
      writeOutbox(tx, { topic: "t", type: "a.created", aggregateId: "agg-1", payload: { n: 1 } }),
    );
    await w.db.transaction((tx) =>
      writeOutbox(tx, { topic: "t", type: "a.updated", aggregateId: "agg-1", payload: { n: 2 } }),
    );
    await w.db.query(
      "UPDATE idem.outbox SET parked_at = now(), attempts = 10, last_error = 'broker said no' WHERE id = $1",
      [first],
    );
    const outbox = await get("/outbox");
    expect(outbox.body.counts).toMatchObject({ parked: 1 });
    expect(outbox.body.parked).toMatchObject([
      { id: first, aggregateId: "agg-1", lastError: "broker said no", heldBack: 1, payload: { n: 1 } },
    ]);
    expect(outbox.body.lagSeconds).toBeGreaterThanOrEqual(0);
    expect((await post("/outbox/requeue", {})).status).toBe(400);
    const requeued = await post("/outbox/requeue", { aggregate_id: "agg-1", reason: "broker fixed" });
    expect(requeued.body).toEqual({ requeued: 1 });
    expect((await get("/outbox")).body.parked).toEqual([]);
    const actions = (await get("/actions")).body.actions;
    expect(actions[0]).toMatchObject({
      actor: "alice",
      action: "outbox.requeue",
      target: "aggregate agg-1",
      details: { requeued: 1 },
    });
  });

  it("shows every consumer's parked messages and unparks one; recorded", async () => {
    const inbox = new Inbox(w.db, { consumer: "emails", maxAttempts: 1 });
    const message = { id: "m-1", topic: "t", type: "x", body: "{}", headers: {}, redelivered: false };
    expect(
      await inbox.process(message, async () => {
        throw new Error("smtp down");
      }),
    ).toBe("parked");
    const parked = await get("/inbox");
    expect(parked.body.parked).toMatchObject([
      { consumer: "emails", messageId: "m-1", lastError: "smtp down" },
    ]);
    expect((await post("/inbox/unpark", { consumer: "emails", message_id: "m-1" })).status).toBe(200);
    expect((await post("/inbox/unpark", { consumer: "emails", message_id: "m-1" })).status).toBe(404);
    expect(await inbox.parked()).toEqual([]);
    expect((await get("/actions")).body.actions[0]).toMatchObject({
      action: "inbox.unpark",
      target: "emails m-1",
    });
  });

  it("runs the audit's invariants and keeps the last result; bob's actions are bob's", async () => {
    expect((await get("/audit")).status).toBe(404);
    const run = await api("POST", "/audit", undefined, BOB.split(":")[1]);
    expect(run.status).toBe(200);
    const last = await get("/audit");
    expect(last.body.actor).toBe("bob");
    expect(last.body.results.map((r: { name: string }) => r.name)).toEqual([
      "one-answer-per-key",
      "unfinished-past-leases",
      "review-too-old",
    ]);
    expect(last.body.results.every((r: { violations: number }) => r.violations === 0)).toBe(true);
    const { rows } = await w.db.query<{ actor: string; action: string }>(
      "SELECT actor, action FROM idem.admin_actions ORDER BY id",
    );
    expect(rows).toEqual([
      { actor: "alice", action: "key.forget" },
      { actor: "alice", action: "key.settle" },
      { actor: "alice", action: "outbox.requeue" },
      { actor: "alice", action: "inbox.unpark" },
      { actor: "bob", action: "audit.run" },
    ]);
  });

  it("shows a takeover: both leases with their fencing tokens, the lookup, the refused stale write", async () => {
    const key = "taken-over";
    const c = claimOf("acct", key, PAY);
    const before = w.now.ms;
    let b: Promise<unknown> | undefined;
    // Worker A charges, then stalls past its lease; worker B takes the key over, looks the charge up
    // and finishes; A wakes up and its write is refused by the fence.
    const stalling = {
      at: async (info: { point: string; phase: string }) => {
        if (info.point !== "after-external" || b) return false;
        w.now.ms += LEASE_MS + 1;
        b = w.runner({ noIdempotency: "search" }).run(c, PAY);
        await b;
        return false;
      },
    };
    await expect(w.runner({ noIdempotency: "search", faults: stalling }).run(c, PAY)).rejects.toMatchObject({
      name: "LeaseLostError",
    });
    expect(await b).toMatchObject({ kind: "executed", response: { status: 201 } });
    w.now.ms = before; // the other tests' leases and expiries as they were
    expect(await w.counts(key)).toMatchObject({ charges: 1, payments: 1 }); // B found A's charge

    const story = await get(`/keys/find?ref=${encodeOperationRef("acct", key)}`);
    expect(story.status).toBe(200);
    const timeline = story.body.timeline as { at: string; kind: string; text: string; details: any }[];
    expect(timeline.map((e) => e.kind)).toEqual([
      "claimed",
      "call-begun",
      "takeover",
      "lookup",
      "recovery-point",
      "answer-saved",
      "fencing-refused",
      "expires",
    ]);
    const [claimed, begun, takeover, lookup, point, saved, refused] = timeline;
    const a = claimed!.details.token as string;
    const bToken = takeover!.details.token as string;
    expect(a).toMatch(/^[0-9a-f-]{36}$/);
    expect(bToken).not.toBe(a);
    // Each entry names the fencing token of the worker that wrote it; the takeover names both.
    expect(claimed!.text).toContain(a);
    expect(begun!.text).toContain(a);
    expect(takeover!.text).toContain(bToken);
    expect(takeover!.text).toContain(a);
    expect(takeover!.details).toMatchObject({ point: "started", replaced: a });
    expect(lookup!.details).toMatchObject({ point: "started", found: "found" });
    expect(lookup!.details.token).toBe(bToken);
    expect(point!.details).toMatchObject({ point: "charged" });
    expect(point!.details.token).toBe(bToken);
    expect(saved!.details.token).toBe(bToken);
    expect(saved!.details).toMatchObject({ status: 201 });
    expect(refused!.details.token).toBe(a);
    expect(refused!.text).toContain(a);
    // In time order, the takeover a lease after the claim.
    const at = timeline.slice(0, -1).map((e) => Date.parse(e.at));
    expect(at).toEqual([...at].sort((x, y) => x - y));
    expect(at[2]! - at[0]!).toBeGreaterThanOrEqual(LEASE_MS);
    expect(story.body.notRecorded.join(" ")).toMatch(/heartbeats/);
  });
});
