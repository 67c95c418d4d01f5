/**
 * A service that restarts in two seconds must not use up a call's attempts while most of its deadline
 * is left: with the default options, attempts refused before anything was sent do not count, so the
 * call reaches the service once it is back and gets its answer.
 */
import { createServer, type Server } from "node:http";
import { afterEach, expect, it } from "vitest";
import { createClient } from "../../src/client/index.ts";
import { infraPorts } from "../infra/common.ts";

let server: Server | undefined;
afterEach(async () => {
  server?.closeAllConnections();
  await new Promise<void>((r) => (server ? server.close(() => r()) : r()));
});

it("a 2 s restart: the call keeps trying within its deadline and gets the answer", async () => {
  // A free port, left closed for two seconds (connection refused), then served. It comes from the
  // infrastructure range, below the kernel's ephemeral ports: a port 0 probe's port could be handed to
  // another process's socket on a busy machine before the restart listens on it (seen: EADDRINUSE).
  const [port] = await infraPorts(1);
  setTimeout(() => {
    server = createServer((_req, res) =>
      res.writeHead(201, { "content-type": "application/json" }).end("{}"),
    );
    server.listen(port, "127.0.0.1");
  }, 2_000);
  const attempts: number[] = [];
  const client = createClient({
    budget: false, // this test is about attempts, not the shared budget
    breaker: false,
    // Short waits (a tenth of each ceiling): five counted attempts would all be spent in 0.6 s.
    retry: { random: () => 0.1 },
    on: { attempt: (e) => attempts.push(e.attempt) },
  });
  const started = Date.now();
  const res = await client.post(`http://127.0.0.1:${port}/v1/payments`, {});
  expect(res.status).toBe(201);
  expect(Date.now() - started).toBeGreaterThanOrEqual(1_900);
  expect(attempts.length).toBeGreaterThan(1);
}, 40_000);
