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

/** The sidebar's and the nav's pages must exist: VitePress checks links in pages, not these. */
function page(link: string): string {
  const file = link.endsWith("/") ? `${link}index.md` : `${link}.md`;
  if (!existsSync(resolve(DOCS, `.${file}`))) throw new Error(`docs/.vitepress/config.mts: no page ${file}`);
  return link;
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
      { text: "Getting started", link: page("/getting-started") },
      { text: "Reference", link: page("/reference") },
      { text: "Decisions", link: page("/decisions/") },
    ],
    sidebar: [
      {
        text: "Start",
        items: [
          { text: "Getting started", link: page("/getting-started") },
          { text: "The HTTP contract", link: page("/contract") },
        ],
      },
      {
        text: "Adapters",
        items: [
          { text: "Hono", link: page("/hono") },
          { text: "Express", link: page("/express") },
          { text: "Fastify", link: page("/fastify") },
          { text: "node:http", link: page("/node") },
          { text: "Web-standard handlers", link: page("/web") },
          { text: "NestJS", link: page("/nestjs") },
          { text: "ORMs: Drizzle, Kysely, Knex, Prisma", link: page("/orms") },
          { text: "Serverless and edge", link: page("/serverless") },
          { text: "MCP tool calls", link: page("/mcp") },
        ],
      },
      {
        text: "Modes",
        items: [
          { text: "Atomic", link: page("/atomic") },
          { text: "Single-statement", link: page("/single-statement") },
          { text: "Phases", link: page("/phases") },
          { text: "Sagas", link: page("/sagas") },
        ],
      },
      {
        text: "Beyond HTTP",
        items: [
          { text: "Messaging: outbox, relay, inbox", link: page("/messaging") },
          { text: "Webhooks", link: page("/webhooks") },
          { text: "The client", link: page("/client") },
        ],
      },
      {
        text: "Running it",
        items: [
          { text: "Operations", link: page("/operations") },
          { text: "Observability", link: page("/observability") },
          { text: "Reconcile", link: page("/reconcile") },
          { text: "Verify your API", link: page("/verify") },
          { text: "The reference service", link: page("/reference-service") },
          { text: "Benchmarks", link: page("/benchmarks") },
        ],
      },
      {
        text: "Reference",
        items: [
          { text: "Entry points, options, CLI", link: page("/reference") },
          { text: "Decisions and their figures", link: page("/decisions/") },
        ],
      },
    ],
  },
});
