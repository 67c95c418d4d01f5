// What the integration examples do once their route is up: the same keyed payment twice (the second
// replays), then count the payments. Each example passes its URL and a way to count.
export async function tryTwice(url: string, countPayments: () => Promise<number>): Promise<void> {
  const send = () =>
    fetch(url, {
      method: "POST",
      headers: { "x-account": "acct_1", "idempotency-key": "order-42", "content-type": "application/json" },
      body: JSON.stringify({ amount_cents: 5000 }),
    });
  for (const attempt of [1, 2]) {
    const r = await send();
    const replayed = r.headers.get("idempotent-replayed") ?? "false";
    console.log(`attempt ${attempt}: ${r.status} replayed=${replayed} ${await r.text()}`);
  }
  console.log(`payments in the table: ${await countPayments()}`);
}

/** The database of the examples: DATABASE_URL (the test gives each example a fresh one). */
export const DATABASE_URL = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";

export const PAYMENTS_TABLE =
  "CREATE TABLE IF NOT EXISTS payments (id serial PRIMARY KEY, account text NOT NULL, amount_cents int NOT NULL)";
