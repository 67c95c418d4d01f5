/**
 * Request validation from the schemas in app/schemas.ts: each schema is compiled once by Ajv, and a bad
 * body is answered before anything is claimed: 415 for a media type the route does not take, 400
 * `invalid-body` with one sentence saying which field is wrong and what it must be.
 */
import type { Static, TObject, TSchema } from "@sinclair/typebox";
import { Ajv2020, type ErrorObject, type ValidateFunction } from "ajv/dist/2020.js";
import type { MiddlewareHandler } from "hono";
import { bodyKind } from "idem";
import { problem } from "./problems.ts";
import { IdParam } from "./schemas.ts";

// strict: a typo in a schema keyword is an error at startup, not a rule silently not checked.
const ajv = new Ajv2020({ strict: true, allErrors: false });
const compiled = new WeakMap<TSchema, ValidateFunction>();

/** The schema's compiled validator (compiled on first use, then cached). */
export function validatorOf<S extends TSchema>(schema: S): ValidateFunction<Static<S>> {
  let v = compiled.get(schema);
  if (!v) {
    v = ajv.compile(schema);
    compiled.set(schema, v);
  }
  return v as ValidateFunction<Static<S>>;
}

/** The first error, as one sentence: `amount_cents must be a whole number from 1 to 100000000`. */
export function describeError(schema: TObject, error: ErrorObject | undefined): string {
  if (!error) return "the body does not match its schema";
  if (error.instancePath === "" && error.keyword === "type") return "the body must be a JSON object";
  const field =
    error.keyword === "required"
      ? String(error.params.missingProperty)
      : error.instancePath.slice(1).split("/")[0]!;
  const rule = (schema.properties[field] as TSchema | undefined)?.description;
  if (rule) return `${field} must be ${rule}`;
  return `${error.instancePath.slice(1) || "the body"} ${error.message ?? "is invalid"}`;
}

export type Checked<T> = { ok: true; value: T } | { ok: false; error: string };

/** Validate a parsed value: the value, or the sentence saying what is wrong. */
export function check<S extends TObject>(schema: S, value: unknown): Checked<Static<S>> {
  const validate = validatorOf(schema);
  if (validate(value)) return { ok: true, value };
  return { ok: false, error: describeError(schema, validate.errors?.[0]) };
}

/**
 * Form fields as an object: each field once (a repeated field is ambiguous: 400), and the fields the
 * schema declares as integers converted from their digits (`amount_cents=1500`).
 */
function formFields(schema: TObject, raw: string): Checked<Record<string, unknown>> {
  const fields: Record<string, unknown> = {};
  for (const [name, value] of new URLSearchParams(raw)) {
    if (Object.hasOwn(fields, name)) return { ok: false, error: `${name} is given more than once` };
    const type = (schema.properties[name] as TSchema | undefined)?.type;
    fields[name] = type === "integer" && /^\d{1,15}$/.test(value) ? Number(value) : value;
  }
  return { ok: true, value: fields };
}

/** Parse (JSON, or form) and validate a body: the value, or the sentence saying why not. */
export function parseBody<S extends TObject>(
  schema: S,
  contentType: string | undefined,
  raw: string,
): Checked<Static<S>> {
  const kind = bodyKind(contentType);
  if (kind === "form") {
    const fields = formFields(schema, raw);
    return fields.ok ? check(schema, fields.value) : fields;
  }
  if (kind !== "json") return { ok: false, error: "the body must be JSON or form data" };
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    return { ok: false, error: "the body is not valid JSON" };
  }
  if (value === null || typeof value !== "object" || Array.isArray(value))
    return { ok: false, error: "the body must be a JSON object" };
  return check(schema, value);
}

export interface BodyOptions {
  /** What the body is, for the 400's detail: `Invalid <what>: ...`. */
  what: string;
  /** Also accept application/x-www-form-urlencoded. Default: JSON only. */
  form?: boolean;
}

/** Middleware: the validated body as `c.var.body`, or a 415/400 problem (nothing claimed, nothing run). */
export function validBody<S extends TObject>(
  schema: S,
  o: BodyOptions,
): MiddlewareHandler<{ Variables: { body: Static<S> } }> {
  validatorOf(schema); // compile at startup: a bad schema fails here, not on the first request
  const accepted = o.form ? "application/json or application/x-www-form-urlencoded" : "application/json";
  return async function validateBody(c, next) {
    const ct = c.req.header("content-type");
    const kind = bodyKind(ct);
    if (kind === "raw" || (kind === "form" && !o.form)) {
      return problem(415, "unsupported-media-type", `Send the body as ${accepted}.`);
    }
    const parsed = parseBody(schema, ct, await c.req.text());
    if (!parsed.ok) return problem(400, "invalid-body", `Invalid ${o.what}: ${parsed.error}.`);
    c.set("body", parsed.value);
    await next();
  };
}

/** Middleware: these path parameters must be caller-chosen ids (`IdParam`), else 400. */
export function validIds(...names: string[]): MiddlewareHandler {
  const valid = validatorOf(IdParam);
  return async function validateIds(c, next) {
    for (const name of names) {
      if (!valid(c.req.param(name))) {
        return problem(400, "invalid-body", `The ${name} id must be ${IdParam.description}.`);
      }
    }
    await next();
  };
}

/**
 * Refuse, before any route runs, a request whose path or query holds a control character (NUL and the
 * like, also as %00) or a broken %-escape: 400, so that no such value reaches PostgreSQL (which refuses
 * NUL in text: that would be a 500) on any route, the admin API's included.
 */
export function plainPathAndQuery(): MiddlewareHandler {
  return async function plainPathAndQuery(c, next) {
    const url = new URL(c.req.url);
    let path: string;
    try {
      path = url.pathname.split("/").map(decodeURIComponent).join("/");
    } catch {
      return problem(400, "bad-request", "The path holds a broken %-escape.");
    }
    const values = [path, ...[...url.searchParams].flat()];
    // biome-ignore lint/suspicious/noControlCharactersInRegex: the point is to find them
    if (values.some((v) => /[\u0000-\u001f\u007f]/.test(v))) {
      return problem(400, "bad-request", "The path or the query holds a control character.");
    }
    await next();
  };
}
