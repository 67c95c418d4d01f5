/**
 * The reference service's memory on the embedded database (PGlite): RSS of the service process at
 * idle after start-up, and its peak under keyed payments, as `npm start` runs it. Run it with
 * `npx tsx bench/embedded-memory.ts` (it starts and stops the service itself, on free ports and a
 * temporary data directory). Prints one line of figures; `npm run bench` includes it.
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

function statusKb(pid: number, field: "VmRSS" | "VmHWM"): number {
  const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return Number(m?.[1] ?? 0);
}

export async function measureEmbeddedMemory(
  o: { payments?: number; concurrency?: number; env?: Record<string, string> } = {},
) {
  const dir = mkdtempSync(join(tmpdir(), "idem-mem-"));
  const child = spawn(process.execPath, ["--conditions=source", "--import", "tsx", "app/main.ts"], {
    env: {
      ...process.env,
      DATABASE_URL: "",
      PORT: "0",
      PROVIDER_PORT: "0",
      IDEM_DATA_DIR: join(dir, "pgdata"),
      LOG_LEVEL: "warn",
      ...o.env,
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
  try {
    const url = await new Promise<string>((resolve, reject) => {
      let out = "";
      child.stdout!.on("data", (d) => {
        out += d;
        const m = /on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
        if (m) resolve(m[1]!);
      });
      child.once("exit", (code) => reject(new Error(`the service exited with ${code}`)));
    });
    await new Promise((r) => setTimeout(r, 3_000));
    const idleKb = statusKb(child.pid!, "VmRSS");
    const total = o.payments ?? 2_000;
    let next = 0;
    const started = performance.now();
    const worker = async () => {
      while (next < total) {
        next++;
        const res = await fetch(`${url}/v1/payments`, {
          method: "POST",
          headers: {
            authorization: "Bearer sk_test_demo_1",
            "idempotency-key": randomUUID(),
            "content-type": "application/json",
          },
          body: JSON.stringify({ amount_cents: 100, currency: "eur" }),
        });
        await res.arrayBuffer();
        if (res.status !== 201) throw new Error(`payment answered ${res.status}`);
      }
    };
    await Promise.all(Array.from({ length: o.concurrency ?? 8 }, worker));
    const seconds = (performance.now() - started) / 1000;
    const afterKb = statusKb(child.pid!, "VmRSS");
    const peakKb = statusKb(child.pid!, "VmHWM");
    return {
      idleMb: idleKb / 1024,
      afterMb: afterKb / 1024,
      peakMb: peakKb / 1024,
      paymentsPerSecond: total / seconds,
    };
  } finally {
    child.kill("SIGTERM");
    await new Promise((r) => child.once("exit", r));
    rmSync(dir, { recursive: true, force: true });
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const r = await measureEmbeddedMemory();
  console.log(
    `embedded PGlite service: RSS idle ${r.idleMb.toFixed(0)} MB, after 2,000 payments ${r.afterMb.toFixed(0)} MB, ` +
      `peak ${r.peakMb.toFixed(0)} MB (${r.paymentsPerSecond.toFixed(0)} payments/s)`,
  );
}
