// The laboratory page: run the simulator through the API, draw the sequence panel,
// play it back, sweep, and tour the seeds' argument, one scenario per claim.
"use strict";

const LANE_H = 34;
const LABEL_W = 92;
const $ = (id) => document.getElementById(id);

const state = {
  runs: [],        // [{summary, trace, d}] where d is what we derive for drawing
  focus: null,     // the client whose lane is focused (others dimmed), or null
  cursor: 0,
  windowMs: 3000,
  playing: false,
  lastFrame: 0,
};

// ---- what each scenario tests, and its verdict in numbers ---------------------------

// Two sentences per scenario: the claim it tests, and what the run does to test it.
const SCENARIOS = {
  "default": "Claim tested: a lease-based lock gives mutual exclusion. Fencing is off: a client that pauses past its lease wakes up and writes, and nothing stops it.",
  "fencing": "Claim tested: the resource, not the lock, is what makes the lock safe. The same seed as default with fencing on: the resource remembers the highest token it has seen and refuses lower ones.",
  "long-lease": "Misconception: “a longer lease is safer”. Four times the lease with fencing off: zombie writes become rarer, because a longer lease only needs a longer pause.",
  "renewal": "Misconception: “renewal fixes it”. The holder renews at half the lease: that saves it from pauses shorter than half a lease, and from nothing longer.",
  "network-delay": "Misconception: no pause, no zombie. No process ever stops here: a write sent inside the lease is held in the network (GitHub once saw 90 s) and lands after a newer holder wrote.",
  "idempotent": "Misconception: “just make the operation idempotent”. Every write carries an idempotency key and is sent twice, and the resource applies it once; a write computed from a stale read still writes the wrong value.",
  "clock-drift": "Misconception: any clock will do to time a lease. This lock service times leases on a wall clock that NTP or a resumed VM steps forward, so leases end early; the same seed on a monotonic clock (Clock: monotonic) is the default run.",
  "lock-delay": "Chubby's lock-delay: after a holder's lease expires, nobody gets the lock for a while (one lease here). Zombie writes become rarer, not impossible: a pause longer than lease and delay together still writes late.",
  "service-crash": "Claim tested: tokens never go back, even across a crash of the lock service. It crashes now and then and restarts from what it made durable (the server's own recovery): tokens continue above the durable ceiling.",
  "split-brain": "“Its own split-brain considerations if it is replicated”: a primary-backup lock service fails over on a timeout, without a majority. Both sides grant the lock and mint the same tokens, and the gate cannot tell the holders apart; switch Replication to majority and it never happens.",
  "partitioned": "The senior answer, first choice: “do you need a lock at all?”. Each key is owned by one worker, so nobody else ever writes it: no lock, no token, nothing lost, and no lock round trip in the way.",
  "occ": "The senior answer, second choice: no lock, a conditional write on the resource (optimistic concurrency). A write that lost the race is refused and retried; nothing is lost.",
};

/** The numbers a run is judged by, in one sentence. */
function numbers(s) {
  const parts = [];
  if (s.grants === 0) parts.push("no lock taken");
  parts.push(`${s.zombie_writes} zombie writes`, `${s.lost_updates} lost updates`);
  if (s.scenario === "occ") parts.push(`${s.stale_writes_rejected} conflicts refused`);
  else if (s.fencing) parts.push(`${s.stale_writes_rejected} stale writes refused`);
  if (s.delayed_messages !== undefined) parts.push(`${s.delayed_messages} messages held in the network, no process paused`);
  if (s.duplicates_absorbed !== undefined) parts.push(`${s.duplicates_absorbed} duplicate writes absorbed`);
  if (s.writes_per_s !== undefined) parts.push(`${s.writes_per_s} writes/s`);
  if (s.lock_delay_ms !== undefined) parts.push(`lock-delay ${s.lock_delay_ms} ms`);
  if (s.clock !== undefined) parts.push(`${s.clock} clock: ${s.clock_steps} steps, ${s.early_expiries} leases ended early`);
  if (s.service_crashes !== undefined) parts.push(`${s.service_crashes} service crashes, ${s.token_regressions} token regressions`);
  if (s.replication !== undefined) parts.push(`${s.replication}: ${s.failovers} failovers, ${s.duplicate_tokens} tokens granted twice`);
  return parts.join(", ");
}

function showClaim() {
  $("claim").textContent = SCENARIOS[$("scenario").value] || "";
  for (const l of document.querySelectorAll("label[data-for]")) l.hidden = l.dataset.for !== $("scenario").value;
}

