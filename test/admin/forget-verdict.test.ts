/**
 * The forget rule on its own (idem/admin's forgetVerdict): the cases the service tests do not reach
 * through a live key. A key that was taken over, fenced off or looked up at the provider may have had
 * its effect, so forgetting it (a new claim id, a new downstream key) could charge again: refused, but
 * overridable by a person who reversed it. A phases claim whose every lease was freed before any call
 * went out is allowed.
 */
import { type ForgetFacts, forgetVerdict } from "idem/admin";
import { describe, expect, it } from "vitest";

type KeyInspection = ForgetFacts["key"];
const at = new Date("2026-12-04T10:00:00Z");
const key = (over: Partial<KeyInspection> = {}): KeyInspection => ({
  scope: "acct_1",
  key: "k-1",
  ref: "ref",
  claimId: "0193a1b2-0000-7000-8000-000000000001",
  state: "in_progress",
  recoveryPoint: "started",
  createdAt: at,
  expiresAt: new Date(at.getTime() + 86_400_000),
  updatedAt: null,
  lease: null,
  fingerprint: "f".repeat(64),
  saved: null,
  runner: "payments",
  phaseData: null,
  ...over,
});
type Kind = ForgetFacts["history"][number]["kind"];
const events = (...kinds: [Kind, Record<string, unknown>?][]) =>
  kinds.map(([kind, details], i) => ({
    at: new Date(at.getTime() + i * 1_000),
    kind,
    token: "t1",
    details: details ?? null,
  }));
const facts = (over: Partial<ForgetFacts>): ForgetFacts => ({
  key: key(),
  history: [],
  leaseLive: false,
  attempted: false,
  lookupFailures: 0,
  ...over,
});

describe("forgetting a key: the rule", () => {
  it("refuses a key that was taken over or fenced off, even with a saved 4xx, and lets a person override", () => {
    const saved4xx = key({ state: "done", saved: { status: 402, headers: [], bodyBytes: 10 } });
    for (const kind of ["takeover", "fencing-refused"] as const) {
      const v = forgetVerdict(facts({ key: saved4xx, history: events(["claimed"], [kind]) }));
      expect(v).toMatchObject({ allowed: false, overridable: true });
      expect(v.why).toMatch(/taken over/);
    }
  });

  it("refuses a key whose provider was asked whether its call took effect", () => {
    const looked = forgetVerdict(facts({ history: events(["claimed"], ["lookup", { found: "unknown" }]) }));
    expect(looked).toMatchObject({ allowed: false, overridable: true });
    const failed = forgetVerdict(facts({ history: events(["claimed"]), lookupFailures: 1 }));
    expect(failed).toMatchObject({ allowed: false, overridable: true });
    expect(failed.why).toMatch(/provider was asked/);
  });

  it("allows a phases claim whose every lease was freed before a call went out", () => {
    const v = forgetVerdict(
      facts({
        history: events(
          ["claimed"],
          ["lease-released", { called: false }],
          ["lease-taken"],
          ["lease-released"],
        ),
      }),
    );
    expect(v).toEqual({ allowed: true, why: "its claim never started its work", overridable: false });
  });

  it("refuses a claim whose call went out, or whose last lease ran out unreleased", () => {
    const called = forgetVerdict(
      facts({ history: events(["claimed"], ["lease-released", { called: true }]) }),
    );
    expect(called).toMatchObject({ allowed: false, overridable: true });
    const lapsed = forgetVerdict(
      facts({ history: events(["claimed"], ["lease-released"], ["lease-taken"]) }),
    );
    expect(lapsed).toMatchObject({ allowed: false, overridable: true });
    expect(lapsed.why).toMatch(/lease ran out/);
    const attempted = forgetVerdict(facts({ history: events(["claimed"]), attempted: true }));
    expect(attempted).toMatchObject({ allowed: false, overridable: true });
  });

  it("refuses a key whose records cannot tell, and never one a worker holds or a person must settle", () => {
    expect(forgetVerdict(facts({ history: [] }))).toMatchObject({ allowed: false, overridable: true });
    expect(forgetVerdict(facts({ leaseLive: true, history: events(["claimed"]) }))).toMatchObject({
      allowed: false,
      overridable: false,
    });
    expect(forgetVerdict(facts({ key: key({ state: "needs_review" }) }))).toMatchObject({
      allowed: false,
      overridable: false,
    });
  });
});
