import { decodeOperationRef, type KeyInspection } from "../core/index.ts";
import { inspectKey, unfinishedKeys } from "../postgres/inspect.ts";
import {
  NoOpenReviewError,
  openReviews,
  type Review,
  type Settlement,
  settleKey,
} from "../postgres/phases/index.ts";
import { CliError, EXIT, openStore, parse, printable, printJson, retentionMs } from "./shared.ts";

const USAGE = `usage: idem keys inspect <scope> <key> | --ref <operation_ref>   [--json]
       idem keys list --state needs_review|unfinished [--limit N]    [--json]
       idem keys settle <scope> <key> --note TEXT [--by NAME]
                        (--resume PHASE [--data JSON] | --answer STATUS [--body JSON])
  common: [--database-url URL] [--schema NAME] [--retention-hours H]

Support tooling for one key (an operation_ref from a client's problem response names one):
  inspect   state, recovery point, lease holder and expiry, fingerprint, saved status, headers and
            body size, expiry
  list      keys waiting for a person (needs_review: their outcome is unknown) or still unfinished
  settle    close a needs_review key, on the record: --resume PHASE puts it back at a phase of its
            runner (with --data merged into its phase data, e.g. '{"chargeId":"ch_..."}' found at the
            provider), after which a retry or \`idem complete\` finishes it; --answer STATUS saves a
            final answer (--body its JSON) that every retry then gets
  --database-url URL   default: $DATABASE_URL, else the embedded .idem/pgdata
  --schema NAME        default: idem
  --retention-hours H  as configured for the service (default: $IDEM_RETENTION_HOURS, else 24)
  --by NAME            who settles (default: $USER)
Exit codes: 0 done, 1 failure (no such key, no open review), 2 bad usage.`;

const OPTIONS = {
  ref: { type: "string" },
  state: { type: "string" },
  limit: { type: "string" },
  note: { type: "string" },
  by: { type: "string" },
  resume: { type: "string" },
  data: { type: "string" },
  answer: { type: "string" },
  body: { type: "string" },
  json: { type: "boolean" },
  "database-url": { type: "string" },
  schema: { type: "string" },
  "retention-hours": { type: "string" },
} as const;

type Values = ReturnType<typeof parse<typeof OPTIONS>>["values"];

export async function keysCommand(argv: string[]): Promise<number> {
  const { values, positionals } = parse(argv, OPTIONS, USAGE);
  const [sub, ...args] = positionals;
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  if (!sub) {
    console.error(USAGE);
    return EXIT.usage;
  }
  if (sub !== "inspect" && sub !== "list" && sub !== "settle") {
    throw new CliError(`unknown subcommand "${sub}": inspect, list or settle\n${USAGE}`, EXIT.usage);
  }
  const request =
    sub === "list" ? checkList(values) : sub === "settle" ? checkSettle(values, args) : undefined;
  const target = sub === "list" ? undefined : keyOf(values, args);
  const { db, where, store } = await openStore({
    url: values["database-url"] ?? process.env.DATABASE_URL,
    schema: values.schema,
    retentionMs: retentionMs(values["retention-hours"]),
  });
  try {
    if (sub === "inspect") {
      const k = await inspectKey(store, target!.scope, target!.key);
      if (!k) {
        throw new CliError(
          `no live key ${JSON.stringify(target!.key)} of ${JSON.stringify(target!.scope)} on ${where}`,
        );
      }
      const named = target!.claimId;
      if (named !== undefined && named !== k.claimId) {
        // The reference names one claim of the key; the key was claimed again since (a new operation).
        console.error(
          `note: --ref names claim ${named}, which has expired; the key shown is a later claim (a new operation)`,
        );
      }
      if (values.json) printJson(k);
      else console.log(describe(k));
      return EXIT.ok;
    }
    if (sub === "list") {
      const { state, limit } = request as { state: string; limit: number };
      const list =
        state === "needs_review"
          ? await openReviews(store, { limit })
          : await unfinishedKeys(store, { limit });
      if (values.json) printJson(list);
      else {
        for (const item of list) console.log(printable(line(item)));
        console.log(
          `${list.length} key(s) ${state === "needs_review" ? "waiting for a person" : "unfinished"} on ${where}`,
        );
      }
      return EXIT.ok;
    }
    const by = values.by ?? process.env.USER ?? "unknown";
    try {
      const review = await settleKey(store, target!.scope, target!.key, request as Settlement, by);
      if (values.json) printJson(review);
      else
        console.log(
          printable(`settled ${review.scope} ${review.key} by ${by}: ${JSON.stringify(review.settlement)}`),
        );
      return EXIT.ok;
    } catch (err) {
      if (err instanceof NoOpenReviewError)
        throw new CliError(`${err.message} (see idem keys list --state needs_review)`);
      throw err;
    }
  } finally {
    await db.close();
  }
}

