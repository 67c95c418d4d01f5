/**
 * A one-line progress bar for terminals. Draws nothing unless the stream is a TTY, so logs and CI
 * output stay clean; redraws at most every 80 ms.
 */
export interface ProgressBar {
  update(done: number, note?: string): void;
  /** Erase the bar. */
  done(): void;
}

export function createProgressBar(options: {
  total: number;
  label?: string;
  stream?: NodeJS.WriteStream;
  /** Draw even when not a TTY (tests). */
  force?: boolean;
}): ProgressBar {
  const stream = options.stream ?? process.stderr;
  if (!options.force && !stream.isTTY) return { update() {}, done() {} };
  const started = Date.now();
  let last = 0;
  let drawn = false;
  const draw = (done: number, note?: string) => {
    const cols = stream.columns || 80;
    const width = Math.max(10, Math.min(30, cols - 50));
    const filled = options.total ? Math.round((done / options.total) * width) : width;
    const secs = ((Date.now() - started) / 1000).toFixed(1);
    const line = `${options.label ?? "progress"} [${"#".repeat(filled)}${"-".repeat(width - filled)}] ${done}/${options.total} ${secs} s${note ? ` ${note}` : ""}`;
    stream.write(`\r${line.slice(0, cols - 1)}\x1b[K`);
    drawn = true;
  };
  return {
    update(done, note) {
      const now = Date.now();
      if (done < options.total && now - last < 80) return;
      last = now;
      draw(done, note);
    },
    done() {
      if (drawn) stream.write("\r\x1b[K");
    },
  };
}
