// The playground's retry-storm calculator: the formula (storm-formula.js) as the inputs change, and a
// live run through /playground/api/storm whose measured load is plotted beside the formula.
import { attemptsOf, storm } from "/playground/storm-formula.js";

const $ = (id) => document.getElementById(id);
const fixed = (n) => (n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2));
const pct = (x) => `${(x * 100).toFixed(x > 0 && x < 0.001 ? 3 : 1)}%`;

/** The inputs as the formula and the live run take them. */
function inputs() {
  const layers = Math.min(5, Math.max(1, Math.round(Number($("storm-layers").value) || 1)));
  return {
    layers,
    attempts: attemptsOf($("storm-attempts").value, layers).map((n) => Math.min(5, n)),
    p: Number($("storm-failure").value) / 100,
    budget: Math.max(0, Number($("storm-budget").value) || 0) / 100,
  };
}

/** The last live run, kept while its inputs stay the same. */
let measured = null;

function render() {
  const i = inputs();
  $("storm-failure-out").textContent = `${Math.round(i.p * 100)}%`;
  const plain = storm({ attempts: i.attempts, p: i.p });
  const capped = storm({ attempts: i.attempts, p: i.p, budget: i.budget });
  $("storm-load").textContent = fixed(plain.loadPerTap);
  $("storm-fail").textContent = pct(plain.failures);
  $("storm-load-budget").textContent = fixed(capped.loadPerTap);
  $("storm-fail-budget").textContent = pct(capped.failures);
  const same = measured && JSON.stringify(measured.inputs) === JSON.stringify(i);
  const m = same ? measured.result : null;
  $("storm-measured-load").textContent = m ? fixed(m.withoutBudget.loadPerTap) : "-";
  $("storm-measured-fail").textContent = m ? pct(m.withoutBudget.failures) : "-";
  $("storm-payments").textContent = m ? `${m.withoutBudget.payments} of ${m.taps}` : "-";
  $("storm-measured-load-budget").textContent = m ? fixed(m.withBudget.loadPerTap) : "-";
  $("storm-measured-fail-budget").textContent = m ? pct(m.withBudget.failures) : "-";
  $("storm-payments-budget").textContent = m ? `${m.withBudget.payments} of ${m.taps}` : "-";
  chart(i, m);
}

/** Calls per tap against the failure rate (log scale), both curves, and the measured points. */
function chart(i, m) {
  const W = 640;
  const H = 260;
  const left = 48;
  const bottom = 30;
  const top = 12;
  const most = Math.max(
    2,
    i.attempts.reduce((a, b) => a * b, 1),
  );
  const x = (p) => left + p * (W - left - 12);
  const y = (load) => top + (1 - Math.log(load) / Math.log(most)) * (H - top - bottom);
  const curve = (budget) => {
    const points = [];
    for (let k = 0; k <= 100; k++) {
      const p = k / 100;
      points.push(
        `${x(p).toFixed(1)},${y(storm({ attempts: i.attempts, p, budget }).loadPerTap).toFixed(1)}`,
      );
    }
    return `M${points.join("L")}`;
  };
  const ticks = [1, 2, 5, 10, 20, 50, 100, 200, 500].filter((t) => t <= most);
  const parts = [
    `<line class="axis" x1="${left}" y1="${H - bottom}" x2="${W - 12}" y2="${H - bottom}"/>`,
    `<line class="axis" x1="${left}" y1="${top}" x2="${left}" y2="${H - bottom}"/>`,
    ...ticks.map((t) => `<text x="${left - 6}" y="${y(t) + 4}" text-anchor="end">${t}</text>`),
    ...[0, 0.25, 0.5, 0.75, 1].map(
      (p) => `<text x="${x(p)}" y="${H - bottom + 16}" text-anchor="middle">${p * 100}%</text>`,
    ),
    `<text x="${W - 12}" y="${H - 4}" text-anchor="end">failures at the bottom</text>`,
    `<text x="${left + 6}" y="${top + 10}">calls to the bottom per tap</text>`,
    `<path class="curve no-budget" d="${curve(undefined)}" data-testid="storm-curve"/>`,
    `<path class="curve budget" d="${curve(i.budget)}" data-testid="storm-curve-budget"/>`,
    `<line class="axis" x1="${x(i.p)}" y1="${top}" x2="${x(i.p)}" y2="${H - bottom}" stroke-dasharray="3 3"/>`,
  ];
  if (m) {
    const dot = (cls, load, id) =>
      `<circle class="${cls}" cx="${x(i.p)}" cy="${y(Math.max(1, Math.min(most, load)))}" r="5" data-testid="${id}"><title>measured: ${fixed(load)} per tap</title></circle>`;
    parts.push(dot("no-budget", m.withoutBudget.loadPerTap, "storm-point"));
    parts.push(dot("budget", m.withBudget.loadPerTap, "storm-point-budget"));
  }
  $("storm-chart").innerHTML = parts.join("");
}

async function runLive() {
  const i = inputs();
  const taps = Math.min(200, Math.max(1, Math.round(Number($("storm-taps").value) || 40)));
  const live = $("storm-live");
  live.hidden = false;
  live.textContent = `Sending ${taps} taps through ${i.layers} layer(s), without and with the budget…`;
  $("storm-run").disabled = true;
  try {
    const res = await fetch("/playground/api/storm", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ attempts: i.attempts, failure: i.p, budget: i.budget, taps }),
    });
    const body = await res.json();
    if (!res.ok) throw new Error(body.detail ?? `HTTP ${res.status}`);
    measured = { inputs: i, result: body };
    live.textContent =
      `Measured over ${taps} taps: ${fixed(body.withoutBudget.loadPerTap)} calls per tap without the budget, ` +
      `${fixed(body.withBudget.loadPerTap)} with it. Every tap that succeeded made one payment, however often it was retried.`;
  } catch (err) {
    live.textContent = `The live run failed: ${err.message}`;
  } finally {
    $("storm-run").disabled = false;
    render();
  }
}

for (const id of ["storm-layers", "storm-attempts", "storm-failure", "storm-budget"]) {
  $(id).addEventListener("input", render);
}
$("storm-run").addEventListener("click", runLive);
render();