function showClaimVerdict() {
  const v = $("claim-verdict");
  const runs = state.runs;
  if (!runs.length) { v.textContent = ""; return; }
  const s0 = runs[0].summary;
  const head = `Verdict, seed ${s0.seed}, ${s0.clients} clients, ${s0.duration_ms / 1000} s: `;
  const each = runs.map((r) => `${runs.length > 1 || r.summary.grants > 0 ? `fencing ${r.summary.fencing ? "on" : "off"}: ` : ""}${numbers(r.summary)}`);
  v.textContent = `${head}${each.join("; ")}. ${runs.every((r) => r.summary.safe) ? "Safe." : "Unsafe."}`;
  v.className = `claim-verdict ${runs.every((r) => r.summary.safe) ? "good" : "bad"}`;
  v.dataset.scenario = s0.scenario;
}

// ---- deriving what to draw from a trace -------------------------------------------

function derive(summary, trace) {
  const bars = [];          // lease bars: {client, token, t0, t1, end}
  const open = new Map();   // token -> bar
  const pauses = [];
  const counts = [];        // cumulative counters after each record
  let c = { grants: 0, late: 0, zombie: 0, rejected: 0, lostNet: 0 };
  let firstZombie = null, firstRejected = null, firstLost = null;
  const holders = new Map(); // token -> clients granted it (a split brain grants one twice)
  for (const r of trace) {
    if (r.kind === "granted") {
      c = { ...c, grants: c.grants + 1 };
      const twice = holders.get(r.token) || [];
      holders.set(r.token, [...twice, r.client]);
      const bar = { client: r.client, token: r.token, t0: r.t_ms, t1: summary.duration_ms, end: "open", twin: twice.length > 0 };
      bars.push(bar);
      open.set(r.token, bar);
    } else if (r.kind === "expired" || r.kind === "released") {
      const bar = open.get(r.token);
      if (bar) { bar.t1 = r.t_ms; bar.end = r.kind; open.delete(r.token); }
    } else if (r.kind === "pause") {
      pauses.push(r);
    } else if (r.kind === "write") {
      c = { ...c };
      if (r.late) c.late += 1;
      if (r.zombie) { c.zombie += 1; if (!firstZombie) firstZombie = r; }
      if (r.outcome === "rejected") { c.rejected += 1; if (!firstRejected) firstRejected = r; }
      if (r.outcome === "accepted") c.lostNet += r.value_before + 1 - r.value;
      if (r.outcome === "accepted" && r.value < r.value_before + 1 && !r.zombie && !firstLost) {
        firstLost = { ...r, twins: holders.get(r.token) || [] };
      }
    }
    counts.push(c);
  }
  return { bars, pauses, counts, firstZombie, firstRejected, firstLost };
}

/** Index of the last record at or before t (-1 for none). */
function lastAt(trace, t) {
  let lo = 0, hi = trace.length - 1, ans = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (trace[mid].t_ms <= t) { ans = mid; lo = mid + 1; } else hi = mid - 1;
  }
  return ans;
}

// ---- running ------------------------------------------------------------------------

function request() {
  const num = (id) => { const v = $(id).value.trim(); return v === "" ? undefined : Number(v); };
  const body = {
    scenario: $("scenario").value,
    seed: num("seed"),
    clients: num("clients"),
    lease_ms: num("lease"),
    pauses: $("pauses").value || undefined,
    duration_ms: num("duration") === undefined ? undefined : Math.round(num("duration") * 1000),
  };
  const renew = num("renew");
  if (renew !== undefined && renew > 0) body.renew_fraction = renew;
  if ($("fencing").value) body.fencing = $("fencing").value === "on";
  if ($("compare").checked) { body.compare = true; delete body.fencing; }
  if (body.scenario === "split-brain") body.replication = $("replication").value;
  if (body.scenario === "clock-drift") body.clock = $("service-clock").value;
  return body;
}

async function run() {
  Fenced.banner(null);
  const button = $("run");
  button.disabled = true;
  button.textContent = "Running…";
  try {
    const data = await Fenced.call("POST", "/v1/sim/runs", request());
    state.runs = data.runs.map((r) => ({ summary: r.summary, trace: r.trace, d: derive(r.summary, r.trace) }));
    const dur = state.runs[0].summary.duration_ms;
    $("scrub").max = String(dur);
    setCursor(dur);
    layoutPanels();
    draw();
    return state.runs;
  } catch (e) {
    Fenced.banner(`The simulation was refused: ${e.message}`);
    throw e;
  } finally {
    button.disabled = false;
    button.textContent = "Run";
  }
}

// ---- panels ---------------------------------------------------------------------------

function layoutPanels() {
  const host = $("panels");
  host.replaceChildren();
  host.classList.toggle("two", state.runs.length > 1);
  state.runs.forEach((run, i) => {
    const s = run.summary;
    const title = state.runs.length > 1 ? `fencing ${s.fencing ? "on" : "off"}` : `${s.scenario}, seed ${s.seed}`;
    const panel = Fenced.el("article", { class: "panel", "data-fencing": s.fencing ? "on" : "off" });
    panel.append(
      Fenced.el("h2", {}, title),
      Fenced.el("div", { class: "counters", id: `counters-${i}` }),
      Fenced.el("p", { class: "panel-verdict", id: `verdict-${i}` }),
      Fenced.el("div", { class: "seq", id: `seq-${i}` }),
    );
    host.append(panel);
  });
}

