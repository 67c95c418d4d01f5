/**
 * The docs site: `npm run docs:build` builds docs/ with VitePress into .cache/docs-site, and fails on a
 * dead link (VitePress checks every link between pages). A link that leaves docs/ (`../examples/web.ts`,
 * `../README.md`) reads well on GitHub, where the pages are read too; on the site it becomes the file's
 * address in the repository, and the build fails when that file does not exist.
 */
import { existsSync } from "node:fs";
import { dirname, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { defineConfig } from "vitepress";

const DOCS = fileURLToPath(new URL("..", import.meta.url));
const ROOT = resolve(DOCS, "..");
const REPOSITORY = "https://github.com/idem-dev/idem/blob/main";

/** The page's link to a repository file outside docs/, as the file's address in the repository. */
function outsideDocs(href: string, page: string): string | undefined {
  if (/^[a-z]+:|^#|^\//i.test(href)) return undefined;
  const [path = "", hash] = href.split("#");
  const target = resolve(DOCS, dirname(page), decodeURIComponent(path));
  if (!relative(DOCS, target).startsWith("..")) return undefined;
  const inRepo = relative(ROOT, target);
  if (inRepo.startsWith("..") || !existsSync(target))
    throw new Error(`${page}: dead link to ${href} (no such file in the repository)`);
  return `${REPOSITORY}/${inRepo}${hash ? `#${hash}` : ""}`;
}

export default defineConfig({
  title: "idem",
  description: "Side effects exactly once over networks that deliver at least once, on PostgreSQL.",
  outDir: "../.cache/docs-site",
  cacheDir: "../.cache/vitepress",
  cleanUrls: true,
  lastUpdated: false,
  markdown: {
    config(md) {
      md.core.ruler.push("idem-outside-docs", (state) => {
        const page = relative(DOCS, state.env.path ?? "");
        for (const token of state.tokens) {
          for (const child of token.children ?? []) {
            if (child.type !== "link_open") continue;
            const href = child.attrGet("href");
            const repo = href ? outsideDocs(href, page) : undefined;
            if (repo) child.attrSet("href", repo);
          }
        }
      });
    },
  },
  themeConfig: {
    search: { provider: "local" },
    outline: [2, 3],
    nav: [
      { text: "Getting started", link: "/getting-started" },
      { text: "Reference", link: "/reference" },
      { text: "Decisions", link: "/decisions/" },
    ],
    sidebar: [
      {
        text: "Start",
        items: [
          { text: "Getting started", link: "/getting-started" },
          { text: "The HTTP contract", link: "/contract" },
        ],
      },
      {
        text: "Adapters",
        items: [
          { text: "Hono", link: "/hono" },
          { text: "Express", link: "/express" },
          { text: "Fastify", link: "/fastify" },
          { text: "node:http", link: "/node" },
          { text: "Web-standard handlers", link: "/web" },
          { text: "NestJS", link: "/nestjs" },
          { text: "ORMs: Drizzle, Kysely, Knex, Prisma", link: "/orms" },
          { text: "Serverless and edge", link: "/serverless" },
          { text: "MCP tool calls", link: "/mcp" },
        ],
      },
      {
        text: "Modes",
        items: [
          { text: "Atomic", link: "/atomic" },
          { text: "Single-statement", link: "/single-statement" },
          { text: "Phases", link: "/phases" },
          { text: "Sagas", link: "/sagas" },
        ],
      },
      {
        text: "Beyond HTTP",
        items: [
          { text: "Messaging: outbox, relay, inbox", link: "/messaging" },
          { text: "Webhooks", link: "/webhooks" },
          { text: "The client", link: "/client" },
        ],
      },
      {
        text: "Running it",
        items: [
          { text: "Operations", link: "/operations" },
          { text: "Observability", link: "/observability" },
          { text: "Reconcile", link: "/reconcile" },
          { text: "Verify your API", link: "/verify" },
          { text: "The reference service", link: "/reference-service" },
          { text: "Benchmarks", link: "/benchmarks" },
        ],
      },
      {
        text: "Reference",
        items: [
          { text: "Entry points, options, CLI", link: "/reference" },
          { text: "Decisions and their figures", link: "/decisions/" },
        ],
      },
    ],
  },
});
