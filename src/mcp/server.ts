/**
 * `idempotentTools(server, options)`: tools of an `@modelcontextprotocol/sdk` `McpServer` whose calls take
 * effect once. A thin translation onto the one request lifecycle (core/lifecycle.ts) and the store the
 * HTTP adapters use:
 *
 *   tools/call { name, arguments, _meta.idempotencyKey }        the key: `_meta`, or the tool argument
 *     -> IdemRequest  method TOOLS/CALL, path /tools/<name>      (`idempotency_key`) for clients that
 *        body         the arguments, key left out (JSON)        cannot set `_meta`
 *        scope        the authenticated client or the session (`scope`), never the JSON-RPC id
 *     -> lifecycle.keyed (atomic: the tool's writes, its result and the key commit together)
 *        lifecycle.phases (a phases runner: calls to other systems through recovery points)
 *     -> CallToolResult: the tool's result (`_meta.idempotency.replayed` on a retry), or a tool error
 *        for a call in progress (409, with when to ask again), other arguments (422), no key (400)
 *
 * Which tools are keyed: every tool registered here, except those whose annotations say a repeat changes
 * nothing. `readOnlyHint: true` tools run as they are (no key read, no result saved); `idempotentHint:
 * true` tools (unless `destructiveHint: true`) use a key when one is given and run without one
 * otherwise. Tools registered on the `McpServer` directly are not touched.
 */
import type { McpServer, RegisteredTool } from "@modelcontextprotocol/sdk/server/mcp.js";
import type {
  AnySchema,
  SchemaOutput,
  ShapeOutput,
  ZodRawShapeCompat,
} from "@modelcontextprotocol/sdk/server/zod-compat.js";
import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js";
import type {
  CallToolResult,
  ServerNotification,
  ServerRequest,
  ToolAnnotations,
} from "@modelcontextprotocol/sdk/types.js";
import {
  type AtomicStore,
  type Begun,
  IdemOptionsError,
  type IdemRequest,
  KeyInvalidError,
  Lifecycle,
  type OutcomeEvent,
  type PhasesRunnerLike,
  type RequestBody,
  type RunOptions,
} from "../core/index.ts";
import { withKeyArgument } from "./key-argument.ts";
import { IDEMPOTENCY_META, KEY_ARGUMENT, KEY_META, type ToolIdempotency } from "./meta.ts";
import { refusal, resultOf, settledResult, toolResponse } from "./result.ts";

/** What the SDK hands a tool besides its arguments: the session, the caller's auth, the request's `_meta`. */
export type ToolExtra = RequestHandlerExtra<ServerRequest, ServerNotification>;

/** The arguments a tool's handler gets for its `inputSchema` (a zod raw shape or schema). */
export type ToolArgs<S> = S extends ZodRawShapeCompat
  ? ShapeOutput<S>
  : S extends AnySchema
    ? SchemaOutput<S>
    : Record<string, never>;

/** What a keyed tool's handler gets besides its arguments. */
export interface IdempotentToolContext<Tx> {
  /** The call's transaction (atomic mode): the tool's writes commit with its result and its key. */
  tx: Tx;
  /** The call's idempotency key; undefined for a call without one (read-only and `idempotentHint` tools). */
  key: string | undefined;
  /** The caller's scope, as `scope` gave it. */
  scope: string | undefined;
  /** The SDK's request context (`authInfo`, `sessionId`, `signal`, `_meta`...). */
  extra: ToolExtra;
}

/**
 * A keyed tool: returns the call's result. A result it RETURNS is the call's answer, saved and sent
 * again to every retry (an `isError` result too: a declined card stays declined); an error it THROWS
 * rolls its writes back, saves nothing, and the retry runs it again.
 */
export type IdempotentToolHandler<S, Tx> = (
  args: ToolArgs<S>,
  ctx: IdempotentToolContext<Tx>,
) => CallToolResult | Promise<CallToolResult>;

/** Phases mode for a tool: the runner does the work (`definePhases` from `idem/postgres`). */
export interface PhasesToolOptions<I, S> {
  /** The runner. Its last phase answers with `toolResponse(result)` (or a route's JSON answer). Required. */
  runner: PhasesRunnerLike<I>;
  /** The runner's input from the arguments (JSON: stored with the key for the completer). Default: the arguments. */
  input?: (args: ToolArgs<S>, extra: ToolExtra) => I | Promise<I>;
  /** The longest a call waits for the phases before a "still in progress" answer, in ms. Default: 5,000. */
  answerWithinMs?: number;
}

