// The playground page: no framework, no build step. It talks to the real service through
// /playground/api/pay (one attempt, with a fault) and /playground/api/state (polled every 500 ms).

const $ = (id) => document.getElementById(id);

/** The current payment intent: its key (made when the intent begins), amount and card. */
let intent = null;
let attemptNo = 0;

function newKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  // Plain-HTTP pages on a non-local host have no randomUUID: build a v4 UUID by hand.
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

const short = (s) => (s ? `${String(s).slice(0, 8)}…` : "-");
const money = (cents) => `${(cents / 100).toFixed(2)} EUR`;
/** "1 charge", "2 charges". */
const count = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
const esc = (s) =>
  String(s).replace(
    /[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c],
  );

function chosenFault() {
  const on = document.querySelector('input[name="fault"]:checked');
  return on ? on.value : "none";
}

// The switches are one at a time: turning one on turns the others off.
for (const box of document.querySelectorAll('input[name="fault"]')) {
  box.addEventListener("change", () => {
    if (!box.checked) return;
    for (const other of document.querySelectorAll('input[name="fault"]'))
      if (other !== box) other.checked = false;
  });
}

function amountCents() {
  const v = Math.round(Number($("amount").value) * 100);
  return Number.isInteger(v) && v > 0 ? v : 5000;
}

function setIntent(next) {
  intent = next;
  $("current-key").textContent = intent ? intent.key : "none yet: press Pay";
  $("retry").disabled = !intent;
}

/** Explain what the client saw, in a sentence. */
function explain(r) {
  if (!r.answered) {
    return r.silence === "reply lost"
      ? "No answer: the server did the work, but its reply was lost on the way. Did it charge? Retry with the same key: it is safe."
      : "No answer: the server crashed after the provider charged the card, before it recorded that. Retry once the lease has expired: the provider gets the same key and charges nothing new.";
  }
  const type = r.body && typeof r.body === "object" ? String(r.body.type || "") : "";
  if (r.status === 201 && r.replayed)
    return "Replayed: the saved reply, byte for byte (Idempotent-Replayed: true). Nothing was done again.";
  if (r.status === 201) return "Paid.";
  if (r.status === 402 && r.replayed) return "Declined, replayed: the decline was saved as a final answer.";
  if (r.status === 402) return "Declined. A final answer: it is saved, and a retry gets the same decline.";
  if (type.endsWith("lease-lost"))
    return "This worker was too slow: its lease expired and another attempt took the key over. Its write was refused (fenced by the lease token); nothing was done twice.";
  if (r.status === 409)
    return `Another attempt holds the key's lease: retry after ${r.retryAfter ?? "a few"} s (Retry-After).`;
  if (r.status === 422)
    return "Same key, different body: refused and not saved. A new request needs a new key.";
  if (r.status === 503) return "The provider did not answer; the lease was freed. Retry with the same key.";
  return r.body && typeof r.body === "object" && r.body.detail ? String(r.body.detail) : "";
}

/**
 * What the client may do next, read from the answer itself (issue 18's fields): `operation_state`,
 * `retry_same_key`, `safe_new_key` and `operation_ref` of a problem, or its Idempotency-Operation-State
 * header. Returns { state, next, text }; `next` is one of done, wait, retry, new-key, person, stop.
 */
function nextStep(r) {
  if (!r.answered) {
    return {
      state: "unknown",
      next: "retry",
      text: "The client cannot know: retry with the same key (never a new one: it might pay twice).",
    };
  }
  const p = r.body && typeof r.body === "object" ? r.body : {};
  const state = typeof p.operation_state === "string" ? p.operation_state : r.operationState;
  if (r.status >= 200 && r.status < 300) {
    return {
      state: state || "done",
      next: "done",
      text: "Done: nothing more to do. A retry with the same key replays this.",
    };
  }
  if (!state) {
    return {
      state: "not said",
      next: "stop",
      text: "The answer does not say where the operation stands: stop and look.",
    };
  }
  const ref = typeof p.operation_ref === "string" ? p.operation_ref : null;
  if (state === "uncertain") {
    return {
      state,
      next: "person",
      text: `Do not retry, with either key: call a person with operation_ref ${ref ?? "(none given)"}.`,
    };
  }
  if (p.retry_same_key === true && state === "in_progress") {
    return {
      state,
      next: "wait",
      text: `Wait ${r.retryAfter ?? "a few"} s (Retry-After), then retry with the same key. A new key is not safe: the first attempt may still pay.`,
    };
  }
  if (p.retry_same_key === true) {
    return {
      state,
      next: "retry",
      text: `Retry with the same key${p.safe_new_key === true ? " (a new key is safe too: nothing was done)" : ""}.`,
    };
  }
  if (p.safe_new_key === true) {
    return {
      state,
      next: "new-key",
      text:
        state === "failed_not_applied"
          ? "Retrying this key gets the same answer. A new key is safe: nothing was charged, so a new payment cannot pay twice."
          : "Retrying this key gets the same answer. A new key is safe for a new request: this one did nothing.",
    };
  }
  return {
    state,
    next: "stop",
    text: `Neither a retry nor a new key is safe: stop${ref ? ` and look up operation_ref ${ref}` : ""}.`,
  };
}