function keyOf(values: Values, args: string[]): { scope: string; key: string; claimId?: string } {
  if (values.ref !== undefined) {
    const decoded = decodeOperationRef(values.ref);
    if (!decoded)
      throw new CliError(`--ref ${values.ref} is not an operation_ref (they start with op_)`, EXIT.usage);
    return decoded;
  }
  const [scope, key] = args;
  if (!scope || !key || args.length > 2)
    throw new CliError(`give <scope> <key>, or --ref <operation_ref>\n${USAGE}`, EXIT.usage);
  return { scope, key };
}

function checkList(values: Values): { state: string; limit: number } {
  const state = values.state;
  if (state !== "needs_review" && state !== "unfinished") {
    throw new CliError("--state takes needs_review or unfinished", EXIT.usage);
  }
  const limit = Number(values.limit ?? 100);
  if (!(Number.isInteger(limit) && limit > 0))
    throw new CliError("--limit takes a positive whole number", EXIT.usage);
  return { state, limit };
}

function json(flag: string, text: string | undefined): Record<string, unknown> | undefined {
  if (text === undefined) return undefined;
  try {
    return JSON.parse(text);
  } catch {
    throw new CliError(`${flag} takes JSON, e.g. ${flag} '{"chargeId":"ch_123"}'`, EXIT.usage);
  }
}

function checkSettle(values: Values, args: string[]): Settlement {
  keyOf(values, args);
  const note = values.note?.trim();
  if (!note)
    throw new CliError("--note is required: say what you found and where (it is recorded)", EXIT.usage);
  if ((values.resume === undefined) === (values.answer === undefined)) {
    throw new CliError("give exactly one of --resume PHASE or --answer STATUS", EXIT.usage);
  }
  if (values.resume !== undefined) {
    const data = json("--data", values.data);
    if (data !== undefined && (typeof data !== "object" || data === null || Array.isArray(data))) {
      throw new CliError("--data takes a JSON object", EXIT.usage);
    }
    return { resume: values.resume, data, note };
  }
  const status = Number(values.answer);
  if (!(Number.isInteger(status) && status >= 200 && status <= 599)) {
    throw new CliError("--answer takes an HTTP status (200 to 599)", EXIT.usage);
  }
  return { answer: { status, body: json("--body", values.body) ?? null }, note };
}

function describe(k: KeyInspection): string {
  const rows: Array<[string, string]> = [
    ["scope", k.scope],
    ["key", k.key],
    ["ref", k.ref],
    ["claim id", k.claimId ?? "-"],
    ["state", k.state],
    ["recovery point", k.recoveryPoint],
    ["runner", k.runner ?? "-"],
    ["lease", k.lease ? `${k.lease.token} until ${k.lease.until.toISOString()}` : "none"],
    ["fingerprint", k.fingerprint],
    ["created", k.createdAt.toISOString()],
    ["updated", k.updatedAt?.toISOString() ?? "-"],
    ["expires", k.expiresAt.toISOString()],
    [
      "saved answer",
      k.saved
        ? `${k.saved.status}, ${k.saved.bodyBytes} bytes, headers ${JSON.stringify(k.saved.headers)}`
        : "none",
    ],
    ["phase data", k.phaseData ? JSON.stringify(k.phaseData) : "-"],
  ];
  return rows.map(([name, value]) => `${name.padEnd(15)} ${printable(value)}`).join("\n");
}

function line(item: KeyInspection | Review): string {
  if ("reason" in item) {
    return `${item.openedAt.toISOString()} ${item.scope} ${item.key} [${item.runner ?? "?"} at ${item.recoveryPoint}] ${item.reason} (${item.ref})`;
  }
  const lease = item.lease ? `lease until ${item.lease.until.toISOString()}` : "no lease";
  return `${(item.updatedAt ?? item.createdAt).toISOString()} ${item.scope} ${item.key} [${item.runner ?? "?"} at ${item.recoveryPoint}] ${lease} (${item.ref})`;
}
