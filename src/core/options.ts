/**
 * Options checked where a middleware (or module) is created, not on the first request: a missing or
 * mistyped option fails at start-up with an error that names the option and says what it takes,
 * instead of every request answering 500 with a TypeError from deep inside.
 */

/** An option given to one of idem's factories is missing or of the wrong kind. */
export class IdemOptionsError extends TypeError {
  /** Always `"IdemOptionsError"`: the name logs and stack traces show. */
  override name = "IdemOptionsError";
  /** Always `"IDEM_OPTIONS"`: a code to check that does not depend on the class. */
  readonly code = "IDEM_OPTIONS";
  constructor(
    /** The factory the option was given to, e.g. `idempotency()`. */
    readonly factory: string,
    /** The option's name, e.g. `store`. */
    readonly option: string,
    fix: string,
    got: unknown,
  ) {
    super(`${factory}: option "${option}" ${fix}; got ${describe(got)}`);
  }
}

function describe(v: unknown): string {
  if (v === undefined) return "nothing";
  if (v === null) return "null";
  if (typeof v === "function") return "a function";
  if (typeof v === "string")
    return `the string ${JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}...` : v)}`;
  if (typeof v === "object") return `an object with ${Object.keys(v).slice(0, 5).join(", ") || "no keys"}`;
  return `${typeof v} ${String(v)}`;
}

const isFn = (v: unknown): boolean => typeof v === "function";
const has = (v: unknown, ...methods: string[]) =>
  typeof v === "object" && v !== null && methods.every((m) => isFn((v as Record<string, unknown>)[m]));

/**
 * Check a route's options: `scope` (a function), then `store` (atomic routes: a store with `atomic` and
 * `transaction`, e.g. `await PostgresStore.open(db)`, not the `Db`) or `runner` and `input` (phases
 * routes), and that every optional callback given is a function.
 */
export function checkRouteOptions(
  factory: string,
  options: unknown,
  mode: "atomic" | "phases",
  { scope = true }: { scope?: boolean } = {},
): void {
  if (typeof options !== "object" || options === null) {
    throw new IdemOptionsError(factory, "options", "must be an object such as { store, scope }", options);
  }
  const o = options as Record<string, unknown>;
  if (scope && !isFn(o.scope)) {
    throw new IdemOptionsError(
      factory,
      "scope",
      "must be a function that returns the caller's account id from authentication, e.g. scope: (c) => c.var.accountId",
      o.scope,
    );
  }
  if (mode === "atomic" && !has(o.store, "atomic", "transaction")) {
    const isDb = has(o.store, "query") && !has(o.store, "atomic");
    throw new IdemOptionsError(
      factory,
      "store",
      isDb
        ? "must be a store, not a database: pass await PostgresStore.open(db)"
        : "is required: pass a store, e.g. await PostgresStore.open(db)",
      o.store,
    );
  }
  if (mode === "phases") {
    if (!has(o.runner, "run")) {
      throw new IdemOptionsError(factory, "runner", "is required: pass definePhases({ ... })", o.runner);
    }
    if (!isFn(o.input)) {
      throw new IdemOptionsError(
        factory,
        "input",
        "must be a function that returns the runner's input from the validated request",
        o.input,
      );
    }
  }
  for (const name of ["authorizeReplay", "onOutcome", "onError"]) {
    if (o[name] !== undefined && !isFn(o[name])) {
      throw new IdemOptionsError(factory, name, "must be a function when given", o[name]);
    }
  }
  if (
    o.fingerprint !== undefined &&
    !isFn(o.fingerprint) &&
    !Array.isArray((o.fingerprint as { fields?: unknown })?.fields)
  ) {
    throw new IdemOptionsError(
      factory,
      "fingerprint",
      'takes { fields: ["..."] } or a function',
      o.fingerprint,
    );
  }
}
