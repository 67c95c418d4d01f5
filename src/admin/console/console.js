// The operations console (idem/admin's adminConsole): no framework, no build step. Everything comes from
// the admin API beside this script ({base}/api/*, adminHandler) with the admin token the person typed in
// (kept in this tab's sessionStorage only). Every action the page takes is recorded by the API with
// their name.

/** The API's URL: `api` next to this script, wherever the console is mounted. */
const API = new URL("api", import.meta.url).pathname;

const $ = (id) => document.getElementById(id);
const esc = (s) =>
  String(s ?? "").replace(
    /[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c],
  );
const when = (iso) => (iso ? new Date(iso).toISOString().replace("T", " ").slice(0, 19) : "-");
let token = sessionStorage.getItem("idem-admin-token") ?? "";
/** The key shown on the right: `{ scope, key }`. */
let current = null;

async function api(method, path, body) {
  const res = await fetch(`${API}${path}`, {
    method,
    headers: {
      authorization: `Bearer ${token}`,
      ...(body === undefined ? {} : { "content-type": "application/json" }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await res.json().catch(() => ({}));
  if (!res.ok) {
    const err = new Error(data.detail ?? `${res.status}`);
    err.status = res.status;
    throw err;
  }
  return data;
}

function say(text, bad = false) {
  const m = $("message");
  m.hidden = !text;
  m.textContent = text ?? "";
  m.classList.toggle("bad", bad);
}

/** Run `fn`, showing its failure (the API's problem detail) instead of throwing. */
async function attempt(fn) {
  try {
    await fn();
  } catch (err) {
    if (err.status === 401) {
      $("who").textContent = "";
      say("The token was refused: sign in again.", true);
    } else say(err.message, true);
  }
}

const keyCell = (scope, key) => `<code>${esc(scope)}</code> / <code>${esc(key)}</code>`;
const openButton = (scope, key) =>
  `<button type="button" data-open data-scope="${esc(scope)}" data-key="${esc(key)}">Open</button>`;

async function loadReviews() {
  const { items } = await api("GET", "/keys?state=needs_review");
  $("reviews").innerHTML =
    items
      .map(
        (r) => `<tr data-testid="review" data-key="${esc(r.key)}"><td>${when(r.openedAt)}</td>
          <td>${keyCell(r.scope, r.key)}</td><td>${esc(r.runner ?? "?")} at ${esc(r.recoveryPoint)}</td>
          <td>${esc(r.reason)}</td><td>${openButton(r.scope, r.key)}</td></tr>`,
      )
      .join("") || `<tr><td colspan="5">nobody is waiting</td></tr>`;
}

async function loadKeys() {
  const state = $("list-state").value;
  const { items } = await api("GET", `/keys?state=${state}`);
  $("keys").innerHTML =
    items
      .map(
        (k) => `<tr data-key="${esc(k.key)}"><td>${when(k.updatedAt ?? k.createdAt)}</td>
          <td>${keyCell(k.scope, k.key)}</td><td>${esc(k.recoveryPoint)}</td>
          <td>${openButton(k.scope, k.key)}</td></tr>`,
      )
      .join("") || `<tr><td colspan="4">none</td></tr>`;
}

async function loadOutbox() {
  const o = await api("GET", "/outbox");
  $("outbox-summary").textContent =
    `${o.counts.pending} pending, ${o.counts.parked} parked, lag ${Math.round(o.lagSeconds)} s`;
  $("outbox").innerHTML =
    o.parked
      .map(
        (e) => `<tr data-testid="parked-event" data-id="${esc(e.id)}"><td>${when(e.parkedAt)}</td>
          <td>${esc(e.type)}<br><code>${esc(e.id.slice(0, 13))}…</code></td>
          <td>${esc(e.aggregateId ?? "-")}${e.heldBack ? ` (holds ${e.heldBack} back)` : ""}</td>
          <td>${esc(e.lastError ?? "")}</td>
          <td><button type="button" data-requeue-id="${esc(e.id)}">Requeue</button>
          ${e.aggregateId ? `<button type="button" data-requeue-aggregate="${esc(e.aggregateId)}">Requeue aggregate</button>` : ""}</td></tr>`,
      )
      .join("") || `<tr><td colspan="5">no parked events</td></tr>`;
}

async function loadInbox() {
  const { parked } = await api("GET", "/inbox");
  $("inbox").innerHTML =
    parked
      .map(
        (m) => `<tr data-testid="parked-message" data-id="${esc(m.messageId)}"><td>${when(m.parkedAt)}</td>
          <td>${esc(m.consumer)}</td><td><code>${esc(m.messageId)}</code></td><td>${esc(m.lastError ?? "")}</td>
          <td><button type="button" data-unpark="${esc(m.messageId)}" data-consumer="${esc(m.consumer)}">Unpark</button></td></tr>`,
      )
      .join("") || `<tr><td colspan="5">no parked messages</td></tr>`;
}

function showAudit(run) {
  $("audit-when").textContent = run ? `last run ${when(run.at)} by ${run.actor}` : "not run yet";
  $("audit").innerHTML = run
    ? run.results
        .map(
          (r) =>
            `<li data-ok="${r.violations === 0}">${r.violations === 0 ? "✓" : "✗"} ${esc(r.name)}: ${esc(r.description)}${r.violations ? ` (${r.violations} row(s))` : ""}</li>`,
        )
        .join("")
    : "";
}

async function loadAudit() {
  try {
    showAudit(await api("GET", "/audit"));
  } catch (err) {
    if (err.status === 404) showAudit(undefined);
    else throw err;
  }
}

async function loadActions() {
  const { actions } = await api("GET", "/actions?limit=20");
  $("actions").innerHTML =
    actions
      .map(
        (
          a,
        ) => `<tr data-testid="action"><td>${when(a.at)}</td><td>${esc(a.actor)}</td><td>${esc(a.action)}</td>
          <td>${a.key ? keyCell(a.scope, a.key) : esc(a.target ?? "")}</td><td>${esc(a.reason ?? "")}</td></tr>`,
      )
      .join("") || `<tr><td colspan="5">nothing yet</td></tr>`;
}

function renderStory(s) {
  const k = s.key;
  current = { scope: k.scope, key: k.key };
  $("story-ref").textContent = k.ref;
  const rows = [
    ["scope", `<code>${esc(k.scope)}</code>`],
    ["key", `<code>${esc(k.key)}</code>`],
    ["state", `<span class="state-${esc(k.state)}" data-testid="state">${esc(k.state)}</span>`],
    ["recovery point", `${esc(k.recoveryPoint)}${k.runner ? ` (runner ${esc(k.runner)})` : ""}`],
    ["claim", `<code>${esc(k.claimId ?? "-")}</code>`],
    [
      "lease",
      k.lease ? `fencing token <code>${esc(k.lease.token)}</code> until ${when(k.lease.until)}` : "none",
    ],
    ["saved answer", k.saved ? `${k.saved.status}, ${k.saved.bodyBytes} bytes` : "none"],
    ["expires", when(k.expiresAt)],
  ];
  const timeline = s.timeline
    .map(
      (e) =>
        `<li data-kind="${esc(e.kind)}" data-testid="event"><time>${e.at ? when(e.at) : "when: not recorded"}</time>${esc(e.text)}</li>`,
    )
    .join("");
  $("story").innerHTML = `<dl class="kv">${rows.map(([t, d]) => `<dt>${t}</dt><dd>${d}</dd>`).join("")}</dl>
    ${k.phaseData ? `<details><summary>phase data</summary><pre>${esc(JSON.stringify(k.phaseData, null, 2))}</pre></details>` : ""}
    <ol class="timeline" data-testid="timeline">${timeline}</ol>
    <details><summary>not recorded</summary><ul class="note">${s.notRecorded.map((n) => `<li>${esc(n)}</li>`).join("")}</ul></details>`;
  $("settle").hidden = k.state !== "needs_review";
  showForget(s.forget);
  const review = s.reviews.find((r) => !r.settledAt);
  if (review) $("resume-phase").value = review.recoveryPoint;
}

/** Whether the key may be forgotten, and why not (the API's verdict): the form follows it. */
function showForget(verdict) {
  $("forget").hidden = false;
  $("forget").dataset.allowed = String(verdict.allowed);
  $("forget-verdict").textContent = verdict.allowed
    ? `It may be forgotten: ${verdict.why}.`
    : `It cannot be forgotten: ${verdict.why}.`;
  $("forget-verdict").classList.toggle("bad", !verdict.allowed);
  $("reversed-row").hidden = verdict.allowed || !verdict.overridable;
  $("effect-reversed").checked = false;
  $("forget-button").disabled = !verdict.allowed;
}

$("effect-reversed").addEventListener("change", () => {
  $("forget-button").disabled = $("forget").dataset.allowed !== "true" && !$("effect-reversed").checked;
});

async function openKey(query) {
  say("");
  try {
    renderStory(await api("GET", `/keys/find?${new URLSearchParams(query)}`));
  } catch (err) {
    if (err.status === 404) {
      current = null;
      $("story").innerHTML = `<p class="note" data-testid="not-found">${esc(err.message)}</p>`;
      $("settle").hidden = $("forget").hidden = true;
    } else throw err;
  }
}

async function refresh() {
  await Promise.all([loadReviews(), loadKeys(), loadOutbox(), loadInbox(), loadAudit(), loadActions()]);
}

async function signIn() {
  const { actor } = await api("GET", "/me");
  $("who").textContent = `signed in as ${actor}`;
  say("");
  await refresh();
  // A ref in the address (/admin#op_...) is looked up: a support ticket can link straight to it.
  const ref = decodeURIComponent(location.hash.slice(1));
  if (ref.startsWith("op_")) {
    $("ref").value = ref;
    await openKey({ ref });
  }
}

$("signin").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("idem-admin-token", token);
  attempt(signIn);
});

$("search").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const ref = $("ref").value.trim();
  const query = ref ? { ref } : { scope: $("scope").value, key: $("key").value };
  attempt(() => openKey(query));
});

