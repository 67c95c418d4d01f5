// Prints the per-file mutation scores of reports/mutation/mutation.json as a Markdown table (for
// reports/mutation/SUMMARY.md): score = (killed + timed out) / (all valid mutants, uncovered included).
// Ignored mutants are left out of the score and counted apart: static ones (ignoreStatic) and the
// equivalent ones disabled in the code with a reason.
import { readFileSync } from "node:fs";

const report = JSON.parse(readFileSync(process.argv[2] ?? "reports/mutation/mutation.json", "utf8"));
const rows = [];
const total = { killed: 0, survived: 0, noCov: 0, static: 0, ignored: 0, all: 0 };
for (const [file, { mutants }] of Object.entries(report.files).sort()) {
  const n = { killed: 0, survived: 0, noCov: 0, static: 0, ignored: 0, all: 0 };
  for (const m of mutants) {
    if (m.status === "CompileError" || m.status === "RuntimeError") continue;
    if (m.status === "Ignored") {
      if (/static/i.test(m.statusReason ?? "")) n.static++;
      else n.ignored++;
      continue;
    }
    n.all++;
    if (m.status === "Killed" || m.status === "Timeout") n.killed++;
    else if (m.status === "NoCoverage") n.noCov++;
    else n.survived++;
  }
  for (const k of Object.keys(total)) total[k] += n[k];
  rows.push([file, n]);
}
const pct = (n) => (n.all === 0 ? "n/a" : `${((100 * n.killed) / n.all).toFixed(1)}%`);
console.log(
  "| module | score | killed | survived | no coverage | equivalent (disabled) | static (not run) |",
);
console.log("|---|---:|---:|---:|---:|---:|---:|");
const line = (name, n) =>
  `| ${name} | ${pct(n)} | ${n.killed} | ${n.survived} | ${n.noCov} | ${n.ignored} | ${n.static} |`;
for (const [file, n] of rows) console.log(line(file, n));
console.log(line("**all**", total));
