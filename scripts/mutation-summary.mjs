// Prints the per-file mutation scores of reports/mutation/mutation.json as a Markdown table (for
// reports/mutation/SUMMARY.md): score = (killed + timed out) / (all valid mutants, uncovered included).
import { readFileSync } from "node:fs";

const report = JSON.parse(readFileSync(process.argv[2] ?? "reports/mutation/mutation.json", "utf8"));
const rows = [];
const total = { killed: 0, survived: 0, noCov: 0, ignored: 0, all: 0 };
for (const [file, { mutants }] of Object.entries(report.files).sort()) {
  const n = { killed: 0, survived: 0, noCov: 0, ignored: 0, all: 0 };
  for (const m of mutants) {
    if (m.status === "CompileError" || m.status === "RuntimeError") continue;
    if (m.status === "Ignored") {
      n.ignored++;
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
console.log("| module | score | killed | survived | no coverage | ignored (equivalent) |");
console.log("|---|---:|---:|---:|---:|---:|");
for (const [file, n] of rows)
  console.log(`| ${file} | ${pct(n)} | ${n.killed} | ${n.survived} | ${n.noCov} | ${n.ignored} |`);
console.log(
  `| **all** | ${pct(total)} | ${total.killed} | ${total.survived} | ${total.noCov} | ${total.ignored} |`,
);