function setCursor(t) {
  const max = state.runs.length ? state.runs[0].summary.duration_ms : 0;
  state.cursor = Math.max(0, Math.min(max, Math.round(t)));
  $("scrub").value = String(state.cursor);
  $("clock").textContent = `t = ${state.cursor} ms`;
}

function draw() {
  state.runs.forEach((run, i) => {
    drawCounters(run, i);
    drawPanel(run, $(`seq-${i}`));
  });
  drawVerdict();
  showClaimVerdict();
}

function drawCounters(run, i) {
  const idx = lastAt(run.trace, state.cursor);
  const c = idx >= 0 ? run.d.counts[idx] : { grants: 0, late: 0, zombie: 0, rejected: 0, lostNet: 0 };
  const items = [
    ["grants", c.grants, ""],
    ["late writes", c.late, ""],
    ["zombie writes", c.zombie, c.zombie > 0 ? "bad" : "good"],
    ["stale writes rejected", c.rejected, c.rejected > 0 ? "note" : ""],
    ["lost updates", Math.max(0, c.lostNet), c.lostNet > 0 ? "bad" : "good"],
  ];
  const host = $(`counters-${i}`);
  host.replaceChildren(...items.map(([k, v, cls]) =>
    Fenced.el("div", { class: `counter ${cls}`, "data-counter": k.replace(/ /g, "_") },
      Fenced.el("span", { class: "v" }, String(v)), Fenced.el("span", { class: "k" }, k))));
  const s = run.summary;
  const v = $(`verdict-${i}`);
  v.textContent = s.safe
    ? `Safe over the whole run: ${s.stale_writes_rejected} stale writes refused, final counter ${s.final_value}.`
    : `Unsafe over the whole run: ${s.zombie_writes} zombie writes, ${s.lost_updates} lost updates.`;
  v.className = `panel-verdict ${s.safe ? "good" : "bad"}`;
}

function drawVerdict() {
  const v = $("verdict");
  v.replaceChildren();
  const bad = state.runs.find((r) => !r.summary.safe);
  if (!bad) {
    const rej = state.runs.map((r) => r.d.firstRejected).find((x) => x);
    v.className = "verdict good";
    v.append("Safe: no zombie write, no lost update.");
    if (rej) {
      v.append(` The gate refused a stale write at t=${rej.t_ms} ms (c${rej.client}, token ${rej.token}). `);
      v.append(jumpLink(rej.t_ms, "Show the refusal", "jump-rejected"));
    }
    return;
  }
  const z = bad.d.firstZombie;
  v.className = "verdict bad";
  if (z) {
    v.append(`Unsafe: first zombie write at t=${z.t_ms} ms: c${z.client} wrote ${z.value} with token ${z.token} after a newer holder touched the resource. `);
    v.append(jumpLink(z.t_ms, "Show the violation", "jump-violation"));
  } else if (bad.d.firstLost) {
    const l = bad.d.firstLost;
    const others = l.twins.filter((c) => c !== l.client).map((c) => `c${c}`);
    v.append(`Unsafe: ${bad.summary.lost_updates} lost updates without a zombie write. The first at t=${l.t_ms} ms: c${l.client} wrote ${l.value} with token ${l.token} over ${l.value_before}${others.length ? `, a token ${others.join(" and ")} held too` : ""}; the gate saw nothing older. `);
    v.append(jumpLink(l.t_ms, "Show the lost update", "jump-lost"));
  } else {
    v.append(`Unsafe: ${bad.summary.lost_updates} lost updates.`);
  }
}

function jumpLink(t, text, id) {
  const a = Fenced.el("a", { href: "#", id, class: "jump" }, text);
  a.addEventListener("click", (e) => { e.preventDefault(); stop(); setCursor(t + 40); draw(); });
  return a;
}

function laneNames(s) {
  const names = ["lock service"];
  for (let c = 0; c < s.clients; c++) names.push(`c${c}`);
  names.push("resource");
  return names;
}

