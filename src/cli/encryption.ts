import { SealingKeyPromotionError } from "../postgres/secrets/sealing-keys.ts";
import { CliError, EXIT, openStore, parse, printable } from "./shared.ts";

const USAGE = `usage: idem encryption promote <key-id>   [--database-url URL] [--schema NAME]

Rotating the encryption key (IDEM_ENCRYPTION_KEYS) without downtime, step 2: seal new values with
<key-id> on every instance sharing the database. Refused, naming them, while a running instance (one
seen in the last minute) cannot open <key-id>: add the key to every instance's IDEM_ENCRYPTION_KEYS
first (step 1). This command's own IDEM_ENCRYPTION_KEYS must list <key-id> too.
  --database-url URL   default: $DATABASE_URL, else the embedded .idem/pgdata
  --schema NAME        default: idem
Exit codes: 0 promoted, 1 refused (some instance lacks the key), 2 bad usage.`;

const OPTIONS = {
  "database-url": { type: "string" },
  schema: { type: "string" },
} as const;

export async function encryptionCommand(argv: string[]): Promise<number> {
  const { values, positionals } = parse(argv, OPTIONS, USAGE);
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  const [sub, id, ...extra] = positionals;
  if (sub !== "promote" || !id || extra.length > 0) throw new CliError(USAGE, EXIT.usage);
  if (!process.env.IDEM_ENCRYPTION_KEYS?.trim()) {
    throw new CliError(`IDEM_ENCRYPTION_KEYS is not set: set it as on the service, with "${id}" in it`);
  }
  const { db, where, store } = await openStore({
    url: values["database-url"] ?? process.env.DATABASE_URL,
    schema: values.schema,
    retentionMs: 3_600_000, // unused here: a store needs one
  });
  try {
    const { previous } = await store.promoteSealingKey(id);
    console.log(
      printable(
        `promoted sealing key ${id} on ${where} (was ${previous ?? "none"}): instances seal with it within 5 s`,
      ),
    );
    return EXIT.ok;
  } catch (err) {
    if (err instanceof SealingKeyPromotionError) throw new CliError(err.message);
    throw err;
  } finally {
    await store.retire().catch(() => {});
    await db.close();
  }
}
