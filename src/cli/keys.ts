import { Operations } from "../admin/operations.ts";
import type { KeyInspection } from "../core/index.ts";
import { isValidKey, isValidScope } from "../core/index.ts";
import { BadOperationRefError, type KeyRef } from "../postgres/admin/key-admin.ts";
import { CannotForgetError } from "../postgres/admin/key-forget.ts";
import {
  NoOpenReviewError,
  type Review,
  type Settlement,
  SettlementRefusedError,
} from "../postgres/phases/index.ts";
import { CliError, EXIT, openStore, parse, printable, printJson, retentionMs } from "./shared.ts";

const USAGE = `usage: idem keys inspect <scope> <key> | --ref <operation_ref>   [--json]
       idem keys list [--state needs_review|unfinished|expiring] [--limit N] [--json]
       idem keys settle <scope> <key> | --ref REF --note TEXT [--by NAME]
                        (--resume PHASE [--data JSON] | --answer STATUS [--body JSON])
       idem keys forget <scope> <key> | --ref REF --reason TEXT [--by NAME] [--effect-reversed]
  common: [--database-url URL] [--schema NAME] [--retention-hours H]

Support tooling for one key (an operation_ref from a client's problem response names one):
  inspect   state, recovery point, lease holder and expiry, fingerprint, saved status, headers and
            body size, expiry
  list      keys waiting for a person (needs_review, the default: their outcome is unknown), still
            unfinished, or expiring within the hour
  settle    close a needs_review key, on the record: --resume PHASE puts it back at a phase of its
            runner (with --data merged into its phase data, e.g. '{"chargeId":"ch_..."}' found at the
            provider), after which a retry or \`idem complete\` finishes it (refused, changing nothing,
            when the phase is not its runner's or --data lacks what the phase needs); --answer STATUS
            saves a final answer (--body its JSON) that every retry then gets
  forget    delete a key before it expires, so that the same key is new again: only when its records
            show that nothing it did can be repeated (a saved 4xx, a claim whose work never started);
            refused for a saved success, a phases key past the start of its call, a key ever taken
            over or looked up, one waiting for a person or under a live lease. --effect-reversed: you
            reversed its effect (e.g. refunded the charge), so its next request may do it again
            (recorded as key.forget.effect-reversed; never past an open review or a live lease)
  settle and forget are recorded (who, when, what, why) in <schema>.admin_actions, as the admin
  console's actions are (the same library code, idem/admin)
  --database-url URL   default: $DATABASE_URL, else the embedded .idem/pgdata
  --schema NAME        default: idem
  --retention-hours H  as configured for the service (default: $IDEM_RETENTION_HOURS, else 24)
  --by NAME            who settles or forgets (default: $USER)
Exit codes: 0 done, 1 failure (no such key, no open review), 2 bad usage.`;

const OPTIONS = {
  ref: { type: "string" },
  state: { type: "string" },
  limit: { type: "string" },
  note: { type: "string" },
  reason: { type: "string" },
  by: { type: "string" },
  resume: { type: "string" },
  data: { type: "string" },
  answer: { type: "string" },
  body: { type: "string" },
  json: { type: "boolean" },
  "effect-reversed": { type: "boolean" },
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
  if (sub !== "inspect" && sub !== "list" && sub !== "settle" && sub !== "forget") {
    throw new CliError(`unknown subcommand "${sub}": inspect, list, settle or forget\n${USAGE}`, EXIT.usage);
  }
  const request =
    sub === "list" ? checkList(values) : sub === "settle" ? checkSettle(values, args) : undefined;
  const target = sub === "list" ? undefined : keyOf(values, args);
  const reason = values.reason?.trim();
  if (sub === "forget" && !reason)
    throw new CliError("--reason is required: say why the key is forgotten (it is recorded)", EXIT.usage);
  const { db, where, store } = await openStore({
    url: values["database-url"] ?? process.env.DATABASE_URL,
    schema: values.schema,
    retentionMs: retentionMs(values["retention-hours"]),
  });
  const ops = new Operations({ store, db });
  const by = values.by ?? process.env.USER ?? "unknown";
  try {
    if (sub === "inspect") {
      const k = await ops.findKey(target!);
      if (!k) throw new CliError(`no live key ${named(target!)} on ${where}`);
      if (values.json) printJson(k);
      else console.log(describe(k));
      return EXIT.ok;
    }
    if (sub === "list") {
      const { state, limit } = request as { state: string; limit: number };
      const list = await ops.listKeys(state as "needs_review" | "unfinished" | "expiring", { limit });
      if (values.json) printJson(list);
      else {
        for (const item of list) console.log(printable(line(item)));
        console.log(
          `${list.length} key(s) ${state === "needs_review" ? "waiting for a person" : state === "unfinished" ? "unfinished" : "expiring within the hour"} on ${where}`,
        );
      }
      return EXIT.ok;
    }
    if (sub === "forget") {
      try {
        const k = await ops.forget(target!, by, reason!, { effectReversed: values["effect-reversed"] });
        if (values.json) printJson(k);
        else
          console.log(
            printable(`forgot ${k.scope} ${k.key} (was ${k.state} at ${k.recoveryPoint}) by ${by}`),
          );
        return EXIT.ok;
      } catch (err) {
        if (err instanceof CannotForgetError) {
          throw new CliError(
            `${named(target!)}: ${err.message.replace("effect_reversed", "--effect-reversed")}`,
          );
        }
        if (err instanceof BadOperationRefError)
          throw new CliError(`no live key ${named(target!)} on ${where}`);
        throw err;
      }
    }
    try {
      const review = await ops.settle(target!, request as Settlement, by);
      if (values.json) printJson(review);
      else
        console.log(
          printable(`settled ${review.scope} ${review.key} by ${by}: ${JSON.stringify(review.settlement)}`),
        );
      return EXIT.ok;
    } catch (err) {
      if (err instanceof NoOpenReviewError)
        throw new CliError(`${err.message} (see idem keys list --state needs_review)`);
      if (err instanceof SettlementRefusedError) throw new CliError(`${err.message}; nothing was changed`);
      if (err instanceof BadOperationRefError)
        throw new CliError(`no live key ${named(target!)} on ${where}`);
      throw err;
    }
  } finally {
    await db.close();
  }
}

function named(ref: KeyRef): string {
  if ("ref" in ref) return `by the ref ${ref.ref}`;
  return `${JSON.stringify(ref.key)} of ${JSON.stringify(ref.scope)}`;
}

function keyOf(values: Values, args: string[]): KeyRef {
  if (values.ref !== undefined) {
    if (!values.ref.trim().startsWith("op_"))
      throw new CliError(`--ref ${values.ref} is not an operation_ref (they start with op_)`, EXIT.usage);
    return { ref: values.ref.trim() };
  }
  const [scope, key] = args;
  if (!scope || !key || args.length > 2)
    throw new CliError(`give <scope> <key>, or --ref <operation_ref>\n${USAGE}`, EXIT.usage);
  if (!isValidScope(scope))
    throw new CliError("the scope holds a control character (or is too long)", EXIT.usage);
  if (!isValidKey(key))
    throw new CliError(
      "the key must be 1 to 255 visible ASCII characters (no spaces or control characters)",
      EXIT.usage,
    );
  return { scope, key };
}

function checkList(values: Values): { state: string; limit: number } {
  // What a person is there for by default: the keys only they can settle.
  const state = values.state ?? "needs_review";
  if (state !== "needs_review" && state !== "unfinished" && state !== "expiring") {
    throw new CliError("--state takes needs_review, unfinished or expiring", EXIT.usage);
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