function drawPanel(run, host) {
  const s = run.summary;
  const width = Math.max(320, host.clientWidth || 800);
  const names = laneNames(s);
  const height = names.length * LANE_H + 26;
  const plotW = width - LABEL_W - 10;
  const t1 = Math.max(state.cursor + state.windowMs * 0.3, state.windowMs);
  const t0 = t1 - state.windowMs;
  const x = (t) => LABEL_W + ((t - t0) / state.windowMs) * plotW;
  const laneY = (i) => 14 + i * LANE_H + LANE_H / 2;
  const lockY = laneY(0), resY = laneY(names.length - 1), cy = (c) => laneY(1 + c);
  const svg = Fenced.svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "seq-svg", role: "img",
    "aria-label": `Sequence panel, ${s.scenario}, fencing ${s.fencing ? "on" : "off"}` });
  svg._labels = []; // labels placed so far, for folding the ones that would overlap
  svg._focus = state.focus;
  // Lanes. A client's lane label focuses that lane (click again to unfocus).
  names.forEach((n, i) => {
    const client = i >= 1 && i <= s.clients ? i - 1 : null;
    const focused = client !== null && client === state.focus;
    svg.append(Fenced.svg("line", { x1: LABEL_W, x2: width - 10, y1: laneY(i), y2: laneY(i), class: `lane${focused ? " focused" : ""}` }));
    const label = Fenced.svg("text", { x: 8, y: laneY(i) + 4, class: `lane-label${client !== null ? " focusable" : ""}${focused ? " focused" : ""}`, "data-lane": n });
    label.textContent = n;
    if (client !== null) {
      label.addEventListener("click", () => { state.focus = state.focus === client ? null : client; draw(); });
      tip(label, focused ? `show every lane again` : `focus on ${n}: dim what the other clients do`);
    }
    svg.append(label);
  });
  const dim = (client) => (state.focus !== null && client !== state.focus ? " dim" : "");
  const visible = (a, b) => b >= t0 && a <= Math.min(t1, state.cursor);
  const clip = (t) => Math.max(t0, Math.min(t, state.cursor, t1));
  // Lease bars and pauses.
  for (const b of run.d.bars) {
    if (!visible(b.t0, b.t1)) continue;
    const r = Fenced.svg("rect", { x: x(clip(b.t0)), y: cy(b.client) - 7, width: Math.max(1, x(clip(b.t1)) - x(clip(b.t0))), height: 14, rx: 3, class: `lease ${b.end}${b.twin ? " twin" : ""}${dim(b.client)}` });
    tip(r, `lease of token #${b.token}, c${b.client}: granted ${b.t0} ms, ${b.end === "open" ? "still held" : `${b.end} ${b.t1} ms`}${b.twin ? "; this token was granted before, to another holder" : ""}`);
    svg.append(r);
    if (x(clip(b.t1)) - x(clip(b.t0)) > 30) {
      const t = Fenced.svg("text", { x: x(clip(b.t0)) + 3, y: cy(b.client) + 4, class: "lease-label" });
      t.textContent = `#${b.token}`;
      svg.append(t);
    }
  }
  for (const p of run.d.pauses) {
    const end = p.t_ms + p.duration_ms;
    if (!visible(p.t_ms, end)) continue;
    const r = Fenced.svg("rect", { x: x(clip(p.t_ms)), y: cy(p.client) - 14, width: Math.max(2, x(clip(end)) - x(clip(p.t_ms))), height: 28, class: `pause${dim(p.client)}` });
    tip(r, `c${p.client} paused ${p.duration_ms} ms (${p.cause})`);
    svg.append(r);
  }
  // Arrows and marks, up to the cursor.
  const g = { x, lockY, resY, height, t0 };
  const from = lastAt(run.trace, t0 - 1) + 1;
  for (let i = from; i < run.trace.length; i++) {
    const r = run.trace[i];
    if (r.t_ms > state.cursor || r.t_ms > t1) break;
    drawRecord(svg, r, cy(r.client), g);
  }
  // The cursor.
  if (state.cursor >= t0 && state.cursor <= t1) {
    svg.append(Fenced.svg("line", { x1: x(state.cursor), x2: x(state.cursor), y1: 4, y2: height - 18, class: "cursor" }));
  }
  const axis = Fenced.svg("text", { x: LABEL_W, y: height - 4, class: "axis" });
  axis.textContent = `${Math.max(0, Math.round(t0))} ms`;
  const axis2 = Fenced.svg("text", { x: width - 10, y: height - 4, class: "axis", "text-anchor": "end" });
  axis2.textContent = `${Math.round(t1)} ms`;
  svg.append(axis, axis2);
  host.replaceChildren(svg);
}

/** One trace record on the panel, an arrow or a mark, `y` its client's lane; `g` the
 * panel's geometry: time to x, the lock service's and the resource's lanes, its height
 * and first instant. */
