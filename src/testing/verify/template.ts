/**
 * Request templates. Each intent renders the template with values of its own, so every intent sends
 * a distinct request and its effects can be told apart (a distinct amount, a distinct UUID).
 *
 * Placeholders (in the path, the body, header values, the effect-counting SQL and `match` values):
 *   {{amount}}  a whole number unique to the intent (and to each probe of it)
 *   {{uuid}}    a random UUID unique to the intent (and to each probe)
 *   {{n}}       the intent's number, from 0
 *   {{key}}     the intent's idempotency key
 */
export const PLACEHOLDERS = ["amount", "uuid", "n", "key"] as const;
export type Placeholder = (typeof PLACEHOLDERS)[number];

/** The values one request is rendered with. */
export interface TemplateVars {
  amount: number;
  uuid: string;
  n: number;
  key: string;
}

/** What an intent sends (before rendering). Credentials are not part of it: see `VerifyOptions.auth`. */
export interface RequestTemplate {
  /** Default `POST`. */
  method?: string;
  /** Path (with query) under the base URL, e.g. `/v1/payments`. */
  path: string;
  /** The body; JSON bodies get `content-type: application/json` unless a header says otherwise. */
  body?: string;
  /** Extra headers; values may hold placeholders. */
  headers?: Record<string, string>;
}

export interface RenderedRequest {
  method: string;
  path: string;
  body: string | undefined;
  headers: Record<string, string>;
}

const PATTERN = /\{\{\s*([A-Za-z_]\w*)\s*\}\}/g;

/** Placeholder names used in `text` that idem verify does not know. */
export function unknownPlaceholders(text: string): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(PATTERN)) {
    if (!(PLACEHOLDERS as readonly string[]).includes(m[1]!)) out.push(m[1]!);
  }
  return out;
}

export function usesPlaceholders(text: string | undefined): boolean {
  return text !== undefined && new RegExp(PATTERN.source).test(text);
}

export function render(text: string, vars: TemplateVars): string {
  return text.replace(PATTERN, (whole, name: string) =>
    name in vars ? String(vars[name as Placeholder]) : whole,
  );
}

export function renderRequest(t: RequestTemplate, vars: TemplateVars): RenderedRequest {
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(t.headers ?? {}))
    headers[name.toLowerCase()] = render(value, vars);
  const body = t.body === undefined ? undefined : render(t.body, vars);
  if (body !== undefined && !("content-type" in headers) && /^\s*[[{]/.test(body)) {
    headers["content-type"] = "application/json";
  }
  return { method: (t.method ?? "POST").toUpperCase(), path: render(t.path, vars), body, headers };
}

/**
 * SQL with placeholders -> a parameterised statement: `amount_cents = {{amount}}` becomes
 * `amount_cents = $1`. A placeholder written inside quotes (`'{{uuid}}'`) is a parameter too.
 * Values are never pasted into the SQL text.
 */
export function toParameterised(sql: string): { text: string; names: Placeholder[] } {
  const names: Placeholder[] = [];
  const text = sql.replace(/'?\{\{\s*([A-Za-z_]\w*)\s*\}\}'?/g, (_whole, name: string) => {
    let i = names.indexOf(name as Placeholder);
    if (i < 0) {
      names.push(name as Placeholder);
      i = names.length - 1;
    }
    return `$${i + 1}`;
  });
  return { text, names };
}
