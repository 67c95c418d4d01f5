/**
 * The payments API as MCP tools, for AI agents (idem/mcp), served over Streamable HTTP at `/mcp`
 * (app/mcp-route.ts) and over stdio (`npm run payments -- mcp`, app/mcp-stdio.ts):
 *
 *   create_payment  side-effecting: keyed by `_meta.idempotencyKey` (or the `idempotency_key` argument).
 *                   Phases mode: the SAME runner as `POST /v1/payments` (a provider charge, then the
 *                   payment row and its receipt); atomic mode: the payment row in the key's transaction.
 *   list_payments   read-only (`readOnlyHint`): passed through, no key
 *   get_payment     read-only
 *
 * The arguments are checked with the request schema of `POST /v1/payments` (app/schemas.ts, read into
 * zod by `z.fromJSONSchema`): one rule for both doors. A call's scope is the account of its API key.
 */
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { idempotentTools, type ToolExtra } from "idem/mcp";
import type { PhasesRunner, PostgresStore, Tx } from "idem/postgres";
import { z } from "zod";
import type { ApiKeys } from "./accounts.ts";
import { findPayment, insertPayment, listPayments, type PaymentInput } from "./payments.ts";
import {
  type PaymentJob,
  type PaymentPhasesOptions,
  paymentPhasesRunner,
  providerCard,
} from "./payments-phases.ts";
import { PaymentRequest, type PhasesPaymentInput, PhasesPaymentRequest } from "./schemas.ts";

/** The service's store and API keys, and its payment settings as the REST routes take them. */
export interface PaymentsMcpOptions
  extends Partial<Pick<PaymentPhasesOptions, "providerUrl" | "providerIdempotency" | "cardTokenKey">> {
  store: PostgresStore;
  apiKeys: ApiKeys;
  /** `phases` (default): charged at the provider; `atomic`: local rows only. */
  paymentsMode?: "phases" | "atomic";
}

/** Who is calling: the account (the scope of its keys) and the API key it authenticated with. */
export interface McpCaller {
  account: string;
  apiKey: string;
}

const json = (value: unknown) => ({
  content: [{ type: "text" as const, text: JSON.stringify(value) }],
  structuredContent: value as Record<string, unknown>,
});

/**
 * The tools, made once per service: `server(caller?)` builds an `McpServer` with them (one per request
 * over stateless HTTP, one per process over stdio). `caller` is the fixed caller of a stdio server; over
 * HTTP the caller comes with each request (`authInfo`, set by app/mcp-route.ts).
 */
export function paymentsMcp(o: PaymentsMcpOptions): { server(caller?: McpCaller): McpServer } {
  const phases = (o.paymentsMode ?? "phases") === "phases";
  let runner: PhasesRunner<PaymentJob, { chargeId: string }> | undefined;
  if (phases) {
    if (!o.providerUrl) throw new Error("phases mode needs providerUrl (PROVIDER_URL)");
    runner = paymentPhasesRunner({ ...o, providerUrl: o.providerUrl, store: o.store });
  }
  const createSchema = z.fromJSONSchema((phases ? PhasesPaymentRequest : PaymentRequest) as never);
  return {
    server(caller) {
      const who = (extra: ToolExtra): McpCaller | undefined =>
        caller ??
        (extra.authInfo ? { account: extra.authInfo.clientId, apiKey: extra.authInfo.token } : undefined);
      const server = new McpServer({ name: "idem-payments", version: "0.1.0" });
      const tools = idempotentTools<Tx>(server, {
        store: o.store,
        scope: (extra) => who(extra)?.account,
        // The API key is looked up again, past the cache, before a saved result is sent again.
        authorizeReplay: async (extra) => {
          const c = who(extra);
          return c !== undefined && (await o.apiKeys.accountForUncached(c.apiKey)) === c.account;
        },
        onError: (err) => console.error(err),
      });
      const description =
        "Charge a payment once. Give each payment you intend its own idempotency key (a UUID) and reuse " +
        "that key when you retry it, after an error or a lost connection: a retry returns the first " +
        "result and never charges again.";
      if (runner) {
        tools.registerTool("create_payment", {
          description,
          inputSchema: createSchema,
          annotations: { title: "Create a payment", destructiveHint: false, idempotentHint: false },
          phases: {
            runner,
            // The card as the provider gets it: a card number never reaches the key's stored input.
            input: (args) => {
              const { card, ...payment } = args as PhasesPaymentInput;
              return typeof card === "string"
                ? { ...payment, card: providerCard(card, o.cardTokenKey) }
                : payment;
            },
          },
        });
      } else {
        tools.registerTool(
          "create_payment",
          {
            description,
            inputSchema: createSchema,
            annotations: { title: "Create a payment", destructiveHint: false, idempotentHint: false },
          },
          async (args, { tx, scope }) => json(await insertPayment(tx, scope!, args as PaymentInput)),
        );
      }
      tools.registerTool(
        "list_payments",
        { description: "Your last 100 payments, newest first.", annotations: { readOnlyHint: true } },
        async (_args, { tx, extra }) => json({ data: await listPayments(tx, who(extra)?.account ?? "") }),
      );
      tools.registerTool(
        "get_payment",
        {
          description: "One of your payments, by its id.",
          inputSchema: { id: z.string().min(1).max(64) },
          annotations: { readOnlyHint: true },
        },
        async (args, { tx, extra }) => {
          const payment = await findPayment(tx, who(extra)?.account ?? "", args.id);
          return payment
            ? json(payment)
            : {
                isError: true,
                content: [{ type: "text", text: "No payment with this id in your account." }],
              };
        },
      );
      return server;
    },
  };
}
