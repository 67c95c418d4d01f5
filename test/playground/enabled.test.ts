/**
 * The playground pays as the demo account without an API key, so it is served only where the demo
 * accounts exist: on the embedded database or with IDEM_DEMO=1. On a real server without IDEM_DEMO it is
 * not there at all, and the OpenAPI document does not name it.
 */
import { describe, expect, it } from "vitest";
import { start } from "../../app/main.ts";
import { DATABASE_URL, freshDatabase, sayWhySkippedWithoutServer } from "../helpers/db.ts";

sayWhySkippedWithoutServer();

describe.skipIf(!DATABASE_URL)("the playground is served only with the demo accounts", () => {
  const env = { PORT: "0", PROVIDER_PORT: "0", LOG_LEVEL: "silent" };

  it.each([
    { demo: undefined, served: false },
    { demo: "1", served: true },
  ])("on a real PostgreSQL server with IDEM_DEMO=$demo: served $served", async ({ demo, served }) => {
    const fresh = await freshDatabase();
    const svc = await start({ ...env, DATABASE_URL: fresh.url, ...(demo ? { IDEM_DEMO: demo } : {}) });
    try {
      const base = `http://127.0.0.1:${svc.port}`;
      const page = await fetch(`${base}/`);
      expect(page.status).toBe(served ? 200 : 404);
      if (served) expect(page.headers.get("content-type")).toMatch(/^text\/html/);
      else await page.body?.cancel();
      const pay = await fetch(`${base}/playground/api/pay`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ key: "k", amount_cents: 100 }),
      });
      expect(pay.status).toBe(served ? 200 : 404);
      await pay.body?.cancel();
      const state = await fetch(`${base}/playground/api/state`);
      expect(state.status).toBe(served ? 200 : 404);
      await state.body?.cancel();
      const doc = (await (await fetch(`${base}/openapi.json`)).json()) as { paths: Record<string, unknown> };
      expect("/playground/api/pay" in doc.paths).toBe(served);
    } finally {
      await svc.stop();
      await fresh.drop();
    }
  });
});
