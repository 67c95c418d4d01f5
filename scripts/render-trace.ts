/**
 * The README's trace picture, rendered from real exported spans: runs test/observability's payment
 * scenario (idem's client, a Hono + idem server on PGlite whose first reply is lost) under the real
 * OpenTelemetry SDK with an in-memory exporter, then draws the spans as a waterfall (SVG).
 *
 *   npx tsx --conditions=source scripts/render-trace.ts [docs/images/trace-lost-reply.svg]
 */
import { writeFileSync } from "node:fs";
import { PGlite } from "@electric-sql/pglite";
import type { ReadableSpan } from "@opentelemetry/sdk-trace";
import { fromPglite } from "../src/postgres/drivers/pglite.ts";
import { migrate } from "../src/postgres/schema/migrate.ts";
import { pay, startPaymentApi } from "../test/observability/payment.ts";
import { installSdk, parentOf } from "../test/observability/sdk.ts";

const out = process.argv[2] ?? "docs/images/trace-lost-reply.svg";

const sdk = installSdk();
const db = fromPglite(await PGlite.create());
await migrate(db);
const api = await startPaymentApi(db, "receipts");
await pay(api); // warm: the first request pays for compiling and caches
sdk.exporter.reset();
const response = await pay(api);
await sdk.flush();
const spans = sdk.spans();
await api.close();
await db.close();
await sdk.uninstall();
if (response.status !== 201) throw new Error(`the payment answered ${response.status}`);

const ns = (t: [number, number]) => t[0] * 1e9 + t[1];
const ordered: { span: ReadableSpan; depth: number }[] = [];
const ids = new Set(spans.map((s) => s.spanContext().spanId));
const walk = (parent: string | undefined, depth: number) => {
  const kids = spans
    .filter((s) => (parent === undefined ? !ids.has(parentOf(s) ?? "") : parentOf(s) === parent))
    .sort((a, b) => ns(a.startTime) - ns(b.startTime));
  for (const k of kids) {
    ordered.push({ span: k, depth });
    walk(k.spanContext().spanId, depth + 1);
  }
};
walk(undefined, 0);

const t0 = Math.min(...spans.map((s) => ns(s.startTime)));
const t1 = Math.max(...spans.map((s) => ns(s.endTime)));
const total = t1 - t0;
const W = 900;
const LABEL = 330;
const ROW = 26;
const TOP = 46;
const H = TOP + ordered.length * ROW + 34;
const x = (t: number) => LABEL + ((t - t0) / total) * (W - LABEL - 70);
const esc = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;");
const colour = (s: ReadableSpan) =>
  s.name === "idem.intent"
    ? "#6b7280"
    : s.attributes["http.request.method"] !== undefined
      ? s.attributes["error.type"]
        ? "#dc2626"
        : "#2563eb"
      : s.name === "idem.claim"
        ? s.attributes["idem.claim.outcome"] === "replayed"
          ? "#7c3aed"
          : "#059669"
        : "#0d9488";
const note = (s: ReadableSpan) => {
  const a = s.attributes;
  const parts: string[] = [];
  if (a["http.request.resend_count"] !== undefined)
    parts.push(`resend_count=${a["http.request.resend_count"]}`);
  if (a["error.type"] !== undefined) parts.push(`error=${a["error.type"]}`);
  if (a["http.response.status_code"] !== undefined && s.name !== "idem.intent")
    parts.push(`${a["http.response.status_code"]}`);
  if (a["idem.claim.outcome"] !== undefined) parts.push(String(a["idem.claim.outcome"]));
  if (s.name === "idem.request" && a["idem.outcome"] !== undefined) parts.push(String(a["idem.outcome"]));
  if (a["idem.client.attempts"] !== undefined) parts.push(`attempts=${a["idem.client.attempts"]}`);
  return parts.join(" · ");
};

const rows = ordered.map(({ span, depth }, i) => {
  const y = TOP + i * ROW;
  const a = x(ns(span.startTime));
  const b = Math.max(a + 2, x(ns(span.endTime)));
  const ms = (ns(span.endTime) - ns(span.startTime)) / 1e6;
  const events = span.events
    .map((e) => {
      const ex = x(ns(e.time));
      return `<circle cx="${ex.toFixed(1)}" cy="${y + 9}" r="4" fill="#f59e0b"><title>${esc(e.name)}</title></circle>`;
    })
    .join("");
  return `<text x="${8 + depth * 16}" y="${y + 13}" class="n">${esc(span.name)}</text>
<text x="${LABEL - 8}" y="${y + 13}" class="m" text-anchor="end">${esc(note(span))}</text>
<rect x="${a.toFixed(1)}" y="${y + 2}" width="${(b - a).toFixed(1)}" height="14" rx="2" fill="${colour(span)}"/>
<text x="${(b + 4).toFixed(1)}" y="${y + 13}" class="d">${ms.toFixed(1)} ms</text>${events}`;
});

const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="ui-sans-serif, system-ui, sans-serif">
<title>Trace of a payment whose first reply is lost, retried with the same key</title>
<style>.n{font-size:12px;fill:#111827}.m{font-size:11px;fill:#4b5563}.d{font-size:10px;fill:#6b7280}.t{font-size:13px;font-weight:600;fill:#111827}</style>
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="8" y="22" class="t">A payment whose first reply is lost, retried with the same key (one trace, ${spans.length} spans, ${(total / 1e6).toFixed(1)} ms)</text>
<line x1="${LABEL}" y1="${TOP - 8}" x2="${LABEL}" y2="${H - 30}" stroke="#e5e7eb"/>
${rows.join("\n")}
<text x="8" y="${H - 10}" class="d">Rendered by scripts/render-trace.ts from spans exported by the OpenTelemetry SDK (in-memory exporter). Orange dot: idem.retry event (reason lost-reply).</text>
</svg>
`;
writeFileSync(out, svg);
console.log(`${out}: ${spans.length} spans, ${(total / 1e6).toFixed(1)} ms`);
