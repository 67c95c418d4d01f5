/**
 * Child processes of the chaos test: the provider simulator (`idem provider`), which outlives every
 * service crash so that its charge list is the truth, and the reference service, which the chaos driver
 * SIGKILLs and restarts on the same port. Both run as one Node process each (`node --import tsx`, not
 * the `tsx` wrapper, which would leave its own child behind when killed).
 */
import { type ChildProcess, spawn } from "node:child_process";

const NODE_ARGS = ["--conditions=source", "--import", "tsx"];

export interface Child {
  proc: ChildProcess;
  /** stdout and stderr so far (the last 64 KiB). */
  output(): string;
  /** Resolves with the exit code (or signal) once the process is gone. */
  exited: Promise<string>;
}

function launch(args: string[], env: NodeJS.ProcessEnv): Child {
  const proc = spawn(process.execPath, [...NODE_ARGS, ...args], {
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  const keep = (d: Buffer) => {
    out += d.toString();
    if (out.length > 65_536) out = out.slice(-65_536);
  };
  proc.stdout!.on("data", keep);
  proc.stderr!.on("data", keep);
  const exited = new Promise<string>((resolve) => {
    proc.once("exit", (code, signal) => resolve(signal ?? `exit ${code}`));
  });
  return { proc, output: () => out, exited };
}

/** Wait until the child prints a line matching `re`; reject if it exits first or after `timeoutMs`. */
function waitFor(child: Child, re: RegExp, what: string, timeoutMs = 60_000): Promise<RegExpExecArray> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`${what} did not start within ${timeoutMs} ms:\n${child.output()}`));
    }, timeoutMs);
    const check = () => {
      const m = re.exec(child.output());
      if (m) {
        cleanup();
        resolve(m);
      }
    };
    let settled = false;
    const onExit = (reason: string) => {
      if (settled) return;
      cleanup();
      reject(new Error(`${what} exited (${reason}) before it was ready:\n${child.output()}`));
    };
    const cleanup = () => {
      clearTimeout(timer);
      child.proc.stdout!.off("data", check);
      settled = true;
    };
    child.proc.stdout!.on("data", check);
    child.exited.then(onExit);
    check();
  });
}

/** Stop a child: SIGTERM, then SIGKILL after `graceMs`. Resolves when it is gone. */
export async function stopChild(child: Child | undefined, graceMs = 5_000): Promise<void> {
  if (!child || child.proc.exitCode !== null || child.proc.signalCode !== null) return;
  child.proc.kill("SIGTERM");
  const timer = setTimeout(() => child.proc.kill("SIGKILL"), graceMs);
  await child.exited;
  clearTimeout(timer);
}

export interface ProviderProcess extends Child {
  url: string;
}

/** `idem provider` with the given flags (see `idem provider --help`) on a free port. */
export async function startProviderProcess(flags: string[]): Promise<ProviderProcess> {
  const child = launch(["src/cli/main.ts", "provider", "--port", "0", ...flags], process.env);
  const m = await waitFor(child, /simulator on (http:\/\/\S+)/, "the provider simulator");
  return { ...child, url: m[1]! };
}

/**
 * The reference service, supervised: `kill()` SIGKILLs it and starts it again on the same port; if it
 * dies on its own (an uncaught error, say), it is started again too, and counted.
 */
export class Service {
  current: Child | undefined;
  /** SIGKILLs we sent. */
  kills = 0;
  /** Exits we did not cause, with their reason and last output lines. */
  unexpectedExits: Array<{ reason: string; tail: string }> = [];
  /** Starts, the first included. */
  starts = 0;
  /** Milliseconds the service was not listening, summed over restarts. */
  downMs = 0;
  #stopping = false;
  /** The children we SIGKILLed ourselves (their exit is not a crash). */
  #killed = new WeakSet<Child>();
  #restarting: Promise<void> | undefined;

  constructor(
    readonly port: number,
    private readonly env: NodeJS.ProcessEnv,
  ) {}

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Start (retrying while the database is unreachable, e.g. during its restart). */
  async start(timeoutMs = 90_000): Promise<void> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const child = launch(["app/main.ts"], { ...this.env, PORT: String(this.port) });
      this.current = child;
      try {
        await waitFor(
          child,
          /idem payments service on http/,
          "the service",
          Math.max(1_000, until - Date.now()),
        );
        this.starts++;
        this.#watch(child);
        return;
      } catch (err) {
        if (Date.now() >= until) throw err;
        await stopChild(child, 1_000);
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  }

  #watch(child: Child): void {
    child.exited.then((reason) => {
      if (this.#stopping || child !== this.current || this.#killed.has(child)) return;
      // The error's own lines, not the dump of the objects it carries.
      const tail = child
        .output()
        .split("\n")
        .filter((l) => /error|Error|FATAL|terminat|^\s+at /.test(l))
        .slice(0, 8)
        .join("\n");
      this.unexpectedExits.push({ reason, tail });
      this.#restarting ??= this.#restart().finally(() => {
        this.#restarting = undefined;
      });
    });
  }

  async #restart(): Promise<void> {
    const down = Date.now();
    await this.start();
    this.downMs += Date.now() - down;
  }

  /** SIGKILL the service (no shutdown of any kind), then start it again on the same port. */
  async kill(): Promise<void> {
    await this.#restarting;
    const child = this.current;
    if (!child) return;
    const down = Date.now();
    this.#killed.add(child);
    child.proc.kill("SIGKILL");
    this.kills++;
    await child.exited;
    await this.start();
    this.downMs += Date.now() - down;
  }

  /** Wait for a restart in progress (after an unexpected exit), if any. */
  async settled(): Promise<void> {
    while (this.#restarting) await this.#restarting;
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    await this.#restarting?.catch(() => {});
    await stopChild(this.current);
  }
}

/**
 * Several instances of the service on one database (as behind a load balancer), seen as one:
 * `kill()` SIGKILLs the next instance in turn (and starts it again); the counts are summed.
 */
export class Fleet {
  #turn = 0;

  constructor(readonly instances: readonly Service[]) {}

  get urls(): string[] {
    return this.instances.map((s) => s.url);
  }
  get kills(): number {
    return this.instances.reduce((n, s) => n + s.kills, 0);
  }
  get starts(): number {
    return this.instances.reduce((n, s) => n + s.starts, 0);
  }
  get downMs(): number {
    return this.instances.reduce((n, s) => n + s.downMs, 0);
  }
  get unexpectedExits(): Service["unexpectedExits"] {
    return this.instances.flatMap((s) => s.unexpectedExits);
  }

  async start(): Promise<void> {
    await Promise.all(this.instances.map((s) => s.start()));
  }

  kill(): Promise<void> {
    return this.instances[this.#turn++ % this.instances.length]!.kill();
  }

  async settled(): Promise<void> {
    await Promise.all(this.instances.map((s) => s.settled()));
  }

  async stop(): Promise<void> {
    await Promise.all(this.instances.map((s) => s.stop()));
  }
}
