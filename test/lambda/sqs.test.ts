/**
 * SQS batches on Lambda (`sqsBatch`): each record applied once through the inbox, `batchItemFailures`
 * for those that must come back, FIFO groups stopped at their first failure, and the faults of an
 * at-least-once queue: a crash mid-batch, one record delivered to two invocations at once, a record
 * whose work outlives the visibility timeout, a function that times out inside a record.
 */
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import type { SQSEvent, SQSRecord } from "aws-lambda";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sqsBatch } from "../../src/lambda/index.ts";
import type { Db, Tx } from "../../src/postgres/db.ts";
import { backends, type OpenDb, serverBackends } from "../helpers/db.ts";
import { effectCounts, prepare } from "../messaging/helpers.ts";
import { lambdaContext } from "./gateway.ts";
import { again, sqsRecord } from "./sqs-events.ts";

/** The effect: one row per application; a body `{ fail: true }` throws after writing it. */
async function apply(tx: Tx, record: SQSRecord): Promise<void> {
  await tx.query("INSERT INTO effects (message_id) VALUES ($1)", [record.messageId]);
  const body = JSON.parse(record.body) as { fail?: boolean; sleepMs?: number };
  if (body.sleepMs) await new Promise((r) => setTimeout(r, body.sleepMs));
  if (body.fail) throw new Error("the order cannot be applied yet");
}

async function appliedCounts(db: Db, ids: string[]): Promise<number[]> {
  const { rows } = await db.query<{ id: string; n: number }>(
    "SELECT message_id AS id, count(*)::int AS n FROM effects WHERE message_id = ANY($1::text[]) GROUP BY 1",
    [ids],
  );
  const by = new Map(rows.map((r) => [r.id, r.n]));
  return ids.map((id) => by.get(id) ?? 0);
}

function useDb(backend: (typeof backends)[number]): { readonly db: Db; readonly url: string | undefined } {
  let open: OpenDb;
  beforeAll(async () => {
    open = await backend.open();
    await prepare(open.db);
  }, 60_000);
  afterAll(() => open?.close());
  return {
    get db() {
      return open.db;
    },
    get url() {
      return open.url;
    },
  };
}

describe.each(backends)("SQS batches on Lambda on $name", (backend) => {
  const t = useDb(backend);

  it("applies each record once and answers batchItemFailures with only the failed one", async () => {
    const consumer = `c_${randomUUID()}`;
    let failing = true;
    const handler = sqsBatch(
      async (tx, record: SQSRecord) => {
        const body = JSON.parse(record.body) as { n: number };
        if (body.n === 3 && failing) throw new Error("not yet");
        await apply(tx, record);
      },
      { db: t.db, consumer },
    );
    const event: SQSEvent = { Records: [1, 2, 3, 4, 5].map((n) => sqsRecord({ n })) };
    const ids = event.Records.map((r) => r.messageId);
    const first = await handler(event, lambdaContext());
    expect(first.batchItemFailures).toEqual([{ itemIdentifier: ids[2] }]);
    expect(await appliedCounts(t.db, ids)).toEqual([1, 1, 0, 1, 1]);
    // Lambda redelivers the batch's failed record (here: the whole batch again, as after a crash).
    failing = false;
    const second = await handler(again(event), lambdaContext());
    expect(second.batchItemFailures).toEqual([]);
    expect(await appliedCounts(t.db, ids)).toEqual([1, 1, 1, 1, 1]);
  });

  it("stops a FIFO message group at its first failure and goes on with the other groups", async () => {
    const consumer = `c_${randomUUID()}`;
    const ran: number[] = [];
    const handler = sqsBatch(
      async (tx, record: SQSRecord) => {
        ran.push((JSON.parse(record.body) as { n: number }).n);
        await apply(tx, record);
      },
      { db: t.db, consumer },
    );
    const event: SQSEvent = {
      Records: [
        sqsRecord({ n: 1 }, { group: "a" }),
        sqsRecord({ n: 2 }, { group: "b" }),
        sqsRecord({ n: 3, fail: true }, { group: "a" }),
        sqsRecord({ n: 4 }, { group: "a" }),
        sqsRecord({ n: 5 }, { group: "b" }),
      ],
    };
    const ids = event.Records.map((r) => r.messageId);
    const result = await handler(event, lambdaContext());
    expect(result.batchItemFailures).toEqual([{ itemIdentifier: ids[2] }, { itemIdentifier: ids[3] }]);
    expect(ran).toEqual([1, 2, 3, 5]); // 4 waits behind 3, in order
    expect(await appliedCounts(t.db, ids)).toEqual([1, 1, 0, 0, 1]);
  });

  it("leaves the records it has no time left for to come back, unstarted", async () => {
    const consumer = `c_${randomUUID()}`;
    const handler = sqsBatch(apply, { db: t.db, consumer, reserveMs: 500 });
    const event: SQSEvent = { Records: [sqsRecord({ n: 1 }), sqsRecord({ n: 2 })] };
    const ids = event.Records.map((r) => r.messageId);
    const result = await handler(event, lambdaContext(400)); // already inside the time kept back
    expect(result.batchItemFailures).toEqual(ids.map((itemIdentifier) => ({ itemIdentifier })));
    expect(await appliedCounts(t.db, ids)).toEqual([0, 0]);
  });

  it("parks a record that keeps failing, and answers it done so that it stops coming back", async () => {
    const consumer = `c_${randomUUID()}`;
    const handler = sqsBatch(apply, { db: t.db, consumer, maxAttempts: 2 });
    const event: SQSEvent = { Records: [sqsRecord({ fail: true })] };
    expect((await handler(event, lambdaContext())).batchItemFailures).toHaveLength(1);
    expect((await handler(again(event), lambdaContext())).batchItemFailures).toEqual([]);
    expect((await handler(again(again(event)), lambdaContext())).batchItemFailures).toEqual([]);
    expect(await appliedCounts(t.db, [event.Records[0]!.messageId])).toEqual([0]);
  });

  it("deduplicates on the producer's idem-message-id attribute when there is one", async () => {
    const consumer = `c_${randomUUID()}`;
    const handler = sqsBatch(apply, { db: t.db, consumer });
    const eventId = randomUUID();
    const copy = () => {
      const r = sqsRecord({ n: 1 });
      r.messageAttributes["idem-message-id"] = { stringValue: eventId, dataType: "String" };
      return r;
    };
    const [a, b] = [copy(), copy()]; // one outbox event published twice: two SQS message ids
    await handler({ Records: [a] }, lambdaContext());
    await handler({ Records: [b] }, lambdaContext());
    expect(await appliedCounts(t.db, [a.messageId, b.messageId])).toEqual([1, 0]);
  });
});

