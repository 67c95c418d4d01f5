// Types of storm-formula.js (a plain ES module the page loads without a build step).

/** One layer: its attempts per call it receives, and its own failure rate. */
export interface StormLayer {
  perCall: number;
  fails: number;
}

/** Attempts per layer, the top first ("3", or "3,1,1"), for `layers` layers. */
export function attemptsOf(text: string, layers: number): number[];

/** One layer over a callee failing with probability `f`. */
export function layer(f: number, attempts: number, budget?: number): StormLayer;

/** The chain: the bottom's calls per tap and the share of taps that fail. */
export function storm(o: { attempts: number[]; p: number; budget?: number }): {
  loadPerTap: number;
  failures: number;
  layers: StormLayer[];
};
