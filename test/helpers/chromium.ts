/**
 * Debian's Chromium through playwright-core, for the browser tests: a headless persistent context in a
 * profile of its own, and the one page it opens. Never downloads a browser: without one at
 * CHROMIUM_PATH (default /usr/bin/chromium) `haveChromium` is false and the tests skip, except in CI.
 */
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type BrowserContext, chromium, type Page } from "playwright-core";

export const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
export const haveChromium = existsSync(CHROMIUM);
if (!haveChromium && process.env.CI) {
  throw new Error(`CI=true but there is no Chromium at ${CHROMIUM}: apt-get install chromium`);
}

export interface OpenBrowser {
  context: BrowserContext;
  page: Page;
  close(): Promise<void>;
}

/** Launch headless Chromium with a fresh profile; `close()` ends it and deletes the profile. */
export async function openChromium(viewport = { width: 1400, height: 1000 }): Promise<OpenBrowser> {
  const profile = mkdtempSync(join(tmpdir(), "idem-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--no-first-run",
      "--disable-background-networking",
    ],
    viewport,
  });
  const page = context.pages()[0] ?? (await context.newPage());
  return {
    context,
    page,
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}