function kindOf(r) {
  if (!r.answered) return "silent";
  if (r.replayed) return "replay";
  if (r.status >= 200 && r.status < 300) return "ok";
  return "bad";
}

const LABELS = {
  none: "",
  "lose-reply": "fault: lose the reply",
  "crash-after-charge": "fault: crash after the provider charged",
  "slow-worker": "fault: slow worker",
};

/**
 * The slow-worker attempt while it stalls ({ n, key }), or null. While it stalls the page prompts the
 * user to press Retry: that is what shows the story (409 while the lease holds, then a takeover, and
 * the slow worker fenced off when it wakes). Without a retry it just ends in 201.
 */
let stalling = null;

function showPrompt(row) {
  const p = $("prompt");
  const on = stalling && intent && stalling.key === intent.key;
  p.hidden = !on;
  $("retry").classList.toggle("nudge", Boolean(on));
  if (!on) return;
  const expired = row?.lease_token && row.lease_left_ms <= 0;
  p.dataset.lease = expired ? "expired" : "held";
  p.textContent = expired
    ? `Attempt #${stalling.n} is still stalled and its lease has expired: press Retry (same key) now. The retry takes the key over and pays once; the slow worker is refused when it wakes.`
    : `Attempt #${stalling.n} is stalled past its lease (it wakes in a few seconds). Press Retry (same key) while it stalls: 409 while its lease holds (watch "lease" in the key's row); once the lease has expired, the retry takes the key over.`;
}

