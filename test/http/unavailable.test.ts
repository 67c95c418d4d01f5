/**
 * The one test of "the database is unavailable" (src/core/sqlstate.ts) against the errors real drivers
 * throw: the adapters answer these 503 + Retry-After, anything else stays the application's error.
 */
import { createServer } from "node:net";
import pg from "pg";
import postgres from "postgres";
import { describe, expect, it } from "vitest";
import { isConnectFailure, isDatabaseUnavailable, SqlState, sqlStateOf } from "../../src/core/index.ts";
import { DATABASE_URL, newPglite } from "../helpers/db.ts";

/** A port with nothing listening on it (bound, then closed). */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  await new Promise((r) => server.close(r));
  return port;
}

describe("isDatabaseUnavailable", () => {
  it("recognises a refused connection from pg and postgres.js as a connect failure", async () => {
    const port = await closedPort();
    const client = new pg.Client({ host: "127.0.0.1", port, user: "x", database: "x" });
    const pgErr = await client.connect().catch((e: unknown) => e);
    expect(isDatabaseUnavailable(pgErr)).toBe(true);
    expect(isConnectFailure(pgErr)).toBe(true);
    const sql = postgres({ host: "127.0.0.1", port, user: "x", database: "x", max: 1, connect_timeout: 2 });
    const pjErr = await sql`SELECT 1`.catch((e: unknown) => e);
    await sql.end({ timeout: 0 });
    expect(isDatabaseUnavailable(pjErr)).toBe(true);
    expect(isConnectFailure(pjErr)).toBe(true);
  });

  it("recognises a closed PGlite, and not an ordinary SQL error", async () => {
    const db = await newPglite();
    const dup = await db.query("SELECT 1/0").catch((e: unknown) => e);
    expect(sqlStateOf(dup)).toBe("22012");
    expect(isDatabaseUnavailable(dup)).toBe(false);
    await db.close();
    const closed = await db.query("SELECT 1").catch((e: unknown) => e);
    expect(isDatabaseUnavailable(closed)).toBe(true);
  });

  it.skipIf(!DATABASE_URL)(
    "recognises a session terminated by the server (57P01) on the real server",
    async () => {
      const victim = new pg.Client({ connectionString: DATABASE_URL });
      victim.on("error", () => {});
      await victim.connect();
      const { rows } = await victim.query<{ pid: number }>("SELECT pg_backend_pid() AS pid");
      const admin = new pg.Client({ connectionString: DATABASE_URL });
      await admin.connect();
      await admin.query("SELECT pg_terminate_backend($1)", [rows[0]!.pid]);
      await admin.end();
      const err = await victim.query("SELECT 1").catch((e: unknown) => e);
      await victim.end().catch(() => {});
      expect(isDatabaseUnavailable(err)).toBe(true);
      expect(isConnectFailure(err)).toBe(false); // the session existed: what it sent may have committed
      expect(SqlState.AdminShutdown).toBe("57P01");
    },
  );
});
