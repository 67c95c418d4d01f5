/** The NOTIFYs idem's drivers send after commits: the first at once, the rest shared, none lost. */
import { describe, expect, it } from "vitest";
import { AfterCommitNotifier } from "../../src/postgres/drivers/after-commit-notify.ts";

describe("AfterCommitNotifier", () => {
  it("announces the first commit at once and shares one NOTIFY among the commits that come meanwhile", async () => {
    const sent: string[] = [];
    const waiting: (() => void)[] = [];
    const answer = () => {
      for (const resolve of waiting.splice(0)) resolve();
    };
    const notifier = new AfterCommitNotifier(
      (channel) =>
        new Promise<void>((resolve) => {
          sent.push(channel);
          waiting.push(resolve);
        }),
      5,
    );
    notifier.notify(["idem_outbox"]);
    expect(sent).toEqual(["idem_outbox"]); // at once, not after a timer
    for (let i = 0; i < 100; i++) notifier.notify(["idem_outbox"]); // while it is under way
    notifier.notify(["other_outbox"]);
    expect(sent).toHaveLength(1);
    answer();
    await new Promise((r) => setTimeout(r, 30));
    expect(sent).toEqual(["idem_outbox", "idem_outbox", "other_outbox"]); // one more per channel
    answer();
    await new Promise((r) => setTimeout(r, 30));
    expect(sent).toHaveLength(3); // nothing left to announce
    notifier.notify(["idem_outbox"]);
    expect(sent).toHaveLength(4); // quiet again: at once
    answer();
  });

  it("goes on after a NOTIFY that failed", async () => {
    let calls = 0;
    const notifier = new AfterCommitNotifier(async () => {
      calls++;
      if (calls === 1) throw new Error("connection lost");
    }, 1);
    notifier.notify(["idem_outbox"]);
    notifier.notify(["idem_outbox"]);
    await new Promise((r) => setTimeout(r, 30));
    expect(calls).toBe(2);
  });
});
