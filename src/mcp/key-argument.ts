/**
 * The idempotency key as a declared tool argument, for clients that cannot set `_meta`: the tool's input
 * schema gets one more optional property (`idempotency_key`), so that `tools/list` shows it to the
 * model and the SDK's validation keeps it (an undeclared argument would be stripped before the handler
 * sees it). The SDK takes zod schemas (v3 or v4, as a raw shape or an object schema), so the property
 * is made with the same zod as the tool's own schema: one version per object, as the SDK requires.
 */
import * as z3 from "zod/v3";
import * as z4 from "zod/v4";
import { IDEMPOTENCY_KEY_PATTERN, IdemOptionsError, MAX_KEY_LENGTH } from "../core/index.ts";

const DESCRIPTION =
  "Idempotency key: a new one (a UUID) for each action you intend, the same one on every retry of that " +
  "action. Leave it out when your client sends _meta.idempotencyKey.";
const KEY_CHARS = new RegExp(IDEMPOTENCY_KEY_PATTERN);

type Schema = object;
const isSchema = (s: unknown): boolean => typeof s === "object" && s !== null && ("_zod" in s || "_def" in s);
const isV4 = (s: unknown): boolean => typeof s === "object" && s !== null && "_zod" in s;

function keySchema(v4: boolean): Schema {
  return v4
    ? z4.string().min(1).max(MAX_KEY_LENGTH).regex(KEY_CHARS).optional().describe(DESCRIPTION)
    : z3.string().min(1).max(MAX_KEY_LENGTH).regex(KEY_CHARS).optional().describe(DESCRIPTION);
}

/**
 * `schema` (the tool's `inputSchema`: a raw shape, an object schema, or undefined for a tool without
 * arguments) with the optional key property `argument` added.
 */
export function withKeyArgument(schema: unknown, argument: string, tool: string): unknown {
  if (schema === undefined) return withKeyArgument(NO_ARGUMENTS, argument, tool);
  if (typeof schema !== "object" || schema === null) {
    throw new IdemOptionsError(`registerTool("${tool}")`, "inputSchema", "must be a zod schema", schema);
  }
  // A server made per request (stateless HTTP) registers the same schemas again: extended once.
  let byArgument = extended.get(schema);
  if (!byArgument) {
    byArgument = new Map();
    extended.set(schema, byArgument);
  }
  let out = byArgument.get(argument);
  if (out === undefined) {
    out = extend(schema, argument, tool);
    byArgument.set(argument, out);
  }
  return out;
}

const extended = new WeakMap<object, Map<string, unknown>>();
const NO_ARGUMENTS = Object.freeze({});

function extend(schema: object, argument: string, tool: string): unknown {
  if (!isSchema(schema)) {
    // A raw shape: { amount: z.number() }.
    const values = Object.values(schema);
    if (argument in schema) return schema; // declared by the tool itself
    return { ...schema, [argument]: keySchema(values.length === 0 || values.some(isV4)) };
  }
  const method = (schema as { extend?: unknown }).extend;
  if (typeof method !== "function") {
    throw new IdemOptionsError(
      `registerTool("${tool}")`,
      "inputSchema",
      `must be a raw shape or a z.object(...) so that idem can declare the "${argument}" argument (or set argument: false)`,
      schema,
    );
  }
  return method.call(schema, { [argument]: keySchema(isV4(schema)) });
}
