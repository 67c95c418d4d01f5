/**
 * Instances whose clocks disagree: three service processes on one database, one on time, one 2 h
 * ahead and one 2 h behind (Debian's `faketime`, a preloaded library that moves every clock the process
 * reads). The store compares times with the database's clock only, so a live lease held by any of
 * them is live for all of them: the same key sent to another instance while the first one is charging
 * is answered 409 in flight, never taken over, and each key charges once. In both provider modes: a
 * provider that dedups by key, and one that charges every request (lookup mode), where a takeover of a
 * live lease would be a second charge.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Provider, startProvider } from "../../src/testing/provider.ts";
import { DATABASE_URL, freshDatabase } from "../helpers/db.ts";
import { listeningUrl, pay } from "./service.ts";

const hasFaketime = (() => {
  try {
    execFileSync("faketime", ["-f", "+0", "true"]);
    return true;
  } catch {
    return false;
  }
})();

if (process.env.CI && DATABASE_URL && !hasFaketime) {
  throw new Error("CI: the clock-skew test needs faketime (apt-get install faketime)");
}

const SKEWS = { "on time": "+0", "2 h ahead": "+2h", "2 h behind": "-2h" } as const;
type Instance = keyof typeof SKEWS;

interface Running {
  url: string;
  child: ChildProcess;
}

function startInstance(skew: string, env: NodeJS.ProcessEnv): Promise<Running> {
  // A process group of its own: faketime runs the service as its child and does not pass signals on,
  // so stopping faketime alone would leave the service running (`stop` signals the group).
  const child = spawn(
    "faketime",
    ["-f", skew, process.execPath, "--conditions=source", "--import", "tsx", "app/main.ts"],
    {
      env: { ...process.env, ...env, PORT: "0", LOG_LEVEL: "warn" },
      stdio: ["ignore", "pipe", "pipe"],
      detached: true,
    },
  );
  return listeningUrl(child, 60_000).then((url) => ({ url, child }));
}

/** Signal faketime and the service it runs (their process group); false once the group is gone. */
function signalGroup(child: ChildProcess, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-child.pid!, signal);
    return true;
  } catch {
    return false;
  }
}

/** Stop an instance: SIGTERM to its group, SIGKILL after 5 s; resolves once every process of it exited. */
async function stop(child: ChildProcess): Promise<void> {
  signalGroup(child, "SIGTERM");
  for (let waited = 0; waited < 10_000 && signalGroup(child, 0); waited += 50) {
    if (waited === 5_000) signalGroup(child, "SIGKILL");
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe.runIf(DATABASE_URL && hasFaketime).each([
  { mode: "a provider that dedups by key", idempotency: true },
  { mode: "a provider without idempotency (lookup mode)", idempotency: false },
])("three instances 2 h apart, $mode", ({ idempotency }) => {
  let fresh: Awaited<ReturnType<typeof freshDatabase>>;
  let provider: Provider;
  const instances = new Map<Instance, Running>();

  beforeAll(async () => {
    fresh = await freshDatabase();
    // Every charge takes 2.5 s: long enough for a duplicate to arrive while the lease is held.
    provider = await startProvider({ latencyMs: 2_500, idempotency });
    const env = {
      DATABASE_URL: fresh.url,
      IDEM_DEMO: "1",
      IDEM_PAYMENTS_MODE: "phases",
      PROVIDER_URL: provider.url,
      PROVIDER_IDEMPOTENCY: String(idempotency),
    };
    const started = await Promise.all(
      Object.entries(SKEWS).map(async ([name, skew]) => [name, await startInstance(skew, env)] as const),
    );
    for (const [name, r] of started) instances.set(name as Instance, r);
  }, 120_000);
  afterAll(async () => {
    await Promise.all([...instances.values()].map((r) => stop(r.child)));
    await provider?.close();
    await fresh?.drop();
  });

  it("the instances' clocks really are 2 h apart", async () => {
    const at = async (name: Instance) =>
      new Date((await fetch(`${instances.get(name)!.url}/health`)).headers.get("date")!).getTime();
    const onTime = await at("on time");
    expect((await at("2 h ahead")) - onTime).toBeGreaterThan(7_000_000);
    expect(onTime - (await at("2 h behind"))).toBeGreaterThan(7_000_000);
  });

  const pairs: Array<[Instance, Instance]> = [];
  for (const a of Object.keys(SKEWS) as Instance[])
    for (const b of Object.keys(SKEWS) as Instance[]) if (a !== b) pairs.push([a, b]);

  it.each(pairs)("a live lease held by the one %s is not taken over by the one %s", async (holder, other) => {
    const key = randomUUID();
    const before = provider.charges().filter((c) => c.status === "succeeded").length;
    const first = pay(instances.get(holder)!.url, { key });
    await new Promise((r) => setTimeout(r, 800)); // the holder is in its provider call
    const dup = await pay(instances.get(other)!.url, { key });
    expect(dup.status).toBe(409);
    expect(dup.headers.get("idempotency-operation-state")).toBe("in_progress");
    const done = await first;
    expect(done.status).toBe(201);
    const body = await done.text();
    const replay = await pay(instances.get(other)!.url, { key });
    expect(replay.status).toBe(201);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(await replay.text()).toBe(body);
    expect(provider.charges().filter((c) => c.status === "succeeded").length).toBe(before + 1);
  });

  it("twenty duplicates of one key spread over the three instances: one charge, one payment", async () => {
    const key = randomUUID();
    const before = provider.charges().filter((c) => c.status === "succeeded").length;
    const urls = [...instances.values()].map((r) => r.url);
    const replies = await Promise.all(Array.from({ length: 20 }, (_, i) => pay(urls[i % 3]!, { key })));
    for (const r of replies) expect([201, 409]).toContain(r.status);
    let last = replies.find((r) => r.status === 201);
    for (let i = 0; !last && i < 40; i++) {
      await new Promise((r) => setTimeout(r, 250));
      const again = await pay(urls[i % 3]!, { key });
      if (again.status === 201) last = again;
    }
    expect(last?.status).toBe(201);
    expect(provider.charges().filter((c) => c.status === "succeeded").length).toBe(before + 1);
  });
});
