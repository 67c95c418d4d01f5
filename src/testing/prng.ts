/**
 * A small seeded pseudo-random generator (sfc32, seeded through splitmix32), so that fault injection
 * and simulated ids repeat exactly for a given seed. Not for anything secret.
 */
export interface Rng {
  /** A float in [0, 1). */
  next(): number;
  /** An integer in [0, n). */
  int(n: number): number;
  /** True with probability `p`. */
  chance(p: number): boolean;
  /** `n` random hex digits. */
  hex(n: number): string;
}

export function createRng(seed: number): Rng {
  let s = seed >>> 0;
  const splitmix = () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return (z ^ (z >>> 16)) >>> 0;
  };
  let a = splitmix();
  let b = splitmix();
  let c = splitmix();
  let d = splitmix();
  const u32 = () => {
    const t = (((a + b) >>> 0) + d) >>> 0;
    d = (d + 1) >>> 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) >>> 0;
    c = ((c << 21) | (c >>> 11)) >>> 0;
    c = (c + t) >>> 0;
    return t;
  };
  for (let i = 0; i < 12; i++) u32();
  const next = () => u32() / 4294967296;
  return {
    next,
    int: (n) => Math.floor(next() * n),
    chance: (p) => p > 0 && next() < p,
    hex(n) {
      let out = "";
      while (out.length < n) out += u32().toString(16).padStart(8, "0");
      return out.slice(0, n);
    },
  };
}
