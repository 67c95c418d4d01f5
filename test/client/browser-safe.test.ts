/**
 * `idem/client` runs in browsers: nothing reachable from its entry imports a Node built-in.
 */
import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { expect, it } from "vitest";

const entry = fileURLToPath(new URL("../../src/client/index.ts", import.meta.url));

function reachable(file: string, seen = new Set<string>(), bare = new Set<string>()) {
  if (seen.has(file)) return { seen, bare };
  seen.add(file);
  const source = readFileSync(file, "utf8");
  // Type-only imports are erased from the JavaScript a browser loads (the optional OpenTelemetry API's types).
  for (const m of source.matchAll(/^(?:import|export)(?!\s+type\s)[^;]*?from\s+"([^"]+)"/gms)) {
    const spec = m[1]!;
    if (spec.startsWith(".")) reachable(resolve(dirname(file), spec), seen, bare);
    else bare.add(spec);
  }
  return { seen, bare };
}

it("imports no node: module and no package but cockatiel from the browser entry", () => {
  const { seen, bare } = reachable(entry);
  expect([...seen].some((f) => f.endsWith("file-store.ts") || f.endsWith("postgres-store.ts"))).toBe(false);
  expect([...bare]).toEqual(["cockatiel"]);
});
