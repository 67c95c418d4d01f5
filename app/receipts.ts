/**
 * The receipt-email worker of the reference service: payment -> outbox -> broker -> inbox -> email.
 *
 * The payments route writes a `receipt-email` event into the outbox in the same transaction as the
 * payment. Here a relay publishes those events and a consumer "sends" each receipt (records it in
 * `sent_emails`, standing in for the email provider) through the inbox, so a receipt is recorded once
 * however often its event is delivered.
 *
 * Transport: see app/worker.ts (RabbitMQ, NATS JetStream, or an in-process broker).
 *
 *   const receipts = await startReceipts(db, loadConfig(process.env).receipts);
 *   ...
 *   await receipts.stop(); // before closing the database
 */
import type { Db, Tx } from "idem/postgres";
import { startWorker, type TransportConfig, type Worker } from "./worker.ts";

export const RECEIPT_TOPIC = "receipt-email";
const CONSUMER = "receipt-email-worker";
const NATS_STREAM = "IDEM_RECEIPTS";

/** Where the receipt worker's messages travel (app/worker.ts). */
export type ReceiptsConfig = TransportConfig;

/** The receipt worker at work. */
export type Receipts = Worker;

/** The receipt worker's table (made by app/database.ts's `prepareSchema`, the owner's job). */
export const RECEIPT_TABLES = `
  CREATE TABLE IF NOT EXISTS sent_emails (
    message_id   text PRIMARY KEY,          -- the outbox event id: one email per event
    payment_id   text NOT NULL,
    account_id   text NOT NULL,
    amount_cents bigint NOT NULL,
    sent_at      timestamptz NOT NULL DEFAULT now()
  );
  CREATE INDEX IF NOT EXISTS sent_emails_payment ON sent_emails (payment_id);
`;

interface ReceiptPayload {
  payment: string;
  account: string;
  amount_cents: number;
}

/** "Send" one receipt: in the inbox's transaction, so it is recorded once per event. */
async function sendReceipt(tx: Tx, message: { id: string; body: string }): Promise<void> {
  const p = JSON.parse(message.body) as ReceiptPayload;
  if (!p.payment || !p.account) throw new Error("receipt-email event without payment or account");
  await tx.query(
    "INSERT INTO sent_emails (message_id, payment_id, account_id, amount_cents) VALUES ($1, $2, $3, $4)",
    [message.id, p.payment, p.account, p.amount_cents],
  );
}

/** Start the relay and the consumer. Resolves once both run. */
export function startReceipts(db: Db, config: ReceiptsConfig = {}): Promise<Receipts> {
  return startWorker(
    db,
    { topic: RECEIPT_TOPIC, consumer: CONSUMER, stream: NATS_STREAM, handler: sendReceipt },
    config,
  );
}

/** Receipts recorded for a payment (for the playground and tests). */
export async function receiptsOf(db: Db, paymentId: string): Promise<{ messageId: string; sentAt: Date }[]> {
  const { rows } = await db.query<{ message_id: string; sent_at: Date | string }>(
    "SELECT message_id, sent_at FROM sent_emails WHERE payment_id = $1 ORDER BY sent_at",
    [paymentId],
  );
  return rows.map((r) => ({ messageId: r.message_id, sentAt: new Date(r.sent_at) }));
}
