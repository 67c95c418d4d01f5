/** `idem ...` run in this process through the CLI's dispatcher, with what it printed and its exit code. */
import { vi } from "vitest";
import { main } from "../../src/cli/main.ts";

export async function idem(...argv: string[]): Promise<{ code: number; out: string; err: string }> {
  const log = vi.spyOn(console, "log").mockImplementation(() => {});
  const error = vi.spyOn(console, "error").mockImplementation(() => {});
  try {
    const code = await main(argv);
    const text = (m: typeof log) => m.mock.calls.map((c) => c.map(String).join(" ")).join("\n");
    return { code, out: text(log), err: text(error) };
  } finally {
    log.mockRestore();
    error.mockRestore();
  }
}
