/**
 * The admin API (`idem/admin`'s `adminHandler` over `Operations`), called with Fetch API requests as any
 * adapter would, on real keys made by a phases runner against the provider simulator: one paid, one
 * abandoned under a lease, one whose outcome is unknown (in review). A person finds a key by the ref a
 * customer pastes, reads its story, settles or forgets it; requeues parked outbox events, unparks inbox
 * messages, runs the audit. Every change must be in `admin_actions` with who did it.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adminHandler, bearerTokens, Operations, parseAdminTokens } from "../../src/admin/index.ts";
import { Inbox } from "../../src/messaging/inbox.ts";
import { writeOutbox } from "../../src/postgres/outbox.ts";
import { SimulatedCrashError } from "../../src/postgres/phases/index.ts";
import { crashAt } from "../../src/testing/faults.ts";
import { claimOf, LEASE_MS, openWorld, serverOrEmbedded, type World } from "../phases/helpers.ts";

const PAY = { amount_cents: 1_100, currency: "eur" };
const ALICE = "alice:token-of-alice-0123456789";
const BOB = "bob:Hq7vX2mR9pL4sK8wZ3nT6yB1";

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
    // At least 128 bits in every form, refused naming the setting.
    for (const weak of ["alice:short", "x", "just-one-token-here", "0123456789abcdef0123456789abcde"]) {
      expect(() => parseAdminTokens(weak), weak).toThrow(/^IDEM_ADMIN_TOKEN: .*too weak/);
    }
    expect(() => parseAdminTokens("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")).toThrow(/too few characters/);
    expect(() => bearerTokens([{ name: "carol", token: "secret" }])).toThrow(/too weak/);
    expect(() => parseAdminTokens(":Hq7vX2mR9pL4sK8wZ3nT6yB1", "MY_TOKENS")).toThrow(/^MY_TOKENS: /);
    expect(parseAdminTokens("Hq7vX2mR9pL4sK8wZ3nT6yB1")).toEqual([
      { name: "admin", token: "Hq7vX2mR9pL4sK8wZ3nT6yB1" },
    ]);
    expect(parseAdminTokens("0123456789abcdef0123456789abcdef")).toHaveLength(1); // 32 hex digits
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
    const ref = w.store.refs.encode("acct", "paid");
    const byRef = await get(`/keys/find?ref=${encodeURIComponent(` ${ref} `)}`);
    expect(byRef.status).toBe(200);
    expect(byRef.body.key).toMatchObject({ scope: "acct", key: "paid", state: "done" });
    // The key's own ref names its claim: what its answers carried (Idempotency-Operation-Ref).
    expect(byRef.body.key.ref).toBe(w.store.refs.encode("acct", "paid", byRef.body.key.claimId));
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
    const unknown = await get(`/keys/find?ref=${w.store.refs.encode("acct", "unknown")}`);
    expect(unknown.body.key.state).toBe("needs_review");
    expect(unknown.body.timeline.map((e: { kind: string }) => e.kind)).toEqual(
      expect.arrayContaining(["call-begun", "review-opened"]),
    );

    // A ref that does not open is an unknown key; a scope or key the key rules refuse is 400, and
    // neither reaches the database.
    const notFound = await get("/keys/find?scope=acct&key=never");
    expect(notFound.status).toBe(404);
    const forged = `op_${Buffer.from(JSON.stringify(["acct", "pa\u0000id"])).toString("base64url")}`;
    for (const bad of ["op_notours", forged, `${ref.slice(0, -2)}xx`]) {
      expect(await get(`/keys/find?ref=${encodeURIComponent(bad)}`)).toEqual(notFound);
    }
    for (const q of [
      "scope=acct&key=pa%00id",
      "scope=ac%00ct&key=paid",
      "scope=acct&key=pa%1bid",
      "ref=op_%00",
    ]) {
      expect((await get(`/keys/find?${q}`)).status, q).toBe(400);
    }
    expect((await get("/actions?scope=acct&key=a%00b")).status).toBe(400);
    expect((await get("/inbox?consumer=e%00")).status).toBe(400);
    const nul = await post("/keys/settle", {
      scope: "acct",
      key: "unknown",
      note: "a\u0000b",
      answer: { status: 201 },
    });
    expect(nul.status).toBe(400);
    expect(nul.body.detail).toMatch(/NUL/);
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

  it("forgets only a key whose records show nothing can be repeated; an override only for a reversed effect", async () => {
    const forget = (body: Record<string, unknown>) =>
      post("/keys/forget", { reason: "customer asked", ...body });
    // In review, or under a live lease: never, not even by a person who says they reversed it.
    for (const effect_reversed of [false, true]) {
      const unknown = await forget({ scope: "acct", key: "unknown", effect_reversed });
      expect(unknown.status).toBe(409);
      expect(unknown.body.detail).toMatch(/settle/);
      const leased = await forget({ scope: "acct", key: "stuck", effect_reversed });
      expect(leased.status).toBe(409);
      expect(leased.body.detail).toMatch(/lease/);
    }
    expect((await post("/keys/forget", { scope: "acct", key: "stuck" })).status).toBe(400);
    // A saved success: its charge happened, and a retry after forgetting would charge again.
    const paid = await forget({ scope: "acct", key: "paid" });
    expect(paid.status).toBe(409);
    expect(paid.body.detail).toMatch(/saved answer \(201\) says the operation took effect/);
    expect(paid.body.detail).toMatch(/effect_reversed/);
    const story = await get("/keys/find?scope=acct&key=paid");
    expect(story.body.forget).toMatchObject({
      allowed: false,
      overridable: true,
      why: expect.stringMatching(/201/),
    });
    expect((await get("/keys/find?scope=acct&key=paid")).status).toBe(200); // still there

    // A saved 4xx applied nothing: it may go.
    w.provider.failNext("decline");
    const declined = await w.runner({ noIdempotency: "search" }).run(claimOf("acct", "declined", PAY), PAY);
    expect(declined).toMatchObject({ response: { status: 402 } });
    expect((await get("/keys/find?scope=acct&key=declined")).body.forget).toMatchObject({ allowed: true });
    const gone = await forget({ ref: w.store.refs.encode("acct", "declined"), reason: "new card, same key" });
    expect(gone.status).toBe(200);
    expect((await get("/keys/find?scope=acct&key=declined")).status).toBe(404);

    // The crashed worker's lease is over, but nothing says what it did before it stopped.
    w.now.ms = Date.now() + LEASE_MS;
    const stuck = await forget({ ref: w.store.refs.encode("acct", "stuck") });
    expect(stuck.status).toBe(409);
    expect(stuck.body.detail).toMatch(/lease ran out/);
    const reversed = await forget({
      ref: w.store.refs.encode("acct", "stuck"),
      reason: "no charge at the provider for this reference; the customer retries with the same key",
      effect_reversed: true,
    });
    expect(reversed.status).toBe(200);
    expect(reversed.body.forgotten).toMatchObject({ key: "stuck", state: "in_progress" });
    expect((await get("/keys/find?scope=acct&key=stuck")).status).toBe(404);
    expect(await w.db.query("SELECT 1 FROM idem.keys WHERE key = 'stuck'")).toMatchObject({ rows: [] });
    expect((await get("/actions?scope=acct&key=stuck")).body.actions).toMatchObject([
      {
        actor: "alice",
        action: "key.forget.effect-reversed",
        reason: expect.stringMatching(/retries with the same key/),
        details: {
          effectReversed: true,
          verdict: { allowed: false, why: expect.stringMatching(/lease ran out/) },
        },
      },
    ]);
    expect((await get("/actions?scope=acct&key=declined")).body.actions).toMatchObject([
      { actor: "alice", action: "key.forget", details: { verdict: { allowed: true } } },
    ]);
  });

  it("settles a key in review on the record: who, how, why; then the key replays the answer", async () => {
    expect(
      (await post("/keys/settle", { scope: "acct", key: "unknown", answer: { status: 201 } })).status,
    ).toBe(400); // no note
    const settled = await post("/keys/settle", {
      ref: w.store.refs.encode("acct", "unknown"),
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

    const story = await get(`/keys/find?ref=${w.store.refs.encode("acct", "unknown")}`);
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
      // The failed authentications of the first tests (three 401s, the hook's 403), nobody's.
      ...Array.from({ length: 4 }, () => ({ actor: "-", action: "admin.auth-failed" })),
      { actor: "alice", action: "key.forget" },
      { actor: "alice", action: "key.forget.effect-reversed" },
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

    const story = await get(`/keys/find?ref=${w.store.refs.encode("acct", key)}`);
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

  it("limits failed authentications per source (429 with Retry-After), and records them", async () => {
    const handler = adminHandler({
      operations: new Operations({ store: w.store }),
      authorize: bearerTokens(parseAdminTokens(ALICE)),
      authLimit: { failures: 3, windowMs: 60_000 },
    });
    const from = (source: string, token: string) =>
      handler(
        new Request("http://admin.test/admin/api/me", { headers: { authorization: `Bearer ${token}` } }),
        { source },
      );
    const good = ALICE.split(":")[1]!;
    for (let i = 0; i < 3; i++)
      expect((await from("203.0.113.7", `guess-${i}-0123456789abcdef`)).status).toBe(401);
    for (const token of ["guess-again-0123456789abcdef", good]) {
      const limited = await from("203.0.113.7", token); // even the right token, until it refills
      expect(limited.status).toBe(429);
      expect(Number(limited.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
      expect(limited.headers.get("content-type")).toBe("application/problem+json");
    }
    expect((await from("198.51.100.2", good)).status).toBe(200); // another source is not held back
    const { rows } = await w.db.query<{ actor: string; action: string; target: string }>(
      "SELECT actor, action, target FROM idem.admin_actions WHERE target = '203.0.113.7' ORDER BY id",
    );
    expect(rows).toEqual([
      ...Array.from({ length: 3 }, () => ({
        actor: "-",
        action: "admin.auth-failed",
        target: "203.0.113.7",
      })),
      { actor: "-", action: "admin.auth-limited", target: "203.0.113.7" }, // once per streak
    ]);
  });
});