$("list-state").addEventListener("change", () => attempt(loadKeys));

for (const radio of document.querySelectorAll('input[name="how"]')) {
  radio.addEventListener("change", () => {
    for (const row of document.querySelectorAll("[data-how]")) row.hidden = row.dataset.how !== radio.value;
  });
}

function parsed(id, what) {
  const text = $(id).value.trim();
  if (!text) return undefined;
  try {
    return JSON.parse(text);
  } catch {
    throw new Error(`${what} is not JSON`);
  }
}

$("settle").addEventListener("submit", (ev) => {
  ev.preventDefault();
  attempt(async () => {
    const how = document.querySelector('input[name="how"]:checked').value;
    const body = { ...current, note: $("settle-note").value };
    if (how === "answer") {
      body.answer = {
        status: Number($("answer-status").value),
        body: parsed("answer-body", "the body") ?? null,
      };
    } else {
      body.resume = $("resume-phase").value;
      body.data = parsed("resume-data", "the data");
    }
    await api("POST", "/keys/settle", body);
    $("settle-note").value = "";
    say(`Settled ${current.key}: recorded with your name.`);
    await openKey(current);
    await refresh();
  });
});

$("forget").addEventListener("submit", (ev) => {
  ev.preventDefault();
  attempt(async () => {
    const gone = current;
    const reversed = $("effect-reversed").checked;
    await api("POST", "/keys/forget", {
      ...gone,
      reason: $("forget-reason").value,
      ...(reversed ? { effect_reversed: true } : {}),
    });
    $("forget-reason").value = "";
    await openKey(gone);
    say(`Forgot ${gone.key}: the same key is new again. Recorded with your name.`);
    await refresh();
  });
});

