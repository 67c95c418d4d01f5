/** Types of scripts/doc-blocks.mjs, for the TypeScript that calls it (the tests, a docs build). */

/** A block's mark: the HTML comment on the last non-blank line above its fence. */
export interface Mark {
  kind: "run" | "from" | "not checked" | "not run";
  /** `not checked: <reason>`, `from: <file>`, `run: until SIGTERM`. */
  reason?: string;
}

/** A fenced block of a Markdown file. */
export interface Block {
  /** The document, relative to the repository. */
  file: string;
  /** The fence's line, 1-based. */
  line: number;
  /** The fence's language (`ts`, `sh`...). */
  lang: string;
  /** The code, without the fences and without their indentation. */
  code: string;
  mark?: Mark;
}

export interface RunOptions {
  /** The program's environment. Default: this process's. */
  env?: NodeJS.ProcessEnv;
  /** How long it may run (a `run` block), or take to exit after SIGTERM. Default 60,000 ms. */
  timeoutMs?: number;
  /** Applied to the code before it runs (names of the test's own). */
  rewrite?: (code: string) => string;
  /** For `run: until SIGTERM`: polled until true, then the program gets SIGTERM. Default: after 3 s. */
  ready?: (output: string) => boolean | Promise<boolean>;
}

export interface RunResult {
  /** The exit code; null when it had to be killed. */
  code: number | null;
  /** What it printed (stdout and stderr). */
  output: string;
  killed: boolean;
}

export const ROOT: string;
export function defaultDocs(): string[];
export function codeBlocks(file: string): Block[];
export function typescriptBlocks(files?: string[]): Block[];
export function markProblems(blocks: Block[]): string[];
export interface TypecheckOptions {
  /** A project where a packed idem is installed: the blocks are checked there, against its declarations. */
  dir?: string;
  /** With `dir`: the compiler options (tsconfig.json's `compilerOptions` form). */
  compilerOptions?: Record<string, unknown>;
}
export function typecheckBlocks(blocks: Block[], options?: TypecheckOptions): Promise<string[]>;
export function runBlock(block: Block, options?: RunOptions): Promise<RunResult>;
