// idem reads its SQL migrations from its package's sql/ folder at run time, which a bundler cannot
// follow: leave it (and the drivers) to Node, as installed packages.
/** @type {import('next').NextConfig} */
export default {
  serverExternalPackages: ["idem", "pg", "postgres"],
  turbopack: { root: new URL(".", import.meta.url).pathname },
};
