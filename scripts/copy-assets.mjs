// The files of src/ that tsc does not emit but the built package reads at run time: the operations
// console's page, script and style (src/admin/console/, served by idem/admin's adminConsole).
import { cpSync } from "node:fs";

for (const dir of ["admin/console"]) cpSync(`src/${dir}`, `dist/${dir}`, { recursive: true });
