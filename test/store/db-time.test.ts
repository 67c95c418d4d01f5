/**
 * `DbTime.covers` says with instants what the bucket numbers say (db-time.ts): checked in the database
 * at the edges, where the start of `lo` and the end of `hi` are one microsecond away.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DbTime } from "../../src/postgres/keys/db-time.ts";
import { backends, type OpenDb } from "../helpers/db.ts";

const HOUR = 3_600_000;
const DAY = 24 * HOUR;

/** The statement's now as a fixed instant (epoch ms and extra microseconds), for both forms alike. */
function at(sql: string, ms: number, us: number): string {
  const iso = new Date(ms).toISOString().replace("Z", `${String(us).padStart(3, "0")}Z`);
  return sql.replaceAll("now()", `'${iso}'::timestamptz`);
}

describe.each(backends)("DbTime.covers on $name", (backend) => {
  let open: OpenDb;
  beforeAll(async () => {
    open = await backend.open();
  });
  afterAll(async () => {
    await open?.close();
  });

  it.each([
    ["daily partitions, a day kept", DAY, DAY],
    ["hourly partitions, 90 minutes kept", HOUR, 90 * 60_000],
    ["1.5 s partitions (tests), 4 s kept", 1_500, 4_000],
    ["weekly partitions, 30 days kept", 7 * DAY, 30 * DAY],
  ])("agrees with the bucket numbers at every edge: %s", async (_name, width, retention) => {
    const t = new DbTime(0, width, retention);
    const nowMs = Math.floor(Date.now() / width) * width + 0.37 * width;
    const { lo, hi } = t.rangeAround(nowMs);
    const byNumber = `(${t.oldestBucket} >= ${lo} AND ${t.newestBucket} <= ${hi})`;
    // Instants of now where `oldest` meets the start of `lo`, and where the lookup's newest instant
    // (now + 10 minutes) meets the start of `hi + 1`: on the edge, and a microsecond either side.
    const edges = [lo * width + retention, (hi + 1) * width - 600_000, nowMs];
    const checks: string[] = [];
    for (const edge of edges) {
      for (const [ms, us] of [
        [edge - 1, 999],
        [edge, 0],
        [edge, 1],
      ] as const) {
        const cover = at(t.covers({ lo, hi }), ms, us);
        checks.push(
          `SELECT ${cover} AS instants, ${at(byNumber, ms, us)} AS numbers, ${ms} AS ms, ${us} AS us`,
        );
      }
    }
    const { rows } = await open.db.query<{ instants: boolean; numbers: boolean; ms: string; us: number }>(
      checks.join(" UNION ALL "),
    );
    expect(rows).toHaveLength(9);
    for (const row of rows) expect({ ...row, instants: row.numbers }).toEqual(row);
    // Both answers occur: the edges are where it changes.
    expect(new Set(rows.map((r) => r.numbers))).toEqual(new Set([true, false]));
  });
});