/** A tool's registration: the SDK's config, plus how idem keys it. */
export interface IdempotentToolConfig<S, I = unknown> {
  /** A title for people, as in the SDK. */
  title?: string;
  /** What the tool does, for the model: say that a retry must reuse the action's key. */
  description?: string;
  /** The arguments, as a zod raw shape or object schema (v3 or v4). idem adds the key argument. */
  inputSchema?: S;
  /** The result's `structuredContent`, as in the SDK. */
  outputSchema?: ZodRawShapeCompat | AnySchema;
  /**
   * MCP's hints. `readOnlyHint: true`: passed through, no key. `idempotentHint: true`: a key is optional,
   * unless `destructiveHint: true` (a retry then gets the first call's result).
   */
  annotations?: ToolAnnotations;
  /** The tool's `_meta` in `tools/list`; idem adds `idempotency` (how the tool takes its key). */
  _meta?: Record<string, unknown>;
  /** Phases mode (the tool calls other systems). Default: atomic mode, with the handler given. */
  phases?: PhasesToolOptions<I, S>;
  /**
   * Whether a call needs a key, overriding the annotations: `required`, `optional` (used when given), or
   * `none` (passed through). Default: from the annotations, else `required`.
   */
  key?: "required" | "optional" | "none";
}

/** Options of {@link idempotentTools}. */
export interface IdempotentToolsOptions<Tx> {
  /** The store keys and results live in (`await PostgresStore.open(db)`). Required for atomic tools. */
  store?: AtomicStore<Tx>;
  /**
   * The caller's scope: whose keys a call's key is among. From authentication (the account behind
   * `extra.authInfo`), never from the arguments, never the JSON-RPC id. Default: `client:<authInfo.clientId>`
   * when the transport authenticated the caller, else `session:<sessionId>`, else none (a keyed call is
   * then refused). A session's scope ends with the session: authenticate callers whose retries may come
   * on a new one.
   */
  scope?: (extra: ToolExtra) => string | undefined | Promise<string | undefined>;
  /**
   * Runs before a saved result is sent again (or a phases key resumed): false refuses the call and sends
   * nothing of the result. Default: none.
   */
  authorizeReplay?: (extra: ToolExtra) => boolean | Promise<boolean>;
  /**
   * The tool argument that carries the key for clients that cannot set `_meta`, declared in each keyed
   * tool's input schema; `false` reads `_meta` only. Default: `"idempotency_key"`.
   */
  argument?: string | false;
  /** Called with an error a tool threw, before the "failed, nothing saved" tool error. Default: `console.error`. */
  onError?: (err: unknown, extra: ToolExtra) => void;
  /** Called once per keyed call with how it ended (for metrics and logs), as on HTTP routes. Default: none. */
  onOutcome?: (event: OutcomeEvent) => void;
  /**
   * Promise that atomic tools' only effects are their statements on `ctx.tx` (see the HTTP adapters'
   * `effectsInTxOnly`): their first statement then goes out with the key's claim. Default: `false`.
   */
  effectsInTxOnly?: boolean;
}

/** The default scope: the authenticated client, else the session. */
export function defaultScope(extra: ToolExtra): string | undefined {
  if (extra.authInfo?.clientId) return `client:${extra.authInfo.clientId}`;
  return extra.sessionId === undefined ? undefined : `session:${extra.sessionId}`;
}

/** The lifecycle's view of a tool call. */
class ToolRequest implements IdemRequest {
  readonly method = "TOOLS/CALL";
  readonly path: string;
  constructor(
    tool: string,
    private readonly key: string | undefined,
  ) {
    this.path = `/tools/${encodeURIComponent(tool)}`;
  }
  header(name: string): string | undefined {
    return name === "idempotency-key" ? this.key : undefined;
  }
}

const EMPTY = new Uint8Array(0);
const jsonBody = (value: unknown): RequestBody => ({ kind: "json", value, bytes: EMPTY });

