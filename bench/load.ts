/**
 * In-process load for the store benchmarks (sealing.ts, otel.ts): `n` calls of `fn`, `concurrency` at a
 * time, and what they cost. Load that crosses HTTP comes from its own process instead (wrk, compare/).
 */

/** Requests/s, and this process's CPU µs per call. */
export async function load(
  n: number,
  concurrency: number,
  fn: (i: number) => Promise<unknown>,
): Promise<{ rps: number; cpuUs: number }> {
  let next = 0;
  const cpu = process.cpuUsage();
  const t = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let i = next++; i < n; i = next++) await fn(i);
    }),
  );
  const ms = performance.now() - t;
  const used = process.cpuUsage(cpu);
  return { rps: (n / ms) * 1000, cpuUs: (used.user + used.system) / n };
}