$("run-audit").addEventListener("click", () =>
  attempt(async () => {
    showAudit(await api("POST", "/audit"));
    await loadActions();
  }),
);

// The lists' buttons (rendered rows), by delegation.
document.addEventListener("click", (ev) => {
  const b = ev.target.closest("button");
  if (!b) return;
  if (b.dataset.open !== undefined) attempt(() => openKey({ scope: b.dataset.scope, key: b.dataset.key }));
  else if (b.dataset.requeueId)
    attempt(async () => {
      const { requeued } = await api("POST", "/outbox/requeue", { id: b.dataset.requeueId });
      say(`Requeued ${requeued} event(s).`);
      await refresh();
    });
  else if (b.dataset.requeueAggregate)
    attempt(async () => {
      const { requeued } = await api("POST", "/outbox/requeue", { aggregate_id: b.dataset.requeueAggregate });
      say(`Requeued ${requeued} event(s) of ${b.dataset.requeueAggregate}.`);
      await refresh();
    });
  else if (b.dataset.unpark)
    attempt(async () => {
      await api("POST", "/inbox/unpark", { consumer: b.dataset.consumer, message_id: b.dataset.unpark });
      say(`Unparked ${b.dataset.unpark}: its next delivery is processed again.`);
      await refresh();
    });
});

// Signed in already in this tab (a reload): carry on.
if (token) {
  $("token").value = token;
  attempt(signIn);
}