/** The key from `_meta` or the argument (both: they must agree), and the arguments without it. */
function keyOf(
  args: Record<string, unknown> | undefined,
  extra: ToolExtra,
  argument: string | false,
): { key: string | undefined; args: Record<string, unknown> } {
  let rest = args ?? {};
  let fromArgument: unknown;
  if (argument !== false && argument in rest) {
    const { [argument]: value, ...others } = rest;
    fromArgument = value;
    rest = others;
  }
  const fromMeta = (extra._meta as Record<string, unknown> | undefined)?.[KEY_META];
  for (const k of [fromMeta, fromArgument]) {
    if (k !== undefined && typeof k !== "string") throw new KeyInvalidError("it must be a string");
  }
  if (fromMeta !== undefined && fromArgument !== undefined && fromMeta !== fromArgument) {
    throw new KeyInvalidError(`_meta.${KEY_META} and the "${argument}" argument differ`);
  }
  return { key: (fromMeta ?? fromArgument) as string | undefined, args: rest };
}

/**
 * How a tool takes its key: its registration's `key`, else its annotations (MCP's defaults: not
 * read-only, destructive, not idempotent): read-only tools none, destructive ones always, idempotent
 * ones when given, the rest always.
 */
function keyRule(config: IdempotentToolConfig<unknown>): "required" | "optional" | "none" {
  if (config.key !== undefined) return config.key;
  const hints = config.annotations;
  if (hints?.readOnlyHint === true) return "none";
  // A destructive tool's retry must get the first call's result (a second delete finds nothing).
  if (hints?.destructiveHint === true) return "required";
  if (hints?.idempotentHint === true) return "optional";
  return "required";
}

/** Tools of one `McpServer` registered with idem's keys (see the file's header). */
export class IdempotentTools<Tx> {
  /** The server the tools are registered on. */
  readonly server: McpServer;
  private readonly options: IdempotentToolsOptions<Tx>;
  private readonly argument: string | false;

  constructor(server: McpServer, options: IdempotentToolsOptions<Tx> = {}) {
    if (typeof (server as Partial<McpServer> | null)?.registerTool !== "function") {
      throw new IdemOptionsError("idempotentTools()", "server", "must be an McpServer", server);
    }
    for (const name of ["scope", "authorizeReplay", "onError", "onOutcome"] as const) {
      if (options[name] !== undefined && typeof options[name] !== "function") {
        throw new IdemOptionsError("idempotentTools()", name, "must be a function when given", options[name]);
      }
    }
    this.server = server;
    this.options = options;
    this.argument = options.argument ?? KEY_ARGUMENT;
  }

  /** Register a tool in atomic mode (or passed through, for `readOnlyHint` tools): `handler` does the work. */
  registerTool<S extends ZodRawShapeCompat | AnySchema | undefined = undefined>(
    name: string,
    config: IdempotentToolConfig<S> & { phases?: undefined },
    handler: IdempotentToolHandler<S, Tx>,
  ): RegisteredTool;
  /** Register a tool in phases mode: `config.phases.runner` does the work. */
  registerTool<S extends ZodRawShapeCompat | AnySchema | undefined = undefined, I = ToolArgs<S>>(
    name: string,
    config: IdempotentToolConfig<S, I> & { phases: PhasesToolOptions<I, S> },
  ): RegisteredTool;
  registerTool(
    name: string,
    config: IdempotentToolConfig<any, any>,
    handler?: IdempotentToolHandler<any, Tx>,
  ): RegisteredTool {
    const factory = `registerTool("${name}")`;
    const rule = keyRule(config);
    const phases = config.phases;
    if (phases) {
      if (typeof phases.runner?.run !== "function") {
        throw new IdemOptionsError(
          factory,
          "phases.runner",
          "must be a runner: definePhases({ ... })",
          phases.runner,
        );
      }
      if (rule !== "required") {
        throw new IdemOptionsError(factory, "key", 'must be "required" for a phases tool', rule);
      }
    } else {
      if (typeof handler !== "function") {
        throw new IdemOptionsError(factory, "handler", "must be the tool's function", handler);
      }
      const store = this.options.store;
      if (typeof store?.atomic !== "function" || typeof store.transaction !== "function") {
        throw new IdemOptionsError(
          "idempotentTools()",
          "store",
          "is required for tools in atomic mode: pass await PostgresStore.open(db)",
          store,
        );
      }
    }
    const argument = rule === "none" ? false : this.argument;
    const meta: ToolIdempotency | undefined =
      rule === "none"
        ? undefined
        : {
            key: rule,
            meta: KEY_META,
            ...(argument !== false && { argument }),
            mode: phases ? "phases" : "atomic",
          };
    const { phases: _, key: __, inputSchema, ...sdkConfig } = config;
    const callback = phases
      ? this.phasesCallback(name, phases, argument)
      : this.atomicCallback(name, handler!, rule, argument);
    return this.server.registerTool(
      name,
      {
        ...sdkConfig,
        // Always a schema, so that the SDK calls back with (args, extra), never (extra) alone.
        inputSchema: (argument === false
          ? (inputSchema ?? {})
          : withKeyArgument(inputSchema, argument, name)) as AnySchema,
        ...(meta && { _meta: { ...config._meta, [IDEMPOTENCY_META]: meta } }),
      },
      callback as never,
    );
  }

