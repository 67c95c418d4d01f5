import { availableParallelism } from "node:os";
import { defineConfig } from "vitest/config";

/**
 * Two tiers, one project each (both run in CI, .ci/run):
 *   fast  `npm test`: every test/**\/*.test.ts but the slow ones: the unit, store and protocol suites
 *         (PGlite, and the real server when DATABASE_URL is set), a few minutes;
 *   slow  `npm run test:slow`: files named *.slow.test.ts: chaos, the packed tarball installed from the
 *         registry, soaks, private clusters (Patroni, Citus, PgBouncer, a 3-node NATS), restarts.
 * A file that runs for more than about a minute, or brings up infrastructure of its own, is named
 * *.slow.test.ts. `npx vitest run <file>` runs a file of either tier.
 */
const SLOW = "test/**/*.slow.test.ts";

export default defineConfig({
  resolve: { conditions: ["source"] },
  ssr: { resolve: { conditions: ["source"] } },
  test: {
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    // The MCP SDK's HTTP client imports eventsource-parser, whose `source` condition (the one idem's
    // tests resolve with, and pass to Node) points at TypeScript that Node will not load from
    // node_modules: those modules go through Vite, which compiles it.
    server: {
      deps: {
        inline: [
          /@modelcontextprotocol\/sdk\/dist\/esm\/client\/(sse|streamableHttp)\.js/,
          "eventsource-parser",
        ],
      },
    },
    // At least two files at a time. Vitest's default (one fewer than the cores) runs one file at a time
    // on a 2-core machine, while most files spend their time waiting on PostgreSQL, the brokers, child
    // processes and private clusters. Every file owns its databases, ports and queues, so they may
    // overlap: on 2 cores the whole suite took 487 s with two, 987 s with one (2 Dec 2026).
    maxWorkers: Math.max(2, availableParallelism() - 1),
    projects: [
      { extends: true, test: { name: "fast", include: ["test/**/*.test.ts"], exclude: [SLOW] } },
      { extends: true, test: { name: "slow", include: [SLOW] } },
    ],
  },
});
