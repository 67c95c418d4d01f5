/**
 * A payment endpoint on 127.0.0.1 that fails on purpose, following a script: one step per incoming
 * request, then plain success. It dedups by Idempotency-Key like an idem server would: a key it has
 * charged gets the saved answer again with `Idempotent-Replayed: true`.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export type Step =
  /** Charge (or replay) and answer 201. */
  | "ok"
  /** Charge, save the answer, then destroy the connection without replying. */
  | "charge-and-drop"
  /** Never answer (until the server closes). */
  | "hang"
  /** Answer this status without charging (with a problem+json body when `problem` is given). */
  | { status: number; headers?: Record<string, string>; problem?: Record<string, unknown> };

export interface SeenRequest {
  method: string;
  url: string;
  key: string | undefined;
  body: string;
}

export interface PaymentServer {
  url: string;
  seen: SeenRequest[];
  /** Charges made, by key. */
  charges: Map<string, number>;
  totalCharges(): number;
  /** Called when a request arrives, before the step runs. */
  onRequest?: (req: SeenRequest) => void;
  close(): Promise<void>;
}

export async function startPaymentServer(script: Step[] = []): Promise<PaymentServer> {
  const saved = new Map<string, string>();
  const charges = new Map<string, number>();
  const seen: SeenRequest[] = [];
  let chargeId = 0;

  const charge = (key: string | undefined): string => {
    const k = key ?? `anonymous-${seen.length}`;
    charges.set(k, (charges.get(k) ?? 0) + 1);
    const body = JSON.stringify({ charge_id: ++chargeId });
    saved.set(k, body);
    return body;
  };

  const state: PaymentServer = {
    url: "",
    seen,
    charges,
    totalCharges: () => [...charges.values()].reduce((a, b) => a + b, 0),
    close: async () => {},
  };

  const server = createServer(async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const raw = req.headers["idempotency-key"];
    const key = typeof raw === "string" ? raw.replace(/^"(.*)"$/, "$1") : undefined;
    const request: SeenRequest = {
      method: req.method ?? "",
      url: req.url ?? "",
      key,
      body: Buffer.concat(chunks).toString("utf8"),
    };
    seen.push(request);
    state.onRequest?.(request);
    const step = script[seen.length - 1] ?? "ok";
    if (step === "hang") return;
    if (step === "charge-and-drop") {
      charge(key);
      req.socket.destroy();
      return;
    }
    if (step === "ok") {
      const replay = key !== undefined ? saved.get(key) : undefined;
      res.writeHead(201, {
        "content-type": "application/json",
        ...(replay !== undefined && { "idempotent-replayed": "true" }),
      });
      res.end(replay ?? charge(key));
      return;
    }
    if (step.problem) {
      res.writeHead(step.status, { "content-type": "application/problem+json", ...step.headers });
      res.end(JSON.stringify({ status: step.status, title: "scripted", ...step.problem }));
      return;
    }
    res.writeHead(step.status, { "content-type": "application/json", ...step.headers });
    res.end(JSON.stringify({ error: `scripted ${step.status}` }));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  state.url = `http://127.0.0.1:${port}`;
  state.close = () =>
    new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    });
  return state;
}

/** A Web Storage stand-in for Node (the localStorage store's tests). */
export class MapStorage {
  readonly #map = new Map<string, string>();
  get length(): number {
    return this.#map.size;
  }
  key(i: number): string | null {
    return [...this.#map.keys()][i] ?? null;
  }
  getItem(k: string): string | null {
    return this.#map.get(k) ?? null;
  }
  setItem(k: string, v: string): void {
    this.#map.set(k, String(v));
  }
  removeItem(k: string): void {
    this.#map.delete(k);
  }
}

/** A `fetch` stand-in that answers from a function, for fake-timer tests. */
export function scriptedFetch(answer: (call: number, init: RequestInit) => Response | Promise<Response>): {
  fetch: (url: string, init: RequestInit) => Promise<Response>;
  calls: RequestInit[];
} {
  const calls: RequestInit[] = [];
  return {
    calls,
    fetch: async (_url, init) => {
      calls.push(init);
      return answer(calls.length, init);
    },
  };
}

/** A network error shaped like Node's refused connection (nothing listening): counts against the breaker. */
export function refusedError(): TypeError {
  const cause = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:9"), { code: "ECONNREFUSED" });
  return new TypeError("fetch failed", { cause });
}

/** A network error shaped like Node's dropped connection (a reply lost after the request was sent). */
export function socketError(): TypeError {
  const cause = Object.assign(new Error("other side closed"), { code: "UND_ERR_SOCKET" });
  return new TypeError("fetch failed", { cause });
}
