// What the integration examples do once their route is up: the same keyed payment twice, under a key
// made for this run (the second replays), then check that exactly one payment was added. A failed check
// exits 1, so a script or a test sees it.
import { randomUUID } from "node:crypto";
import type { Server } from "node:http";
import type { Db } from "idem/postgres";

export async function tryTwice(url: string, countPayments: () => Promise<number>): Promise<void> {
  const key = `order-${randomUUID()}`;
  const before = await countPayments();
  const send = () =>
    fetch(url, {
      method: "POST",
      headers: { "x-account": "acct_1", "idempotency-key": key, "content-type": "application/json" },
      body: JSON.stringify({ amount_cents: 5000 }),
    });
  const replies: string[] = [];
  for (const attempt of [1, 2]) {
    const r = await send();
    const replayed = r.headers.get("idempotent-replayed") ?? "false";
    const text = await r.text();
    replies.push(`${r.status} replayed=${replayed} ${text}`);
    console.log(`attempt ${attempt}: ${r.status} replayed=${replayed} ${text}`);
  }
  const added = (await countPayments()) - before;
  console.log(`payments added: ${added}`);
  const [first, second] = replies.map((r) => r.replace(/ replayed=\w+/, ""));
  if (added !== 1 || first !== second || !replies[0]?.startsWith("201 replayed=false")) {
    console.error("check failed: expected one payment, and the retry's reply the same as the first");
    process.exitCode = 1;
  }
}

/** The database the examples write to (a table `payments`): DATABASE_URL, which they need. */
function databaseUrl(): string {
  const url = process.env.DATABASE_URL;
  if (!url) {
    console.error(
      "set DATABASE_URL to a PostgreSQL database this example may write to (it creates idem's schema " +
        "and a table payments), e.g. DATABASE_URL=postgres://postgres@127.0.0.1:5432/idem_example",
    );
    process.exit(2);
  }
  return url;
}
export const DATABASE_URL = databaseUrl();

export const PAYMENTS_TABLE =
  "CREATE TABLE IF NOT EXISTS payments (id serial PRIMARY KEY, account text NOT NULL, amount_cents int NOT NULL)";

/** The body the examples take, checked: `{ amount_cents }`, a whole number above 0; else undefined. */
export function paymentOf(value: unknown): { amount_cents: number } | undefined {
  if (typeof value !== "object" || value === null || !("amount_cents" in value)) return undefined;
  const { amount_cents } = value;
  return typeof amount_cents === "number" && Number.isInteger(amount_cents) && amount_cents > 0
    ? { amount_cents }
    : undefined;
}

/** Serve on a free loopback port, send the keyed payment to `path` twice, then close the server and `db`. */
export function serveAndTryTwice(server: Server, path: string, db: Db): void {
  server.listen(0, "127.0.0.1", async () => {
    const address = server.address();
    const port = typeof address === "object" && address ? address.port : 0;
    await tryTwice(`http://127.0.0.1:${port}${path}`, async () => {
      const { rows } = await db.query<{ n: number }>("SELECT count(*)::int AS n FROM payments");
      return rows[0]?.n ?? 0;
    });
    server.close();
    await db.close();
  });
}
