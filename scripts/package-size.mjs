#!/usr/bin/env node
/**
 * The README's package sizes, measured and written, never typed: the tarball `npm pack` makes, and what
 * installing it alone adds to a project (idem and its dependencies).
 *
 *   node scripts/package-size.mjs    pack, install the tarball into a fresh temporary project, measure,
 *                                    and rewrite the README's block between <!-- package-size --> and
 *                                    <!-- /package-size -->
 *
 * The package test (test/package/consumer.slow.test.ts) measures the same with `measure` and fails
 * when the README's figures are more than 10 % off, saying to run this.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const README = join(ROOT, "README.md");
const BLOCK = /<!-- package-size -->([\s\S]*?)<!-- \/package-size -->/;

function bytesUnder(dir) {
  let total = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name);
    if (entry.isDirectory()) total += bytesUnder(p);
    else if (entry.isFile()) total += statSync(p).size;
  }
  return total;
}

/**
 * The sizes of a tarball and of a project where it alone was installed: bytes, and the packages it
 * brought (idem's dependencies).
 */
export function measure(tarball, project) {
  const lock = JSON.parse(readFileSync(join(project, "node_modules", ".package-lock.json"), "utf8"));
  const packages = Object.keys(lock.packages)
    .map((p) => p.replace(/^.*node_modules\//, ""))
    .filter((name) => name !== "idem")
    .sort();
  return {
    tarballBytes: statSync(tarball).size,
    installedBytes: bytesUnder(join(project, "node_modules")),
    dependencies: packages,
  };
}

const mb = (bytes) => `${(bytes / 1024 / 1024).toFixed(2)} MB`;

/** The README's sentence for these sizes. */
export function sentence(sizes) {
  return (
    `installing it adds ${mb(sizes.installedBytes)} (idem and the ${sizes.dependencies.length} packages it brings), ` +
    `and its tarball is ${mb(sizes.tarballBytes)} of built ESM JavaScript, type declarations and source maps`
  );
}

/** The sizes the README states: `{ installedMb, tarballMb }`, or undefined without the block. */
export function readmeSizes(text = readFileSync(README, "utf8")) {
  const block = BLOCK.exec(text)?.[1];
  const installed = block?.match(/adds ([\d.]+) MB/)?.[1];
  const tarball = block?.match(/tarball is ([\d.]+) MB/)?.[1];
  return installed && tarball ? { installedMb: Number(installed), tarballMb: Number(tarball) } : undefined;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const work = mkdtempSync(join(tmpdir(), "idem-size-"));
  try {
    const out = execFileSync("npm", ["pack", "--pack-destination", work, "--loglevel=error"], {
      cwd: ROOT,
      encoding: "utf8",
      maxBuffer: 16 * 1024 * 1024,
    });
    const tarball = join(work, out.trim().split("\n").at(-1));
    const project = join(work, "project");
    mkdirSync(project);
    writeFileSync(join(project, "package.json"), '{ "name": "size", "private": true, "type": "module" }\n');
    execFileSync("npm", ["install", tarball, "--no-audit", "--no-fund", "--loglevel=error"], {
      cwd: project,
    });
    const sizes = measure(tarball, project);
    const text = readFileSync(README, "utf8");
    if (!BLOCK.test(text)) throw new Error("README.md has no <!-- package-size --> block");
    writeFileSync(
      README,
      text.replace(BLOCK, `<!-- package-size -->${sentence(sizes)}<!-- /package-size -->`),
    );
    console.log(`README.md: ${sentence(sizes)} (${sizes.dependencies.join(", ")})`);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
