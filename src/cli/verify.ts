import { readFileSync } from "node:fs";
import type { Db } from "../postgres/db.ts";
import {
  checkOptions,
  EffectCountError,
  type EffectCounter,
  FAULTS,
  formatReport,
  listEffects,
  sqlEffects,
  type VerifyFault,
  type VerifyOptions,
  VerifyUsageError,
  verify,
} from "../testing/verify/index.ts";
import { createProgressBar } from "../testing/verify/progress.ts";
import { CliError, EXIT, openDb, parse } from "./shared.ts";

const USAGE = `usage: idem verify --url URL --path PATH [--body TEMPLATE] [options]

Runs intents against your API with duplicate sends, concurrent copies, replies dropped after the
server answered, per-try timeouts, and probes (same key with a changed body, same key from a second
account), then checks: one effect per succeeded intent, none for rejected requests, identical answers
for one key, 422 for a changed body, keys scoped by account, no key stuck in 409 past the lease, and
problem answers that say what the client may do next (operation_state, retry_same_key, safe_new_key;
checked also on one request sent without its key).

The request (placeholders {{amount}} {{uuid}} {{n}} {{key}} are filled per intent):
  --url URL              the API's base URL (default: $IDEM_VERIFY_URL)
  --method M             default: POST
  --path PATH            e.g. /v1/payments
  --body TEMPLATE        e.g. '{"amount_cents":{{amount}},"currency":"eur"}', or @file to read it
  --header 'N: V'        an extra header (repeatable; values may hold placeholders)
  --auth-bearer TOKEN    sent as Authorization: Bearer TOKEN (default: $IDEM_VERIFY_BEARER)
  --auth-bearer-2 TOKEN  a second account, for the scope probe (default: $IDEM_VERIFY_BEARER_2)
  --key-header NAME      default: Idempotency-Key
Counting effects (one of the two; without, effects are not checked):
  --count-sql SQL        a query returning one number, e.g.
                         "SELECT count(*) FROM payments WHERE amount_cents = {{amount}}"
  --database-url URL     where --count-sql runs (default: $DATABASE_URL)
  --count-url PATH|URL   a GET list endpoint under --url, e.g. /v1/payments (sent with --auth-bearer)
  --count-path DOTPATH   where the array is in its JSON, e.g. data (default: the reply itself)
  --match FIELD=VALUE    item fields that mark an intent's effect, e.g. amount_cents={{amount}}
                         (repeatable; required with --count-url)
The run:
  --intents N            default: 40
  --concurrency N        intents in progress at once (default: 8)
  --seed N               seed of the fault plan (default: $IDEM_VERIFY_SEED, else 1)
  --faults LIST          comma-separated, from ${FAULTS.join(",")}
                         (default: all; scope only with --auth-bearer-2)
  --copies N             sends of a concurrent intent (default: 3)
  --timeout-ms N         how long the first try of a timeout intent waits before giving up
                         (default: 500; the proxy holds its reply until then)
  --lease-seconds S      how long a key may answer 409 before it counts as stuck (default: 10)
  --amount-base N        {{amount}} of intent n is N + n (default: random, 1000000..8999999)
  --json                 print the report as JSON (no progress bar, no table)
Exit codes: 0 every invariant held, 1 a violation (or the API or database could not be reached),
2 bad usage.`;

function whole(flag: string, value: string | undefined, fallback: number, min = 1): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min)
    throw new CliError(`${flag} takes a whole number >= ${min}`, EXIT.usage);
  return n;
}

function headerPairs(list: string[] | undefined, flag: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const h of list ?? []) {
    const i = h.indexOf(":");
    if (i <= 0) throw new CliError(`${flag} takes "Name: value", got ${JSON.stringify(h)}`, EXIT.usage);
    out[h.slice(0, i).trim().toLowerCase()] = h.slice(i + 1).trim();
  }
  return out;
}

