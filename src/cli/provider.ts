import { type ProviderOptions, startProvider } from "../testing/provider.ts";
import { CliError, EXIT, parse } from "./shared.ts";

const USAGE = `usage: idem provider [--port N] [--host ADDR] [--seed N] [--latency-ms N|MIN-MAX]
                     [--decline-amounts A,B] [--decline-cards C,D]
                     [--timeout-rate P] [--error-rate P] [--drop-rate P] [--decline-rate P]
                     [--retention-ms N] [--webhook-url URL --webhook-secret whsec_...]

Runs the payment-provider simulator: POST /v1/charges with an Idempotency-Key (a repeat returns the
existing charge), GET /v1/charges lists every charge with the key it received, POST /v1/refunds refunds
one (keyed), and GET /v1/reports/charges?from=&to=&format=csv|json exports them for idem reconcile.
  --port N              default: 4100 (0: any free port)
  --host ADDR           default: 127.0.0.1
  --seed N              seed for random faults and charge ids (default: random; set it to repeat a run)
  --latency-ms N        added latency per charge, or MIN-MAX drawn per request (default: 0)
  --decline-amounts     amounts (minor units) that are always declined, comma-separated
  --decline-cards       card numbers or tokens that are always declined, comma-separated
  --timeout-rate P      probability 0..1 that a charge request hangs (nothing charged)
  --error-rate P        probability of a 500 or 503 (nothing charged)
  --drop-rate P         probability that the charge is made and the reply is lost
  --decline-rate P      probability of a decline
  --retention-ms N      how long a key and its charge are remembered (default: 86400000, 24 h)
  --webhook-url URL     POST each charge's events there (charge.pending, then charge.succeeded or
                        charge.failed), at least once, delayed, reordered, sometimes twice
  --webhook-secret S    the endpoint's signing secret (Stripe's scheme; PROVIDER_WEBHOOK_SECRET)
Per request, the header X-Fault: timeout|500|503|drop|decline forces a fault; POST /_sim/faults
{"rates": {...}, "next": [...]} changes them at run time. Stops on SIGINT or SIGTERM.
Exit codes: 0 stopped cleanly, 1 failure (e.g. the port is taken), 2 bad usage.`;

function numberList(flag: string, value: string | undefined): number[] | undefined {
  if (value === undefined) return undefined;
  const out = value.split(",").map((v) => Number(v.trim()));
  if (out.some((n) => !Number.isInteger(n)))
    throw new CliError(`${flag} takes whole numbers, comma-separated`, EXIT.usage);
  return out;
}

function rate(flag: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const p = Number(value);
  if (!(p >= 0 && p <= 1)) throw new CliError(`${flag} takes a probability from 0 to 1`, EXIT.usage);
  return p;
}

export async function providerCommand(argv: string[]): Promise<number> {
  const { values } = parse(
    argv,
    {
      port: { type: "string" },
      host: { type: "string" },
      seed: { type: "string" },
      "latency-ms": { type: "string" },
      "decline-amounts": { type: "string" },
      "decline-cards": { type: "string" },
      "timeout-rate": { type: "string" },
      "error-rate": { type: "string" },
      "drop-rate": { type: "string" },
      "decline-rate": { type: "string" },
      "retention-ms": { type: "string" },
      "webhook-url": { type: "string" },
      "webhook-secret": { type: "string" },
    },
    USAGE,
  );
  if (values.help) {
    console.log(USAGE);
    return EXIT.ok;
  }
  const port = Number(values.port ?? 4100);
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    throw new CliError("--port takes a port number", EXIT.usage);
  const seed = values.seed === undefined ? undefined : Number(values.seed);
  if (seed !== undefined && !Number.isInteger(seed))
    throw new CliError("--seed takes a whole number", EXIT.usage);
  let latencyMs: ProviderOptions["latencyMs"];
  const lat = values["latency-ms"];
  if (lat !== undefined) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(lat);
    if (!m) throw new CliError("--latency-ms takes N or MIN-MAX (milliseconds)", EXIT.usage);
    latencyMs = m[2] === undefined ? Number(m[1]) : [Number(m[1]), Math.max(Number(m[1]), Number(m[2]))];
  }
  const retention = values["retention-ms"];
  const retentionMs = retention === undefined ? undefined : Number(retention);
  if (retentionMs !== undefined && !(Number.isInteger(retentionMs) && retentionMs > 0))
    throw new CliError("--retention-ms takes a positive whole number of milliseconds", EXIT.usage);
  const webhookUrl = values["webhook-url"];
  const webhookSecret = values["webhook-secret"] ?? process.env.PROVIDER_WEBHOOK_SECRET;
  if (webhookUrl !== undefined && !webhookSecret)
    throw new CliError("--webhook-url needs --webhook-secret (or PROVIDER_WEBHOOK_SECRET)", EXIT.usage);
  const options: ProviderOptions = {
    port,
    retentionMs,
    host: values.host ?? "127.0.0.1",
    seed,
    latencyMs,
    declineAmounts: numberList("--decline-amounts", values["decline-amounts"]),
    declineCards: values["decline-cards"]?.split(",").map((c) => c.trim()),
    faults: {
      timeout: rate("--timeout-rate", values["timeout-rate"]),
      error: rate("--error-rate", values["error-rate"]),
      drop: rate("--drop-rate", values["drop-rate"]),
      decline: rate("--decline-rate", values["decline-rate"]),
    },
    hangMs: 60_000,
    webhooks: webhookUrl ? { url: webhookUrl, secret: webhookSecret!, seed } : undefined,
  };
  let provider: Awaited<ReturnType<typeof startProvider>>;
  try {
    provider = await startProvider(options);
  } catch (err) {
    throw new CliError(`cannot start the provider simulator: ${(err as Error).message}`);
  }
  console.log(`payment-provider simulator on ${provider.url} (seed ${seed}); Ctrl-C stops it`);
  await new Promise<void>((resolve) => {
    const stop = () => {
      process.off("SIGINT", stop);
      process.off("SIGTERM", stop);
      resolve();
    };
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
  await provider.close();
  console.log(`stopped; ${provider.charges().length} charge(s) made within the retention`);
  return EXIT.ok;
}
