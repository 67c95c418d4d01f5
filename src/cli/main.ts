/**
 * `idem`: the command line. Each command lives in its own file and is loaded only when called.
 */
import { readFileSync } from "node:fs";
import { installTelemetry } from "../observability/install.ts";
import { CliError, EXIT, printable } from "./shared.ts";

// The relay, the completer and the sweep report to OpenTelemetry when it is installed.
installTelemetry();

/** The installed package's version (package.json is two folders up, from src/cli and from dist/cli). */
function version(): string {
  const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"));
  return String(pkg.version);
}

const COMMANDS: Record<string, { summary: string; run: () => Promise<(argv: string[]) => Promise<number>> }> =
  {
    migrate: {
      summary: "apply idem's SQL migrations",
      run: async () => (await import("./migrate.ts")).migrateCommand,
    },
    provider: {
      summary: "run the payment-provider simulator",
      run: async () => (await import("./provider.ts")).providerCommand,
    },
    complete: {
      summary: "finish phases-mode keys abandoned mid-way",
      run: async () => (await import("./complete.ts")).completeCommand,
    },
    relay: {
      summary: "publish outbox events to RabbitMQ, NATS or a webhook",
      run: async () => (await import("./relay.ts")).relayCommand,
    },
    verify: {
      summary: "run intents with faults against an API and check exactly-once",
      run: async () => (await import("./verify.ts")).verifyCommand,
    },
    sweep: {
      summary: "drop expired key partitions (retention)",
      run: async () => (await import("./sweep.ts")).sweepCommand,
    },
    keys: {
      summary: "inspect, list and settle idempotency keys (support cases)",
      run: async () => (await import("./keys.ts")).keysCommand,
    },
    encryption: {
      summary: "promote a new encryption key once every instance opens it",
      run: async () => (await import("./encryption.ts")).encryptionCommand,
    },
    audit: {
      summary: "check invariants on a database; exit 1 on violations",
      run: async () => (await import("./audit.ts")).auditCommand,
    },
    reconcile: {
      summary: "compare the provider's charges report with your records",
      run: async () => (await import("./reconcile.ts")).reconcileCommand,
    },
  };

export const USAGE = `usage: idem <command> [options]   (idem <command> --help for its options)

${Object.entries(COMMANDS)
  .map(([name, c]) => `  ${name.padEnd(10)} ${c.summary}`)
  .join("\n")}

Every command reads DATABASE_URL (default: the embedded PGlite in .idem/pgdata, which needs
@electric-sql/pglite installed). idem --version prints the version.
Exit codes: 0 success, 1 failure, 2 bad usage.`;

export async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === "--version" || name === "-v" || name === "version") {
    console.log(version());
    return EXIT.ok;
  }
  if (!name) {
    console.error(USAGE); // bad usage: to stderr, so that a script's output stays clean
    return EXIT.usage;
  }
  if (name === "--help" || name === "-h" || name === "help") {
    console.log(USAGE);
    return EXIT.ok;
  }
  const command = COMMANDS[name];
  if (!command) {
    console.error(`idem: unknown command "${name}" (try: idem --help)`);
    return EXIT.usage;
  }
  try {
    return await (await command.run())(rest);
  } catch (err) {
    if (err instanceof CliError) {
      console.error(`idem: ${printable(err.message, { lines: true })}`);
      return err.exitCode;
    }
    console.error(`idem: ${printable(String((err as Error)?.message ?? err), { lines: true })}`);
    return EXIT.failure;
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  });
}
