/**
 * The service's process signals: SIGINT and SIGTERM drain and stop it once, then exit 0; a start-up
 * failure prints its message and exits 1.
 */
export function runUntilSignalled(started: Promise<{ stop: () => Promise<void> }>): void {
  started.then(
    ({ stop }) => {
      for (const sig of ["SIGINT", "SIGTERM"] as const) {
        process.once(sig, () => {
          stop().then(() => process.exit(0));
        });
      }
    },
    (err: Error) => {
      console.error(`idem: ${err.message}`);
      process.exit(1);
    },
  );
}
