/**
 * The provider simulator's faults (provider.ts applies them to charge requests): per request from the
 * `X-Fault` and `X-Latency-Ms` headers, scripted for the next requests (`failNext`), or at random rates
 * drawn from the seeded generator, one draw per fault kind in a fixed order, so that a seed gives the
 * same sequence of faults.
 */
import type { IncomingMessage } from "node:http";
import type { Rng } from "./prng.ts";

/** A fault the simulator can apply to one charge request (`failNext`, or the `X-Fault` header). */
export type ProviderFault = "timeout" | "500" | "503" | "drop" | "late" | "decline";
export const FAULTS: readonly ProviderFault[] = ["timeout", "500", "503", "drop", "late", "decline"];

/** Probabilities (0..1) of each random fault per charge request. */
export interface FaultRates {
  /** No answer until the client gives up; nothing is charged. */
  timeout?: number;
  /** 500 or 503, half each. */
  error?: number;
  /** The connection is cut after the charge is made. */
  drop?: number;
  /** The card is declined. */
  decline?: number;
}

/** The faults and latencies a simulator applies, and how they are changed at run time. */
export class FaultPlan {
  readonly #rng: Rng;
  readonly #latencyMs: number | readonly [number, number];
  #rates: FaultRates;
  #scripted: ProviderFault[] = [];

  constructor(rng: Rng, rates: FaultRates = {}, latencyMs: number | readonly [number, number] = 0) {
    this.#rng = rng;
    this.#rates = { ...rates };
    this.#latencyMs = latencyMs;
  }

  /** The fault for this request: its header's, else the next scripted one, else a random draw. */
  next(req: IncomingMessage): ProviderFault | undefined {
    const h = String(req.headers["x-fault"] ?? "").trim();
    if (FAULTS.includes(h as ProviderFault)) return h as ProviderFault;
    const next = this.#scripted.shift();
    if (next) return next;
    const rng = this.#rng;
    const rates = this.#rates;
    if (rng.chance(rates.timeout ?? 0)) return "timeout";
    if (rng.chance(rates.error ?? 0)) return rng.chance(0.5) ? "500" : "503";
    if (rng.chance(rates.drop ?? 0)) return "drop";
    if (rng.chance(rates.decline ?? 0)) return "decline";
    return undefined;
  }

  /** The latency to add to this request, in ms: its header's, else the configured one. */
  latency(req: IncomingMessage): number {
    const header = Number(req.headers["x-latency-ms"]);
    if (Number.isFinite(header) && header >= 0) return header;
    const l = this.#latencyMs;
    if (typeof l === "number") return l;
    return l[0] + this.#rng.int(l[1] - l[0] + 1);
  }

  /** Replace the random rates. */
  setRates(rates: FaultRates): void {
    this.#rates = { ...rates };
  }

  /** Apply these faults to the next requests, one each. */
  script(faults: readonly ProviderFault[]): void {
    this.#scripted.push(...faults);
  }

  /** What `POST /_sim/faults` answers: the rates and the faults still scripted. */
  state(): { rates: FaultRates; next: ProviderFault[] } {
    return { rates: this.#rates, next: this.#scripted };
  }

  /** Forget the scripted faults (the rates and the generator keep going). */
  reset(): void {
    this.#scripted = [];
  }
}
