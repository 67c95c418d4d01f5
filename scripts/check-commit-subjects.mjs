#!/usr/bin/env node
/**
 * Commit subjects: at most 72 characters, one topic (no `;` list). Used two ways:
 *   node scripts/check-commit-subjects.mjs --file .git/COMMIT_EDITMSG   the commit-msg hook (.githooks/)
 *   node scripts/check-commit-subjects.mjs --since <rev>                CI, over every commit after <rev>
 * Two rules do not need commitlint (its rules and parser are built around Conventional Commits).
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

const MAX = 72;
/** Commits before this one were written before the rule; CI checks only what came after. */
const RULE_SINCE = "ca172b7";

function problems(subject) {
  const out = [];
  if (subject.length > MAX) out.push(`${subject.length} characters (at most ${MAX})`);
  if (subject.includes(";")) out.push("a ';' list (one topic per commit)");
  return out;
}

const [flag, value] = process.argv.slice(2);
let subjects;
if (flag === "--file") {
  const first = readFileSync(value, "utf8")
    .split("\n")
    .find((l) => !l.startsWith("#"));
  subjects = [first ?? ""];
} else if (flag === "--since") {
  const rev = value ?? RULE_SINCE;
  try {
    execFileSync("git", ["cat-file", "-e", `${rev}^{commit}`], { stdio: "ignore" });
  } catch {
    console.log(`commit subjects: ${rev} is not in this clone (shallow?); nothing checked`);
    process.exit(0);
  }
  const log = execFileSync("git", ["log", "--no-merges", "--format=%s", `${rev}..HEAD`], {
    encoding: "utf8",
  });
  subjects = log.split("\n").filter(Boolean);
} else {
  console.error("usage: check-commit-subjects.mjs --file MSGFILE | --since REV");
  process.exit(2);
}

let bad = 0;
for (const s of subjects) {
  const p = problems(s);
  if (p.length === 0) continue;
  bad++;
  console.error(`commit subject "${s}": ${p.join(", ")}`);
}
if (flag === "--since") console.log(`commit subjects: ${subjects.length} checked, ${bad} over the rules`);
process.exit(bad ? 1 : 0);
