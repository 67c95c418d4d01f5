/**
 * What the code blocks of README.md and docs/*.md take as given: the names a block uses without defining
 * them, because the page around it has them (your database, your app, your client). scripts/doc-blocks.mjs
 * type-checks every block with these declarations in scope, so a block's calls into idem are checked
 * against these types. A name used by a block and missing here is an error: define it in the block,
 * or add it here with its type and a line saying what it stands for.
 */
import type { RequestListener } from "node:http";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import type { Handler, Hono, MiddlewareHandler } from "hono";
import type { IdemClient } from "idem/client";
import type { Inbox, InboxHandler } from "idem/messaging";
import type { Db, PhaseContext, PhaseStep, PhasesRunner, PostgresStore, Tx } from "idem/postgres";

type Payment = { amount_cents: number; currency: string };
/** What the docs' authentication and validation middlewares set on a Hono context. */
type Authenticated = { Variables: { accountId: string } };
type Validated = { Variables: { payment: Payment } };

declare global {
  /** Your database, through one of idem's drivers (`fromPg`, `fromPostgresJs`, `fromPglite`, ...). */
  const db: Db;
  /** Two databases, for a sharded store. */
  const db1: Db;
  const db2: Db;
  /** A transaction of `db` (inside `db.transaction(async (tx) => ...)` or a keyed handler). */
  const tx: Tx;
  /** `await PostgresStore.open(db)`. */
  const store: PostgresStore;
  /**
   * Your Hono app, its authentication, its validation, and your handler: a keyed route's on the HTTP
   * pages, an inbox's (the message's effect, in the inbox's transaction) on the messaging page.
   */
  const app: Hono;
  const auth: MiddlewareHandler<Authenticated>;
  const validate: MiddlewareHandler<Validated>;
  const handler: Handler & InboxHandler;
  /** An inbox: `new Inbox(db, { consumer })` (docs/messaging.md). */
  const inbox: Inbox;
  /** An MCP client's transport, and the tool call an agent's model asked for (docs/mcp.md). */
  function transport(): Transport;
  const toolUse: { id: string; input: Record<string, unknown> };
  /** An MCP server's URL, and an idempotency key (docs/mcp.md). */
  const serverUrl: string;
  const key: string;
  /** Bun's server (the docs' Bun example; Deno's is alike). */
  const Bun: { serve(options: { fetch(request: Request): Response | Promise<Response> }): unknown };
  /** A provider's charges report as CSV text, the reconciliation's settings, its window and API key (docs/reconcile.md). */
  const csvText: string;
  const config: { report: string; records: string };
  const from: Date;
  const to: Date;
  const apiKey: string;
  /** A node:http request listener (an Express app, or idem/node's `idempotency(...)`). */
  const listener: RequestListener;
  /** `createClient({ baseUrl, ... })` from idem/client. */
  const client: IdemClient;
  /** Your order, its id, and a request body. */
  const order: { id: string };
  const orderId: string;
  const body: Payment;
  /** The payment provider's base URL (the simulator's, in the docs), and a payment's amount. */
  const providerUrl: string;
  const amount: number;
  const currency: string;
  /** Your own helpers: a token, metrics, a ticketing system, what the page shows the user. */
  function getToken(): Promise<string>;
  const metrics: { histogram(name: string, value: number, tags?: Record<string, unknown>): void };
  const tickets: { open(text: string): Promise<void> };
  function showBusy(waitMs: number | undefined): void;
  function showRetryLater(status?: number): void;
  function toPayment(row: unknown): unknown;
  /** A phases runner: `definePhases({ store, name: "payments", phases })` (docs/phases.md). */
  const payments: PhasesRunner<Payment>;
  /** A phase's call to another system, and a phase's local transaction (docs/phases.md). */
  function chargeCard(
    ctx: PhaseContext<Payment, Record<string, unknown>>,
  ): Promise<PhaseStep<Record<string, unknown>> | undefined>;
  function recordPayment(
    ctx: PhaseContext<Payment, Record<string, unknown>>,
    tx: Tx,
  ): Promise<PhaseStep<Record<string, unknown>> | undefined>;
  /** Where an account lives: its home region, its shard. */
  const directory: { homeOf(account: string): "eu" | "us" | undefined; shardOf(scope: string): string };
  /** Who is calling (the scope of the keyed routes), and whether a saved answer may still be shown to them. */
  function accountOf(request: Request): string | undefined;
  function stillAllowed(request: Request): Promise<boolean>;
}
