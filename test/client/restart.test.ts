/**
 * A real crash: a child process sends a payment and is killed (SIGKILL) while the server works on it.
 * A new client over the same file store finds the intent and finishes it with the same key.
 */
import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, it } from "vitest";
import { FileIntentStore } from "../../src/client/file-store.ts";
import { createClient } from "../../src/client/index.ts";
import { startPaymentServer } from "./helpers.ts";

it("a process killed mid-request is resumed after the restart with the same key, charged once", async () => {
  const server = await startPaymentServer(["charge-and-drop"]);
  const dir = await mkdtemp(join(tmpdir(), "idem-crash-"));
  try {
    const child = spawn(
      process.execPath,
      [
        "--import",
        "tsx",
        fileURLToPath(new URL("./fixtures/crash-child.ts", import.meta.url)),
        server.url,
        dir,
      ],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
    });
    // The server charges, then the client process dies before any reply.
    server.onRequest = () => child.kill("SIGKILL");
    const exit = await new Promise<NodeJS.Signals | null>((resolve) =>
      child.on("exit", (_c, s) => resolve(s)),
    );
    expect(exit).toBe("SIGKILL");
    const keyBeforeCrash = out.split("\n")[0];
    expect(out).not.toContain("unreachable");

    const restarted = createClient({ baseUrl: server.url, store: new FileIntentStore({ dir }) });
    const [pending] = await restarted.pending();
    expect(pending?.id).toBe("checkout-crash");
    expect(pending?.key).toBe(keyBeforeCrash);
    expect(pending?.attempts).toBe(1); // counted before it was sent, so the kill did not lose it
    const res = await restarted.resume(pending!);
    expect(res.status).toBe(201);
    expect(server.seen.map((r) => r.key)).toEqual([keyBeforeCrash, keyBeforeCrash]);
    expect(server.totalCharges()).toBe(1);
    expect(await restarted.store.get("checkout-crash")).toMatchObject({ status: "done", attempts: 2 });
  } finally {
    await server.close();
    await rm(dir, { recursive: true, force: true });
  }
});
