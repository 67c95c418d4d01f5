/**
 * `idem/mcp`: tool calls by AI agents that take effect once, for Model Context Protocol servers built on
 * `@modelcontextprotocol/sdk` (an optional peer, with its `zod`). The server side wraps tools of an
 * `McpServer` (`idempotentTools`); the agent side gives each intended call one key across retries,
 * reconnects and restarts (`idempotentToolCalls`). docs/mcp.md has the whole story.
 */

// The intent stores and backoff of `idem/client`, which the agent side uses.
export type { BackoffOptions } from "../client/backoff.ts";
export type { IntentRecord, IntentStore } from "../client/intent-store.ts";
export type { OperationState } from "../core/problem.ts";
export {
  IdempotentToolCalls,
  type IdempotentToolCallsOptions,
  idempotentToolCalls,
  type ToolCaller,
  type ToolCallOptions,
} from "./agent.ts";
export {
  IDEMPOTENCY_META,
  type IdempotencyMeta,
  idempotencyMetaOf,
  KEY_ARGUMENT,
  KEY_META,
  type ToolIdempotency,
} from "./meta.ts";
export { TOOL_RESULT_TYPE, toolResponse } from "./result.ts";
export {
  defaultScope,
  type IdempotentToolConfig,
  type IdempotentToolContext,
  type IdempotentToolHandler,
  IdempotentTools,
  type IdempotentToolsOptions,
  idempotentTools,
  type PhasesToolOptions,
  type ToolArgs,
  type ToolExtra,
} from "./server.ts";
