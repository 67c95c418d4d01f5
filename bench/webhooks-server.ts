/**
 * The servers of bench/webhooks.ts, in a process of their own so that their CPU per delivery is read
 * apart from the load's: three node:http servers on one database, all checking Stripe's signature
 * with the same code (`stripeScheme`), so that they differ only in what follows the check:
 *
 *   verify   the bare handler: check the signature, answer 200
 *   effect   check, then INSERT the effect (a named prepared statement on a pg pool), answer 200: what
 *            a hand-written receiver without deduplication does
 *   idem     `webhookReceiver(...).node`: check, then the inbox's mark and the same INSERT in one
 *            transaction, answer 200 (a redelivery: no INSERT)
 *
 * Started by bench/webhooks.ts with DATABASE_URL and WEBHOOK_SECRET; prints {"verify":port,...} once up.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import pg from "pg";
import { fromPg } from "../src/postgres/drivers/pg.ts";
import { webhookReceiver } from "../src/webhooks/receiver.ts";
import { stripeScheme } from "../src/webhooks/stripe.ts";

const url = process.env.DATABASE_URL!;
const secret = process.env.WEBHOOK_SECRET!;
const scheme = stripeScheme({ secret });

function body(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

const header = (req: IncomingMessage) => (name: string) => req.headers[name] as string | undefined;
const ok = (res: ServerResponse) => {
  res.writeHead(200, { "content-type": "application/json" });
  res.end('{"received":true}');
};
const refused = (res: ServerResponse) => {
  res.writeHead(401);
  res.end();
};

const pool = new pg.Pool({ connectionString: url, max: 20 });
pool.on("error", () => {});
const db = fromPg(new pg.Pool({ connectionString: url, max: 20, pipeline: true } as pg.PoolConfig));

const handlers: Record<string, (req: IncomingMessage, res: ServerResponse) => Promise<void>> = {
  async verify(req, res) {
    try {
      scheme.verify({ header: header(req), body: await body(req), nowS: Math.floor(Date.now() / 1000) });
    } catch {
      return refused(res);
    }
    ok(res);
  },
  async effect(req, res) {
    let id: string;
    try {
      id = scheme.verify({
        header: header(req),
        body: await body(req),
        nowS: Math.floor(Date.now() / 1000),
      }).id;
    } catch {
      return refused(res);
    }
    await pool.query({
      name: "bench_effect",
      text: "INSERT INTO effects (event_id) VALUES ($1)",
      values: [id],
    });
    ok(res);
  },
  idem: webhookReceiver({
    db,
    scheme,
    consumer: "bench",
    // BENCH_BATCH / BENCH_TX: the receiver's batchSize and concurrency (default: the receiver's own).
    batchSize: process.env.BENCH_BATCH ? Number(process.env.BENCH_BATCH) : undefined,
    concurrency: process.env.BENCH_TX ? Number(process.env.BENCH_TX) : undefined,
    handler: async (event, { tx }) => {
      await tx.query("INSERT INTO effects (event_id) VALUES ($1)", [event.id]);
    },
  }).node,
};

const ports: Record<string, number> = {};
for (const [name, handle] of Object.entries(handlers)) {
  const server = createServer((req, res) => {
    handle(req, res).catch((err) => {
      console.error(err);
      res.destroy();
    });
  });
  server.keepAliveTimeout = 30_000;
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  ports[name] = (server.address() as AddressInfo).port;
}
console.log(JSON.stringify(ports));
