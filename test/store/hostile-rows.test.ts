/**
 * Stored rows altered by hand or by a bug (issue 29): a finished key whose status, headers or body is
 * unusable gets a 503 problem answer with Retry-After and the next-step fields, in atomic mode and in
 * phases mode alike: never a 500, never the damaged bytes, and never the work run again.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { idempotency, idempotentPhases } from "../../src/http/web.ts";
import { definePhases, jsonResponse } from "../../src/postgres/index.ts";
import { migrate } from "../../src/postgres/schema/migrate.ts";
import { PostgresStore } from "../../src/postgres/store.ts";
import { backends, type OpenDb } from "../helpers/db.ts";

const damages: Array<[string, string, unknown[]]> = [
  ["status 0", "status = 0", []],
  ["status 999", "status = 999", []],
  ["headers not a list", 'headers = \'{"content-type":"text/plain"}\'::jsonb', []],
  ["a header not a pair", "headers = '[[\"content-type\"]]'::jsonb", []],
  ["a header value not a string", "headers = '[[\"content-type\", 5]]'::jsonb", []],
  ["a header name with CR/LF", "headers = $2::jsonb", [JSON.stringify([["x-a\r\nset-cookie", "s=1"]])]],
  [
    "a header value with CR/LF",
    "headers = $2::jsonb",
    [JSON.stringify([["location", "/a\r\nset-cookie: s=1"]])],
  ],
  [
    "a body that cannot be opened",
    "body = $2",
    [Buffer.concat([Buffer.from([0xff, 0x69, 0x64, 0x6d, 0x01, 0x02, 0x6b, 0x39]), Buffer.alloc(40)])],
  ],
];

describe.each(backends)("hostile stored rows on $name", (backend) => {
  let open: OpenDb;
  let store: PostgresStore;
  let runs = 0;
  let atomic: (r: Request) => Promise<Response>;
  let phases: (r: Request) => Promise<Response>;

  beforeAll(async () => {
    open = await backend.open();
    await migrate(open.db);
    store = await PostgresStore.open(open.db);
    const scope = () => "acct_1";
    const pay = idempotency(
      async () => {
        runs++;
        return new Response(JSON.stringify({ id: runs }), {
          status: 201,
          headers: { "content-type": "application/json" },
        });
      },
      { store, scope },
    );
    atomic = (r) => pay(r, {});
    const runner = definePhases<{ n: number }, Record<string, never>>({
      store,
      name: `hostile-${randomUUID().slice(0, 8)}`,
      phases: {
        started: {
          local: async () => {
            runs++;
            return { response: jsonResponse(201, { id: runs }) };
          },
        },
      },
    });
    const phased = idempotentPhases({ runner, scope, input: (_r, body) => body as { n: number } });
    phases = (r) => phased(r, {});
  });
  afterAll(async () => {
    await open?.close();
  });

  const post = (key: string) =>
    new Request("http://x/v1/payments", {
      method: "POST",
      headers: { "content-type": "application/json", "idempotency-key": key },
      body: '{"n":1}',
    });

  for (const mode of ["atomic", "phases"] as const) {
    it.each(damages)(
      `${mode}: %s answers 503 with the next step, runs nothing`,
      async (_name, set, params) => {
        const route = mode === "atomic" ? atomic : phases;
        const key = randomUUID();
        expect((await route(post(key))).status).toBe(201);
        const updated = await open.db.query(`UPDATE idem.keys SET ${set} WHERE key = $1`, [key, ...params]);
        expect(updated.rowCount ?? (updated as { count?: number }).count ?? 1).toBeGreaterThan(0);
        const before = runs;
        const res = await route(post(key));
        expect(res.status).toBe(503);
        expect(res.headers.get("retry-after")).toMatch(/^\d+$/);
        expect(res.headers.get("content-type")).toContain("application/problem+json");
        const problem = (await res.json()) as Record<string, unknown>;
        expect(problem.retry_same_key).toBe(true);
        expect(problem.safe_new_key).toBe(false);
        expect(typeof problem.operation_ref).toBe("string");
        expect(runs).toBe(before);
      },
    );
  }
});