export async function verifyCommand(argv: string[]): Promise<number> {
  const { values } = parse(
    argv,
    {
      url: { type: "string" },
      method: { type: "string" },
      path: { type: "string" },
      body: { type: "string" },
      header: { type: "string", multiple: true },
      "auth-bearer": { type: "string" },
      "auth-bearer-2": { type: "string" },
      "key-header": { type: "string" },
      "count-sql": { type: "string" },
      "database-url": { type: "string" },
      "count-url": { type: "string" },
      "count-path": { type: "string" },
      match: { type: "string", multiple: true },
      intents: { type: "string" },
      concurrency: { type: "string" },
      seed: { type: "string" },
      faults: { type: "string" },
      copies: { type: "string" },
      "timeout-ms": { type: "string" },
      "lease-seconds": { type: "string" },
      "amount-base": { type: "string" },
      json: { type: "boolean" },
    },
    USAGE,
  );
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }

  const url = values.url ?? process.env.IDEM_VERIFY_URL;
  if (!url) throw new CliError("--url is required (or set IDEM_VERIFY_URL): the API's base URL", EXIT.usage);
  if (!values.path)
    throw new CliError("--path is required: the path each intent sends to, e.g. /v1/payments", EXIT.usage);
  let body = values.body;
  if (body?.startsWith("@")) {
    try {
      body = readFileSync(body.slice(1), "utf8");
    } catch (err) {
      throw new CliError(`cannot read --body ${body}: ${(err as Error).message}`, EXIT.usage);
    }
  }
  const bearer = values["auth-bearer"] ?? process.env.IDEM_VERIFY_BEARER;
  const bearer2 = values["auth-bearer-2"] ?? process.env.IDEM_VERIFY_BEARER_2;
  const auth: Record<string, string> = bearer ? { authorization: `Bearer ${bearer}` } : {};
  const secondAuth = bearer2 ? { authorization: `Bearer ${bearer2}` } : undefined;
  let faults: VerifyFault[] | undefined;
  if (values.faults !== undefined) {
    faults = values.faults
      .split(",")
      .map((f) => f.trim())
      .filter(Boolean) as VerifyFault[];
    const bad = faults.find((f) => !(FAULTS as readonly string[]).includes(f));
    if (bad) throw new CliError(`--faults: unknown fault "${bad}"; use ${FAULTS.join(",")}`, EXIT.usage);
    if (faults.includes("scope") && !secondAuth) {
      throw new CliError("--faults scope needs a second account: pass --auth-bearer-2 TOKEN", EXIT.usage);
    }
  }
  const seedRaw = values.seed ?? process.env.IDEM_VERIFY_SEED;
  const seed = whole("--seed", seedRaw, 1, 0);
  const amountBase =
    values["amount-base"] === undefined ? undefined : whole("--amount-base", values["amount-base"], 0);

  // Counting effects.
  if (values["count-sql"] && values["count-url"]) {
    throw new CliError("give --count-sql or --count-url, not both", EXIT.usage);
  }
  if (values["count-url"] && !values.match?.length) {
    throw new CliError(
      "--count-url needs --match FIELD=VALUE, e.g. --match amount_cents={{amount}}",
      EXIT.usage,
    );
  }
  if ((values.match?.length || values["count-path"] !== undefined) && !values["count-url"]) {
    throw new CliError("--match and --count-path go with --count-url", EXIT.usage);
  }
  const match: Record<string, string> = {};
  for (const m of values.match ?? []) {
    const i = m.indexOf("=");
    if (i <= 0) throw new CliError(`--match takes FIELD=VALUE, got ${JSON.stringify(m)}`, EXIT.usage);
    match[m.slice(0, i).trim()] = m.slice(i + 1).trim();
  }
  const intents = whole("--intents", values.intents, 40);
  let db: Db | undefined;
  let effects: EffectCounter | undefined;
  const options: VerifyOptions = {
    url,
    request: {
      method: values.method ?? "POST",
      path: values.path,
      body,
      headers: headerPairs(values.header, "--header"),
    },
    auth,
    secondAuth,
    intents,
    concurrency: whole("--concurrency", values.concurrency, 8),
    seed,
    faults,
    copies: whole("--copies", values.copies, 3, 2),
    timeoutMs: whole("--timeout-ms", values["timeout-ms"], 500),
    leaseSeconds: whole("--lease-seconds", values["lease-seconds"], 10),
    keyHeader: values["key-header"],
    amountBase,
  };
  try {
    // Usage errors first, before anything is opened or sent.
    checkOptions(options);
  } catch (err) {
    if (err instanceof VerifyUsageError) throw new CliError(err.message, EXIT.usage);
    throw err;
  }

  const dbUrl = values["database-url"] ?? process.env.DATABASE_URL;
  if (values["count-sql"] && !dbUrl) {
    throw new CliError(
      "--count-sql needs the API's database: pass --database-url postgres://... (or set DATABASE_URL)",
      EXIT.usage,
    );
  }

  // Is the API there at all? One plain GET: any HTTP answer will do.
  try {
    await fetch(url, { signal: AbortSignal.timeout(5_000) }).then((r) => r.body?.cancel());
  } catch (err) {
    const cause = (err as { cause?: { code?: string } }).cause?.code ?? (err as Error).message;
    throw new CliError(`cannot reach the API at ${url} (${cause}): start it or fix --url`);
  }

  const json = values.json === true;
  try {
    if (values["count-sql"]) {
      db = (await openDb(dbUrl)).db;
      effects = sqlEffects(db, values["count-sql"]);
    } else if (values["count-url"]) {
      effects = listEffects({
        url: new URL(values["count-url"], url).href,
        headers: auth,
        path: values["count-path"] ?? "",
        match,
      });
    } else if (!json) {
      console.error(
        "idem verify: effects are not counted (no --count-sql or --count-url): effect checks skipped",
      );
    }
    const bar = json ? undefined : createProgressBar({ total: intents, label: "idem verify" });
    let report: Awaited<ReturnType<typeof verify>>;
    try {
      report = await verify({
        ...options,
        effects,
        onProgress: (done, _total, suspect) =>
          bar?.update(done, suspect ? `(${suspect} suspicious)` : undefined),
      });
    } catch (err) {
      if (err instanceof EffectCountError) {
        throw new CliError(
          `${err.message}: fix ${values["count-sql"] ? "--count-sql or --database-url" : "--count-url, --count-path or --match"}`,
        );
      }
      throw err;
    } finally {
      bar?.done();
    }
    console.log(json ? JSON.stringify(report, null, 2) : formatReport(report));
    return report.ok ? EXIT.ok : EXIT.failure;
  } finally {
    await db?.close();
  }
}