  private scopeOf(extra: ToolExtra): string | undefined | Promise<string | undefined> {
    return (this.options.scope ?? defaultScope)(extra);
  }

  private runOptions(extra: ToolExtra): RunOptions {
    const check = this.options.authorizeReplay;
    return { signal: extra.signal, authorize: check && (() => check(extra)) };
  }

  /** Turn what escaped a call into idem's answer (the database away...) or "failed, nothing saved". */
  private failed(
    lifecycle: Lifecycle<Tx>,
    err: unknown,
    begun: Begun | undefined,
    key: string | undefined,
    extra: ToolExtra,
  ) {
    const owed = lifecycle.failure(err, begun);
    if (owed) return refusal(owed, key);
    (this.options.onError ?? ((e: unknown) => console.error(e)))(err, extra);
    return refusal(lifecycle.internalError(begun), key);
  }

  private atomicCallback(
    name: string,
    handler: IdempotentToolHandler<unknown, Tx>,
    rule: "required" | "optional" | "none",
    argument: string | false,
  ) {
    const lifecycle = new Lifecycle<Tx>({
      store: this.options.store!,
      required: rule === "required",
      onOutcome: this.options.onOutcome,
      effectsInTxOnly: this.options.effectsInTxOnly,
    });
    return async (raw: Record<string, unknown> | undefined, extra: ToolExtra): Promise<CallToolResult> => {
      let begun: Begun | undefined;
      let key: string | undefined;
      try {
        const called = keyOf(raw, extra, argument);
        key = rule === "none" ? undefined : called.key;
        const args = called.args as never;
        const scope = await this.scopeOf(extra);
        begun = lifecycle.begin(new ToolRequest(name, key), scope, jsonBody(called.args));
        if (begun.kind === "answer") return refusal(begun.response, key);
        if (begun.kind === "unkeyed") {
          const r = await lifecycle.unkeyed(begun, async (tx) =>
            toolResponse(await handler(args, { tx, key: undefined, scope, extra })),
          );
          return resultOf(r);
        }
        const claimed = begun.claim.key;
        const settled = await lifecycle.keyed(
          begun,
          async (tx) => toolResponse(await handler(args, { tx, key: claimed, scope, extra })),
          this.runOptions(extra),
        );
        return settledResult(settled, claimed);
      } catch (err) {
        return this.failed(lifecycle, err, begun, key, extra);
      }
    };
  }

  private phasesCallback(
    name: string,
    phases: PhasesToolOptions<unknown, unknown>,
    argument: string | false,
  ) {
    const lifecycle = Lifecycle.forPhases<Tx>(
      { onOutcome: this.options.onOutcome },
      phases.answerWithinMs,
      phases.runner.store,
    );
    return async (raw: Record<string, unknown> | undefined, extra: ToolExtra): Promise<CallToolResult> => {
      let begun: Begun | undefined;
      let key: string | undefined;
      try {
        const called = keyOf(raw, extra, argument);
        key = called.key;
        begun = lifecycle.begin(new ToolRequest(name, key), await this.scopeOf(extra), jsonBody(called.args));
        if (begun.kind !== "keyed") {
          return begun.kind === "answer"
            ? refusal(begun.response, key)
            : refusal(lifecycle.internalError(), key);
        }
        const input = phases.input ? await phases.input(called.args as never, extra) : called.args;
        const settled = await lifecycle.phases(begun, phases.runner, input, this.runOptions(extra));
        return settledResult(settled, begun.claim.key);
      } catch (err) {
        return this.failed(lifecycle, err, begun, key, extra);
      }
    };
  }
}

/**
 * Register tools on `server` whose calls take effect once: `idempotentTools(server, { store, scope })
 * .registerTool(name, config, handler)` (see the file's header and docs/mcp.md).
 */
export function idempotentTools<Tx>(
  server: McpServer,
  options: IdempotentToolsOptions<Tx> = {},
): IdempotentTools<Tx> {
  return new IdempotentTools<Tx>(server, options);
}