/** Send one attempt and show it in the list (pending at once, filled in when it ends). */
async function attempt(label, body) {
  const n = ++attemptNo;
  const li = document.createElement("li");
  li.dataset.n = String(n);
  li.dataset.kind = "pending";
  li.setAttribute("data-testid", "attempt");
  const fault = LABELS[body.fault] ? ` · ${LABELS[body.fault]}` : "";
  li.innerHTML =
    `<div class="what">#${n} ${esc(label)} · key <code>${esc(short(body.key))}</code> · ${money(body.amount_cents)}` +
    `${body.card === "4000000000000002" ? " · declined card" : ""}${esc(fault)}</div>` +
    `<div class="saw">waiting…</div><div class="why"></div>` +
    `<div class="next" data-testid="next"></div>`;
  $("attempts").prepend(li);
  if (body.fault === "slow-worker") {
    stalling = { n, key: body.key };
    showPrompt(null);
  }
  let r;
  try {
    const res = await fetch("/playground/api/pay", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    r = await res.json();
    if (!res.ok) throw new Error(r.detail || `HTTP ${res.status}`);
  } catch (err) {
    li.dataset.kind = "bad";
    li.querySelector(".saw").textContent = `the playground failed: ${err.message}`;
    return;
  } finally {
    if (stalling?.n === n) {
      stalling = null;
      showPrompt(null);
    }
  }
  li.dataset.kind = kindOf(r);
  li.dataset.status = r.answered ? String(r.status) : "none";
  li.dataset.replayed = String(Boolean(r.replayed));
  const saw = r.answered
    ? `${r.status}${r.replayed ? ' <span class="badge">Idempotent-Replayed: true</span>' : ""}` +
      (r.retryAfter ? ` <span class="badge">Retry-After: ${esc(r.retryAfter)}</span>` : "")
    : `no answer <span class="badge">${esc(r.silence)}</span>`;
  li.querySelector(".saw").innerHTML = `${saw} <span class="what">${r.ms} ms</span>`;
  li.querySelector(".why").textContent =
    body.fault === "slow-worker" && r.status === 201 && !r.replayed
      ? "Paid, late: the slow worker woke up and finished, because no retry took its key over while it stalled. Pay again with this fault and press Retry during the stall to see the takeover."
      : explain(r);
  const step = nextStep(r);
  const next = li.querySelector(".next");
  next.dataset.next = step.next;
  next.dataset.state = step.state;
  next.innerHTML = `<span class="badge">operation_state: ${esc(step.state)}</span> <b>Next:</b> ${esc(step.text)}`;
}

$("pay").addEventListener("click", () => {
  const fault = chosenFault();
  if (fault === "wrong-body") {
    if (!intent) {
      alert("Pay once first: the wrong-body fault reuses the current key.");
      return;
    }
    // The same key, another amount: the server must refuse it, whatever the first one became.
    attempt("Pay, wrong body", { ...intent, amount_cents: intent.amount_cents + 100, fault: "none" });
    return;
  }
  const card = $("card").value;
  setIntent({ key: newKey(), amount_cents: amountCents(), card });
  attempt("Pay", { ...intent, fault });
});

$("double").addEventListener("click", () => {
  setIntent({ key: newKey(), amount_cents: amountCents(), card: $("card").value });
  attempt("Double-tap 1", { ...intent, fault: "none" });
  attempt("Double-tap 2", { ...intent, fault: "none" });
});

$("retry").addEventListener("click", () => {
  if (intent) attempt("Retry", { ...intent, fault: "none" });
});

// ---- live views ------------------------------------------------------------------------------------

function leaseText(row) {
  if (!row?.lease_token) return { text: "free (nobody works on the key)", cls: "" };
  const secs = (Math.abs(row.lease_left_ms) / 1000).toFixed(1);
  return row.lease_left_ms > 0
    ? { text: `held by ${short(row.lease_token)}, ${secs} s left`, cls: "lease-held" }
    : {
        text: `expired ${secs} s ago (token ${short(row.lease_token)}): free to take over`,
        cls: "lease-expired",
      };
}

function render(s) {
  const row = s.row;
  showPrompt(row);
  const point = row ? row.recovery_point : null;
  const order = ["started", "charged", "done"];
  const at = order.indexOf(point);
  for (const li of $("points").children) {
    const i = order.indexOf(li.dataset.point);
    li.className = i === at ? "now" : at > i ? "past" : "";
  }
  $("key-point").textContent = !s.key ? "-" : row ? point : "no row (nothing claimed for this key)";
  $("key-status").textContent = row && row.status !== null ? String(row.status) : "-";
  const lease = leaseText(row);
  $("key-lease").textContent = row ? lease.text : "-";
  $("key-lease").className = lease.cls;
  $("payments").textContent = !s.key
    ? "-"
    : s.payments.length === 0
      ? "no payment for this key"
      : s.payments.map((p) => `${p.id} · ${money(p.amount_cents)} · ${p.status}`).join("; ");
  $("payments").dataset.count = String(s.payments.length);

  const ch = s.charges;
  if (ch.error) {
    $("charges-count").textContent = ch.error;
  } else {
    $("charges-count").textContent = s.key
      ? `${count(ch.forKey.length, "charge")} for this key (${ch.total} for the account)`
      : `${count(ch.total, "charge")} for the account`;
    $("charges-count").dataset.count = String(ch.forKey.length);
    const mine = new Set(ch.forKey.map((c) => c.id));
    $("charges").innerHTML = ch.recent
      .map(
        (c) =>
          `<tr class="${mine.has(c.id) ? "mine" : ""}"><td>${esc(c.id)}</td><td>${money(c.amount)}</td>` +
          `<td>${esc(c.idempotency_key ?? "")}</td><td>${esc(c.status)}${c.failure_code ? ` (${esc(c.failure_code)})` : ""}</td></tr>`,
      )
      .join("");
  }

  const ob = s.outbox;
  $("outbox-count").textContent = s.key
    ? `${count(ob.forKey.length, "receipt-email event")} for this key's payment`
    : `${count(ob.recent.length, "recent receipt-email event")}`;
  $("outbox-count").dataset.count = String(ob.forKey.length);
  const mineOb = new Set(ob.forKey.map((o) => o.id));
  $("outbox").innerHTML = ob.recent
    .map(
      (o) =>
        `<tr class="${mineOb.has(o.id) ? "mine" : ""}"><td>${esc(short(o.id))}</td><td>${esc(o.payment ?? "")}</td>` +
        `<td>${o.published_at ? esc(o.published_at) : "not yet (waiting for the relay)"}</td></tr>`,
    )
    .join("");

  const em = s.emails;
  $("emails").dataset.worker = String(em.worker);
  $("emails").dataset.count = String(em.forKey.length);
  $("emails").innerHTML = em.worker
    ? `<p class="count">${count(em.forKey.length, "email")} for this key's payment (${em.total} in all)</p>` +
      `<div class="scroll"><table><thead><tr><th>email</th><th>payment</th><th>amount</th><th>sent</th></tr></thead><tbody>${em.recent
        .map((e) =>
          e.payment_id
            ? `<tr class="${e.payment_id === s.payments[0]?.id ? "mine" : ""}"><td>${esc(short(e.message_id))}</td>` +
              `<td>${esc(e.payment_id)}</td><td>${money(e.amount_cents)}</td><td>${esc(e.sent_at)}</td></tr>`
            : `<tr><td colspan="4">${esc(JSON.stringify(e))}</td></tr>`,
        )
        .join("")}</tbody></table></div>`
    : '<p class="note">No email worker: the receipts wait in the outbox above (published: not yet) until a relay and a receipt worker run.</p>';
}

async function poll() {
  try {
    const q = intent ? `?key=${encodeURIComponent(intent.key)}` : "";
    const res = await fetch(`/playground/api/state${q}`);
    if (res.ok) {
      const s = await res.json();
      // Ignore a late answer about a key that is no longer the current one.
      if ((s.key ?? null) === (intent ? intent.key : null)) render(s);
    }
  } catch {
    // the service is restarting: try again at the next tick
  }
  setTimeout(poll, 500);
}
poll();
