/** Full-state events applied by version: old and repeated events change nothing. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { versionedUpsert } from "../../src/messaging/versioned-upsert.ts";
import type { Db } from "../../src/postgres/db.ts";
import { backends, type OpenDb } from "../helpers/db.ts";

describe.each(backends)("versioned upsert on $name", (backend) => {
  let open: OpenDb;
  let db: Db;
  beforeAll(async () => {
    open = await backend.open();
    db = open.db;
  });
  afterAll(() => open?.close());

  it("keeps the newest state when events arrive out of order and repeated (v6, v5, v6)", async () => {
    {
      await db.exec(`CREATE TABLE products (id int PRIMARY KEY, price_cents int NOT NULL, version int NOT NULL);
                     INSERT INTO products VALUES (1, 1000, 4)`);
      const apply = (version: number, price: number) =>
        versionedUpsert(db, { table: "products", key: { id: 1 }, version, values: { price_cents: price } });
      expect(await apply(6, 1500)).toBe(true);
      expect(await apply(5, 1200)).toBe(false); // late
      expect(await apply(6, 1500)).toBe(false); // duplicate
      const { rows } = await db.query<{ price_cents: number; version: number }>(
        "SELECT price_cents, version FROM products WHERE id = 1",
      );
      expect(rows[0]).toEqual({ price_cents: 1500, version: 6 });
    }
  });

  it("ends in the same state for every delivery order of versions 1..6, each delivered twice", async () => {
    {
      await db.exec("CREATE TABLE docs (id text PRIMARY KEY, title text NOT NULL, version bigint NOT NULL)");
      const events = [1, 2, 3, 4, 5, 6].flatMap((v) => [v, v]);
      for (let round = 0; round < 5; round++) {
        await db.exec("TRUNCATE docs");
        const order = [...events].sort(() => Math.random() - 0.5);
        for (const v of order) {
          await versionedUpsert(db, {
            table: "docs",
            key: { id: "d" },
            version: v,
            values: { title: `v${v}` },
          });
        }
        const { rows } = await db.query("SELECT title, version::int AS version FROM docs");
        expect(rows).toEqual([{ title: "v6", version: 6 }]);
      }
    }
  });

  it("refuses identifiers that are not plain names", async () => {
    await expect(
      versionedUpsert(
        { query: async () => ({ rows: [], rowCount: 0 }) },
        {
          table: "x; DROP TABLE y",
          key: { id: 1 },
          version: 1,
          values: {},
        },
      ),
    ).rejects.toThrow(/identifier/);
  });
});
