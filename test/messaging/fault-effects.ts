/**
 * The effect the Kafka and SQS fault tests apply, and what they check: every event applied exactly once,
 * in order per aggregate, none lost; which member applied what, from which partition or group, when.
 */
import { spawn } from "node:child_process";
import type { Db, Tx } from "../../src/postgres/db.ts";

export async function prepareFaultEffects(db: Db): Promise<void> {
  await db.exec(`CREATE TABLE IF NOT EXISTS fault_effects (
    n bigserial PRIMARY KEY, member text NOT NULL, part text, message_id text NOT NULL,
    agg text NOT NULL, seq int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`);
}

/** A batch effect: one row per message, with the member, and the Kafka partition or SQS group. */
export function faultEffect(member: string) {
  return async (
    tx: Tx,
    messages: { id: string; body: string; partition?: number; groupId?: string | null }[],
  ): Promise<void> => {
    await tx.query(
      `INSERT INTO fault_effects (member, part, message_id, agg, seq)
       SELECT $1::text, e->>'part', e->>'id', e->>'agg', (e->>'seq')::int
       FROM jsonb_array_elements($2::text::jsonb) WITH ORDINALITY AS t(e, i) ORDER BY i`,
      [
        member,
        JSON.stringify(
          messages.map((m) => {
            const b = JSON.parse(m.body) as { agg: string; seq: number };
            const part = m.partition !== undefined ? String(m.partition) : (m.groupId ?? null);
            return { id: m.id, agg: b.agg, seq: b.seq, part };
          }),
        ),
      ],
    );
  };
}

/** Effects in all, distinct messages, and effects applied before an earlier event of their aggregate. */
export async function faultResult(
  db: Db,
): Promise<{ total: number; distinct: number; outOfOrder: number; members: number }> {
  const { rows } = await db.query<{ total: string; distinct: string; ooo: string; members: string }>(
    `SELECT count(*) AS total, count(DISTINCT message_id) AS distinct,
            count(*) FILTER (WHERE seq <= prev) AS ooo, count(DISTINCT member) AS members
     FROM (SELECT message_id, member, seq, lag(seq) OVER (PARTITION BY agg ORDER BY n) AS prev
           FROM fault_effects) t`,
  );
  const r = rows[0]!;
  return {
    total: Number(r.total),
    distinct: Number(r.distinct),
    outOfOrder: Number(r.ooo),
    members: Number(r.members),
  };
}

export async function appliedCount(db: Db): Promise<number> {
  const { rows } = await db.query<{ n: string }>("SELECT count(*) AS n FROM fault_effects");
  return Number(rows[0]!.n);
}

/** A fault-worker.ts process; resolves once it prints "ready". */
export async function startWorker(
  kind: "kafka" | "sqs",
  url: string,
  name: string,
  member: string,
  env: Record<string, string> = {},
): Promise<{ kill(): void; stop(): Promise<void>; exited: Promise<number | null> }> {
  const child = spawn(
    process.execPath,
    ["--conditions=source", "--import", "tsx", "test/messaging/fault-worker.ts", kind, url, name, member],
    { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "inherit"] },
  );
  const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (b: Buffer) => {
      if (b.toString().includes("ready")) resolve();
    });
    child.once("exit", (code) =>
      reject(new Error(`worker ${member} exited with ${code} before it was ready`)),
    );
  });
  return {
    kill: () => child.kill("SIGKILL"),
    async stop() {
      child.kill("SIGTERM");
      await exited;
    },
    exited,
  };
}