function drawRecord(svg, r, y, { x, lockY, resY, height, t0 }) {
  switch (r.kind) {
    case "acquire": arrow(svg, x(r.t_ms), y, x(r.t_ms) + 4, lockY, "acquire", r, `c${r.client} asks for the lock`); break;
    case "granted": arrow(svg, x(r.t_ms), lockY, x(r.t_ms) + 4, y, "grant", r, `granted token #${r.token} to c${r.client}`, `#${r.token}`); break;
    case "keepalive": if (!r.ok) mark(svg, x(r.t_ms), lockY, "ka-lost", "?", r, `keepalive from c${r.client}: lease gone`); break;
    case "expired": {
      mark(svg, x(r.t_ms), lockY, "expired", "✕", r, `lease of token #${r.token} (c${r.client}) expired`);
      svg.append(Fenced.svg("line", { x1: x(r.t_ms), x2: x(r.t_ms), y1: lockY, y2: y, class: "expired-line" }));
      break;
    }
    case "read": {
      const cls = r.outcome === "rejected" ? "read rejected" : "read";
      arrow(svg, x(Math.max(t0, r.sent_ms)), y, x(r.t_ms), resY, cls, r,
        `${r.fenced ? "fenced read" : "read"} by c${r.client}${r.token ? ` with token #${r.token}` : ""}: ${r.outcome === "rejected" ? "refused" : `= ${r.value}`}`);
      break;
    }
    case "write": {
      const cls = r.zombie ? "write zombie" : r.outcome === "rejected" ? "write rejected" : "write";
      const what = r.zombie ? "ZOMBIE WRITE accepted" : r.outcome === "rejected" ? "REFUSED: stale token" : "accepted";
      const label = r.zombie ? "ZOMBIE" : r.outcome === "rejected" ? "✕ stale" : null;
      arrow(svg, x(Math.max(t0, r.sent_ms)), y, x(r.t_ms), resY, cls, r,
        `write ${r.value} by c${r.client}${r.token ? ` with token #${r.token}` : ""} (counter was ${r.value_before}): ${what}${r.late ? ", late" : ""}`, label);
      break;
    }
    case "crash": mark(svg, x(r.t_ms), y, "crash", "☠", r, `c${r.client} crashed`); break;
    case "duplicate": mark(svg, x(r.t_ms), resY, "duplicate", "=", r, `a second copy of c${r.client}'s write arrived: the idempotency key says applied already, nothing changes`); break;
    case "clock_step": service(svg, x(r.t_ms), lockY, height, "clock-step", "⏩", r, `the lock service's wall clock stepped forward ${r.step_ms} ms: every lease is suddenly older`); break;
    case "service_crash": service(svg, x(r.t_ms), lockY, height, "service-crash", "☠", r, "the lock service crashed: every lease and lock it held in memory is gone"); break;
    case "service_restart": service(svg, x(r.t_ms), lockY, height, "service-restart", "↻", r, "the lock service restarted from its durable state; no grant for one lease"); break;
    case "partition": service(svg, x(r.t_ms), lockY, height, "partition", "⚡", r, `the replicas are cut apart: replica ${r.replica} keeps the even clients, the others the odd ones`); break;
    case "failover": service(svg, x(r.t_ms), lockY, height, "failover", "⇆", r, `replica ${r.replica} takes over serving its side of the cut`); break;
    case "heal": service(svg, x(r.t_ms), lockY, height, "heal", "✓", r, `the cut healed: every replica follows replica ${r.replica}`); break;
    case "aborted": mark(svg, x(r.t_ms), y, "aborted", "⊘", r, `c${r.client} knew its lease was gone and skipped its write`); break;
    default: break;
  }
}

function arrow(svg, x1, y1, x2, y2, cls, r, text, label) {
  const dimmed = svg._focus !== null && svg._focus !== undefined && r.client !== svg._focus;
  const g = Fenced.svg("g", { class: `arrow ${cls}${dimmed ? " dim" : ""}`, "data-seq": r.seq, "data-t": r.t_ms });
  g.append(Fenced.svg("line", { x1, y1, x2, y2 }));
  const dir = y2 > y1 ? 1 : -1;
  g.append(Fenced.svg("path", { d: `M${x2},${y2} l-4,${-7 * dir} l8,0 z` }));
  g.append(Fenced.svg("line", { x1, y1, x2, y2, class: "hit" }));
  if (label) placeLabel(svg, g, x2 + 5, (y1 + y2) / 2, cls.split(" ")[0], label);
  tip(g, `t=${r.t_ms} ms: ${text}`);
  svg.append(g);
}

// Labels give way: one that would overlap an earlier label of the same kind (grants
// close together at a narrow scale: #48 #49 #50) folds into it as "#48 +2", whose
// data-folded attribute lists them all (each arrow's tooltip still names its own). Labels of different kinds never fold together,
// so a ZOMBIE is never hidden behind a grant.
function placeLabel(svg, g, x, y, kind, text) {
  const font = kind === "grant" ? `600 10px ${LABEL_FONT}` : `700 12px ${LABEL_FONT}`;
  const width = (s) => textWidth(font, s) + 4;
  const hit = svg._labels.find((p) => p.kind === kind && Math.abs(p.y - y) < 12 && x < p.x + p.w && x + width(text) > p.x);
  if (hit) {
    hit.more.push(text);
    hit.node.textContent = `${hit.text} +${hit.more.length}`;
    hit.w = width(hit.node.textContent);
    hit.node.classList.add("folded");
    hit.node.setAttribute("data-folded", [hit.text, ...hit.more].join(" "));
    return;
  }
  const t = Fenced.svg("text", { x, y, class: "arrow-label" });
  t.textContent = text;
  g.append(t);
  svg._labels.push({ x, y, w: width(text), kind, text, more: [], node: t });
}

// The page's font (console.css), measured on a canvas: labels fold on their true widths.
const LABEL_FONT = getComputedStyle(document.documentElement).fontFamily || "sans-serif";
const measure = document.createElement("canvas").getContext("2d");
function textWidth(font, s) {
  measure.font = font;
  return measure.measureText(s).width;
}

/** A mark on the lock service's lane for the service as a whole, with a faint rule down the panel. */
function service(svg, x, y, height, cls, glyph, r, text) {
  svg.append(Fenced.svg("line", { x1: x, x2: x, y1: y + 8, y2: height - 18, class: `service-line ${cls}` }));
  mark(svg, x, y, `service ${cls}`, glyph, r, text);
}

function mark(svg, x, y, cls, glyph, r, text) {
  const dimmed = svg._focus !== null && svg._focus !== undefined && !cls.startsWith("service") && r.client !== svg._focus;
  if (dimmed) cls += " dim";
  const t = Fenced.svg("text", { x, y: y + 5, class: `mark ${cls}`, "text-anchor": "middle", "data-seq": r.seq });
  t.textContent = glyph;
  tip(t, `t=${r.t_ms} ms: ${text}`);
  svg.append(t);
}

function tip(node, text) {
  node.addEventListener("mouseenter", (e) => { const d = $("tip"); d.textContent = text; d.hidden = false; place(e); });
  node.addEventListener("mousemove", place);
  node.addEventListener("mouseleave", () => { $("tip").hidden = true; });
}

function place(e) {
  const d = $("tip");
  d.style.left = `${Math.min(e.clientX + 12, window.innerWidth - d.offsetWidth - 8)}px`;
  d.style.top = `${e.clientY + 14}px`;
}

// ---- playing ---------------------------------------------------------------------------

function stop() {
  state.playing = false;
  $("play").textContent = "▶︎ Play";
}

function play() {
  if (!state.runs.length) return;
  if (state.playing) { stop(); return; }
  if (state.cursor >= state.runs[0].summary.duration_ms) setCursor(0);
  state.playing = true;
  $("play").textContent = "❚❚ Pause";
  state.lastFrame = performance.now();
  requestAnimationFrame(frame);
}

function frame(now) {
  if (!state.playing) return;
  const dt = now - state.lastFrame;
  state.lastFrame = now;
  setCursor(state.cursor + (dt / 1000) * (state.windowMs / 4));
  draw();
  if (state.cursor >= state.runs[0].summary.duration_ms) { stop(); return; }
  requestAnimationFrame(frame);
}

function step(dir) {
  if (!state.runs.length) return;
  stop();
  const tr = state.runs[0].trace;
  const i = lastAt(tr, state.cursor);
  if (dir > 0) {
    const next = tr.find((r, j) => j > i && r.t_ms > state.cursor);
    if (next) setCursor(next.t_ms);
  } else {
    const j = lastAt(tr, state.cursor - 1);
    if (j >= 0) setCursor(tr[j].t_ms);
  }
  draw();
}

// ---- sweep -------------------------------------------------------------------------------

async function sweep() {
  Fenced.banner(null);
  const b = $("sweep-run");
  b.disabled = true;
  b.textContent = "Sweeping…";
  try {
    const values = $("sweep-leases").value.split(",").map((x) => Number(x.trim()));
    const over = $("sweep-over").value;
    const lockless = ["occ", "partitioned"].includes($("scenario").value);
    const body = {
      over,
      // Lease sweeps keep the chosen scenario's settings; the other knobs their own
      // scenario's (lock-delay, clock-drift).
      scenario: over !== "lease" ? undefined : lockless ? "default" : $("scenario").value,
      leases: over === "lease" ? values : undefined,
      values: over === "lease" ? undefined : values,
      seeds: [Number($("sweep-from").value), Number($("sweep-to").value)],
      lease_ms: Number($("lease").value),
      duration_ms: Math.round(Number($("sweep-duration").value) * 1000),
    };
    const data = await Fenced.call("POST", "/v1/sim/sweeps", body);
    $("sweep-chart").innerHTML = data.svg;
    const t = $("sweep-table");
    const knob = { lease: "lease", "lock-delay": "lock-delay", "clock-step": "clock step" }[over];
    const value = (r) => (over === "lease" ? r.lease_ms : over === "lock-delay" ? r.lock_delay_ms : r.clock_step_ms);
    t.replaceChildren(Fenced.el("tr", {}, ...[knob, "fencing", "seeds", "zombie writes", "lost updates", "stale refused"].map((h) => Fenced.el("th", {}, h))));
    for (const r of data.rows) {
      t.append(Fenced.el("tr", { class: r.fencing === "on" ? "on" : "off" },
        ...[`${value(r)} ms`, r.fencing, r.seeds, r.zombie_writes, r.lost_updates, r.stale_writes_rejected].map((v) => Fenced.el("td", {}, String(v)))));
    }
    t.hidden = false;
  } catch (e) {
    Fenced.banner(`The sweep was refused: ${e.message}`);
  } finally {
    b.disabled = false;
    b.textContent = "Run sweep";
  }
}

// ---- the guided tour ------------------------------------------------------------------------

const TOUR = [
  {
    title: "1 · The zombie write",
    setup: { scenario: "default", fencing: "", compare: false, renew: "" },
    text: (runs) => {
      const z = runs[0].d.firstZombie;
      return z
        ? `Fencing off. c${z.client} took the lock with token ${z.token}, read the counter and stopped (look for the shaded pause). Its lease expired, the lock service gave the lock to someone else, and c${z.client} woke up and wrote anyway: the resource accepted it. The red arrow is a zombie write; both clients followed the protocol.`
        : "Fencing off: no zombie write in this run; try another seed.";
    },
    jump: (runs) => runs[0].d.firstZombie,
  },
  {
    title: "2 · Fencing on",
    setup: { scenario: "default", fencing: "", compare: true, renew: "" },
    text: () => "The same seed twice: fencing off on the left, on on the right. The pause still happens, the lease still expires, the paused client still writes. With fencing the resource has already seen a newer token and refuses the write (the orange ✕). Nothing about the lock changed; the resource did.",
    jump: (runs) => runs[1] && runs[1].d.firstRejected,
  },
  {
    title: "3 · A longer lease",
    setup: { scenario: "long-lease", fencing: "", compare: false, renew: "" },
    text: (runs) => `Four times the lease: ${runs[0].summary.zombie_writes} zombie writes in this run instead of many. Rarer, not gone: a longer lease only asks for a longer pause, and pause length is not yours to bound. Run the sweep below to see it over many seeds.`,
    jump: (runs) => runs[0].d.firstZombie,
  },
  {
    title: "4 · Renewal",
    setup: { scenario: "renewal", fencing: "", compare: false, renew: "" },
    text: (runs) => {
      const m = runs[0].summary.zombie_pause_ms_min;
      return `Renewing at half the lease survives pauses shorter than half a lease, and nothing longer: ${m ? `the shortest pause behind a zombie write here was ${m} ms, against a ${runs[0].summary.lease_ms} ms lease.` : "no zombie in this run; try other seeds."} Only the token, checked by the resource, has no such parameter.`;
    },
    jump: (runs) => runs[0].d.firstZombie,
  },
  {
    title: "5 · Network delay",
    setup: { scenario: "network-delay", fencing: "", compare: true, renew: "" },
    text: (runs) => `No process pauses here. A write sent well inside the lease sat in the network (${runs[0].summary.delayed_messages} messages were held, a few for seconds; GitHub once saw 90 s) and arrived after a newer holder wrote: ${runs[0].summary.zombie_writes} zombie writes with fencing off, ${runs[1].summary.zombie_writes} with fencing on, where the gate refused all ${runs[1].summary.stale_writes_rejected}.`,
    jump: (runs) => runs[0].d.firstZombie,
  },
  {
    title: "6 · Idempotency",
    setup: { scenario: "idempotent", fencing: "", compare: false, renew: "" },
    text: (runs) => `“Just make it idempotent.” Every write here is: it carries a key, goes out twice, and the resource absorbed ${runs[0].summary.duplicates_absorbed} second copies. Still ${runs[0].summary.lost_updates} increments were lost: idempotency makes repetition safe, it does not make a value computed from a stale read right.`,
    jump: (runs) => runs[0].d.firstZombie,
  },
  {
    title: "7 · Clocks",
    setup: { scenario: "clock-drift", fencing: "", compare: false, renew: "" },
    text: (runs) => { const s = runs[0].summary; return `The lock service times leases on a wall clock that stepped forward ${s.clock_steps} times: ${s.early_expiries} leases ended before their holders' time, and ${s.zombie_writes} zombie writes followed. On a monotonic clock the same seed is the default run; the design times leases on the monotonic clock only.`; },
    jump: (runs) => runs[0].d.firstZombie,
  },
  {
    title: "8 · The replicated lock's split brain",
    setup: { scenario: "split-brain", fencing: "on", compare: false, renew: "" },
    text: (runs) => { const s = runs[0].summary; return `Fencing on, and yet: a primary-backup lock service cut in two failed over ${s.failovers} times without a majority and granted ${s.duplicate_tokens} tokens twice. Two holders of an equal token both pass the gate: ${s.lost_updates} lost updates. The token is only as good as the service that mints it: with Replication set to majority this never happens.`; },
  },
  {
    title: "9 · The senior answer",
    setup: { scenario: "partitioned", fencing: "", compare: false, renew: "" },
    text: (runs) => { const s = runs[0].summary; return `Avoid the lock: each key owned by one worker. No grant, no token, ${s.zombie_writes} zombie writes, ${s.lost_updates} lost updates, ${s.writes_per_s} writes/s. If you cannot partition, a conditional write (scenario occ) needs no lock either; only then a lock with fencing tokens and a resource that checks them.`; },
  },
  {
    title: "Follow-up: “How do you do a distributed lock?”",
    setup: { scenario: "fencing", fencing: "", compare: false, renew: "" },
    text: (runs) => `A lease plus a fencing token, and the resource checks the token: this run has ${runs[0].summary.zombie_writes} zombie writes and refused ${runs[0].summary.stale_writes_rejected} stale writes. The token is the part that provides safety.`,
    jump: (runs) => runs[0].d.firstRejected,
  },
  {
    title: "Follow-up: “What if the holder pauses?”",
    setup: { scenario: "default", fencing: "", compare: true, renew: "" },
    text: (runs) => `Its lease expires, another client takes the lock, the paused one wakes and writes: ${runs[0].summary.zombie_writes} zombie writes without the token, ${runs[1].summary.zombie_writes} with it.`,
    jump: (runs) => runs[0].d.firstZombie,
  },
  {
    title: "Follow-up: “Would a longer lease help?”",
    setup: { scenario: "long-lease", fencing: "", compare: false, renew: "" },
    text: (runs) => `No: ${runs[0].summary.zombie_writes} zombie writes with four times the lease. The pause length is not bounded by anything you control; the sweep below shows it over many seeds.`,
    jump: (runs) => runs[0].d.firstZombie,
  },
  {
    title: "Follow-up: “Do you need a lock at all?”",
    setup: { scenario: "occ", fencing: "", compare: false, renew: "" },
    text: (runs) => `Often not. A version check on the resource: ${runs[0].summary.stale_writes_rejected} conflicts refused and retried, ${runs[0].summary.lost_updates} lost updates, no lock anywhere. Partitioning the keys (the step before) is stronger still. Reaching for that first is the senior answer.`,
  },
  {
    title: "Your turn",
    text: () => "Change the scenario, seed, lease, renewal, fencing or pause model and press Run. Hover an arrow to see its event; scrub, step or play the timeline.",
  },
];

let tourStep = 0;

async function showTour(i) {
  tourStep = i;
  const step = TOUR[i];
  $("tour").hidden = false;
  $("tour-title").textContent = step.title;
  $("tour-step").textContent = `${i + 1} / ${TOUR.length}`;
  $("tour-next").textContent = i === TOUR.length - 1 ? "Done" : "Next";
  $("tour-text").textContent = "…";
  if (step.setup) {
    $("scenario").value = step.setup.scenario;
    $("replication").value = "primary-backup";
    $("service-clock").value = "wall";
    showClaim();
    $("fencing").value = step.setup.fencing;
    $("compare").checked = step.setup.compare;
    $("renew").value = step.setup.renew;
    $("seed").value = "1";
    try {
      const runs = await run();
      const at = step.jump && step.jump(runs);
      if (at) { setCursor(at.t_ms + 40); draw(); }
    } catch (_) { /* the banner says why */ }
  }
  $("tour-text").textContent = step.text(state.runs);
}

function endTour() {
  $("tour").hidden = true;
  try { localStorage.setItem("fenced-tour-done", "1"); } catch (_) { /* private mode */ }
}

// ---- wiring --------------------------------------------------------------------------------

$("run").addEventListener("click", () => { stop(); run().catch(() => {}); });
$("scrub").addEventListener("input", (e) => { stop(); setCursor(Number(e.target.value)); draw(); });
$("play").addEventListener("click", play);
$("step").addEventListener("click", () => step(1));
$("step-back").addEventListener("click", () => step(-1));
$("zoom").addEventListener("change", (e) => { state.windowMs = Number(e.target.value); draw(); });
$("sweep-run").addEventListener("click", sweep);
$("sweep-over").addEventListener("change", (e) => {
  const knob = e.target.value;
  $("sweep-knob").textContent = { lease: "lease length", "lock-delay": "lock-delay", "clock-step": "wall-clock step" }[knob];
  $("sweep-values-label").textContent = knob === "lease" ? "Lease multiples" : "Values (ms)";
  $("sweep-leases").value = { lease: "1,2,4,8,16", "lock-delay": "0,250,500,1000,2000,4000", "clock-step": "250,500,1000,2000,4000" }[knob];
});
$("tour-next").addEventListener("click", () => (tourStep + 1 < TOUR.length ? showTour(tourStep + 1) : endTour()));
$("tour-skip").addEventListener("click", endTour);
$("tour-open").addEventListener("click", () => showTour(0));
$("scenario").addEventListener("change", showClaim);
window.addEventListener("resize", () => { if (state.runs.length) draw(); });

(function start() {
  showClaim();
  let done = false;
  try { done = localStorage.getItem("fenced-tour-done") === "1"; } catch (_) { /* private mode */ }
  if (!done && !new URLSearchParams(location.search).has("notour")) showTour(0);
  else run().catch(() => {});
})();