describe.each(serverBackends)("SQS batch faults on $name", (backend) => {
  const t = useDb(backend);

  it("applies every record once after a container is killed mid-batch", async () => {
    const event: SQSEvent = {
      Records: [sqsRecord({}), sqsRecord({}), sqsRecord({ crash: true }), sqsRecord({})],
    };
    const ids = event.Records.map((r) => r.messageId);
    const fixture = fileURLToPath(new URL("./fixtures/sqs-crash.ts", import.meta.url));
    const exit = await new Promise<NodeJS.Signals | null>((resolve) => {
      execFile(
        process.execPath,
        ["--conditions=source", "--import", "tsx", fixture, t.url!, JSON.stringify(event)],
        (_err, _out, _stderr) => resolve(null),
      ).on("exit", (_code, signal) => resolve(signal));
    });
    expect(exit).toBe("SIGKILL");
    expect(await appliedCounts(t.db, ids)).toEqual([1, 1, 0, 0]);
    // Lambda got no answer: the whole batch comes back, to a new container.
    const handler = sqsBatch(async (tx, r: SQSRecord) => apply(tx, r), { db: t.db, consumer: "orders" });
    expect((await handler(again(event), lambdaContext())).batchItemFailures).toEqual([]);
    expect(await appliedCounts(t.db, ids)).toEqual([1, 1, 1, 1]);
  }, 30_000);

  it("applies a record delivered to two invocations at once once", async () => {
    const consumer = `c_${randomUUID()}`;
    const [one, two] = [0, 1].map(() => sqsBatch(apply, { db: t.db, consumer })); // two containers
    const event: SQSEvent = { Records: [sqsRecord({ sleepMs: 300 }), sqsRecord({})] };
    const results = await Promise.all([one!(event, lambdaContext()), two!(event, lambdaContext())]);
    expect(results.map((r) => r.batchItemFailures)).toEqual([[], []]);
    expect(
      await appliedCounts(
        t.db,
        event.Records.map((r) => r.messageId),
      ),
    ).toEqual([1, 1]);
  });

  it("applies a record whose work outlives the visibility timeout once", async () => {
    const consumer = `c_${randomUUID()}`;
    const [slow, other] = [0, 1].map(() => sqsBatch(apply, { db: t.db, consumer }));
    const record = sqsRecord({ sleepMs: 2_500 });
    const first = slow!({ Records: [record] }, lambdaContext(30_000));
    await new Promise((r) => setTimeout(r, 300));
    // The visibility timeout passed: SQS hands the record to another invocation, with 1.5 s to live.
    const copy = await other!(again({ Records: [record] }), lambdaContext(1_500));
    expect(copy.batchItemFailures).toEqual([{ itemIdentifier: record.messageId }]);
    expect((await first).batchItemFailures).toEqual([]);
    // Its next delivery finds it applied.
    const later = await other!(again(again({ Records: [record] })), lambdaContext(30_000));
    expect(later.batchItemFailures).toEqual([]);
    expect(await appliedCounts(t.db, [record.messageId])).toEqual([1]);
  }, 30_000);

  it("runs a record once after the function timed out inside it (the database ends its transaction)", async () => {
    const consumer = `c_${randomUUID()}`;
    let thaw: () => void = () => {};
    const frozen = new Promise<void>((r) => {
      thaw = r;
    });
    let calls = 0;
    const handler = (name: string) =>
      sqsBatch(
        async (tx, record: SQSRecord) => {
          calls++;
          await apply(tx, record);
          if (name === "frozen") await frozen; // Lambda froze the function here, at its timeout
        },
        { db: t.db, consumer },
      );
    const record = sqsRecord({});
    const stuck = handler("frozen")({ Records: [record] }, lambdaContext(1_000));
    try {
      await new Promise((r) => setTimeout(r, 1_500)); // past its timeout: the database ended the transaction
      const redelivered = await handler("next")(again({ Records: [record] }), lambdaContext(30_000));
      expect(redelivered.batchItemFailures).toEqual([]);
      expect(await appliedCounts(t.db, [record.messageId])).toEqual([1]);
    } finally {
      thaw();
    }
    await stuck; // it resumes: its transaction is gone, nothing of it commits
    expect(calls).toBe(2);
    expect(await appliedCounts(t.db, [record.messageId])).toEqual([1]);
    expect((await effectCounts(t.db)).repeated).toBe(0);
  }, 30_000);
});
