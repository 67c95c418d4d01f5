// The retry-storm calculator's formula (the playground's storm panel, and the test that checks it).
//
// A chain of layers, the bottom one (a database, a provider) failing each call with probability p,
// independently. Layer i (counted from the bottom) makes up to A_i attempts per call it receives, each
// of which is one call into the layer below. With f the failure rate of the layer below:
//
//   expected attempts per call   E = 1 + f + f^2 + ... + f^(A-1) = (1 - f^A) / (1 - f)   (A when f = 1)
//   the layer's own failure rate     f^A
//
// so the bottom receives E_1 * E_2 * ... * E_L calls per user tap (which telescopes to
// (1 - p^(A^L)) / (1 - p) when every layer makes A attempts: 27 at p = 100% for 3 x 3), and users
// see p^(A^L) of their taps fail.
//
// With a retry budget at each layer (every call earns `ratio` tokens, every retry spends one), a layer
// retries at most `ratio` per call on average: E = 1 + min(R, ratio), where R = f + ... + f^(A-1) is
// what it wants. While the budget binds, the retries it allows rescue (1 - f) of a call each, so the
// layer fails f - min(R, ratio) * (1 - f) of its calls (never less than f^A). This is the steady state
// of a long run; a bucket's starting credit lets a short run retry a little more.

/**
 * Attempts per layer, the top (the user's app) first: "3" for every layer, "3,1,1" for retries at the
 * app only (the layers below fail fast). The last number repeats for layers it does not name.
 */
export function attemptsOf(text, layers) {
  const list = String(text)
    .split(",")
    .map((s) => Number(s.trim()))
    .filter((n) => Number.isInteger(n) && n >= 1);
  if (list.length === 0) return Array.from({ length: layers }, () => 1);
  return Array.from({ length: layers }, (_, i) => list[Math.min(i, list.length - 1)]);
}

/** One layer over a callee failing with probability f: its attempts per call, and its failure rate. */
export function layer(f, attempts, budget) {
  let wanted = 0;
  for (let k = 1; k < attempts; k++) wanted += f ** k;
  const allowed = budget === undefined ? wanted : Math.min(wanted, budget);
  const fails = allowed >= wanted ? f ** attempts : Math.max(f ** attempts, f - allowed * (1 - f));
  return { perCall: 1 + allowed, fails };
}

/**
 * The chain: `attempts` per layer, the top first; `p` the bottom's failure rate (0..1); `budget` the
 * retry budget's ratio at every layer, or undefined for none. Returns the bottom's calls per tap and
 * the share of taps that fail.
 */
export function storm({ attempts, p, budget }) {
  let f = p;
  let load = 1;
  const layers = [];
  for (const a of [...attempts].reverse()) {
    const l = layer(f, a, budget);
    layers.push(l);
    f = l.fails;
  }
  for (const l of layers) load *= l.perCall;
  return { loadPerTap: load, failures: f, layers: layers.reverse() };
}
