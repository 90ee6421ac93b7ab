// The live page: the running server's locks, its fenced store's marks, the cluster it
// belongs to (members, leader, commit index), and its event feed, updating without
// reload.
"use strict";

const $ = (id) => document.getElementById(id);
const keys = new Map(); // key -> {highest_seen, last}
const FEED_MAX = 200;

function headers() {
  const t = $("token").value.trim() || sessionStorage.getItem("fenced-token") || "";
  return t ? { Authorization: `Bearer ${t}` } : {};
}

/** The code of an error thrown by getJson, when the server gave one. */
class ApiError extends Error {
  constructor(message, code) { super(message); this.code = code; }
}

async function getJson(path) {
  let resp;
  try { resp = await fetch(path, { headers: headers() }); } catch (e) { throw new Error(`cannot reach the server (${e.message})`); }
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { /* not JSON */ }
  if (!resp.ok) {
    const err = data && data.error;
    throw new ApiError(err ? `${err.message} (${resp.status} ${err.code})` : `HTTP ${resp.status}`, err && err.code);
  }
  return data;
}

async function refreshLocks() {
  try {
    const p = $("prefix").value;
    const data = await getJson(`/v1/locks${p ? `?prefix=${encodeURIComponent(p)}` : ""}`);
    const body = $("locks").tBodies[0];
    body.replaceChildren(...data.locks.map((l) => Fenced.el("tr", { "data-lock": l.name },
      Fenced.el("td", { class: "name" }, l.name),
      Fenced.el("td", {}, l.token === null ? "free" : `#${l.token}`),
      Fenced.el("td", { class: "holder" }, l.holder || ""),
      Fenced.el("td", {}, l.expires_in_ms === null ? (l.blocked_for_ms ? `lock-delay ${l.blocked_for_ms} ms` : "") : `${(l.expires_in_ms / 1000).toFixed(1)} s`),
      Fenced.el("td", {}, String(l.waiters)))));
    $("locks-empty").hidden = data.locks.length > 0;
    Fenced.banner(null);
  } catch (e) {
    Fenced.banner(`The server answered with an error: ${e.message}`);
  }
}

/** The store's keys with their marks, as the server has them. */
async function refreshKeys() {
  try {
    const data = await getJson("/v1/store?limit=200");
    for (const k of data.keys) {
      const seen = keys.get(k.key);
      const last = k.value_bytes === null ? "fenced read only" : `${k.value_bytes} bytes`;
      keys.set(k.key, { highest_seen: k.highest_seen, last: seen ? seen.last : last, rejected: seen && seen.rejected });
    }
    renderKeys();
  } catch (e) {
    Fenced.banner(`The server answered with an error: ${e.message}`);
  }
}

/** The members as this server sees them, the leader, the term and the commit index. */
async function refreshCluster() {
  try {
    const c = await getJson("/v1/cluster");
    const one = c.members.length === 1 ? " (a cluster of one)" : "";
    $("cluster-summary").textContent =
      `leader ${c.leader_id === null ? "none" : `#${c.leader_id}`}${one}, term ${c.term}, commit index ${c.commit_index === null ? "none" : c.commit_index}; this server is #${c.id}`;
    $("members").tBodies[0].replaceChildren(...c.members.map((m) => Fenced.el("tr", { "data-member": String(m.id), class: m.role },
      Fenced.el("td", {}, `#${m.id}${m.id === c.id ? " (this)" : ""}`),
      Fenced.el("td", { class: m.role === "leader" ? "good" : "" }, m.role),
      Fenced.el("td", { class: "name" }, m.url),
      Fenced.el("td", {}, m.last_log_index === null ? "" : String(m.last_log_index)))));
  } catch (e) {
    $("cluster-summary").textContent = `unknown: ${e.message}`;
  }
}

function renderKeys() {
  const body = $("keys").tBodies[0];
  const rows = [...keys.entries()].sort((a, b) => a[0].localeCompare(b[0]));
  body.replaceChildren(...rows.map(([k, v]) => Fenced.el("tr", { "data-key": k },
    Fenced.el("td", { class: "name" }, k), Fenced.el("td", {}, `#${v.highest_seen}`), Fenced.el("td", { class: v.rejected ? "bad" : "" }, v.last))));
  $("keys-empty").hidden = rows.length > 0;
}

function onEvent(kind, data) {
  let text;
  switch (kind) {
    case "granted": text = `granted ${data.name} with token #${data.token}${data.holder ? ` to ${data.holder}` : ""} (ttl ${data.ttl_ms} ms)`; break;
    case "released": text = `released ${data.name} #${data.token} (${data.reason})`; break;
    case "expired": text = `lease expired: ${data.name} #${data.token}`; break;
    case "store_accepted":
      text = `store ${data.op} ${data.key} with #${data.token}: accepted`;
      keys.set(data.key, { highest_seen: Math.max(data.token, (keys.get(data.key) || { highest_seen: 0 }).highest_seen || 0), last: `${data.op} #${data.token} accepted` });
      renderKeys();
      break;
    case "store_rejected":
      text = `store ${data.op} ${data.key} with #${data.token}: REJECTED, highest_seen #${data.highest_seen}`;
      keys.set(data.key, { highest_seen: data.highest_seen, last: `${data.op} #${data.token} rejected`, rejected: true });
      renderKeys();
      break;
    default: return;
  }
  const li = Fenced.el("li", { class: `ev ${kind}` }, Fenced.el("time", {}, `${data.at_ms} ms`), " ", text);
  const feed = $("feed");
  feed.prepend(li);
  while (feed.children.length > FEED_MAX) feed.lastChild.remove();
  if (kind === "granted" || kind === "released" || kind === "expired") refreshLocks();
}

/** How many recent events the page opens with (the server's `?tail=`). */
const TAIL = 50;

/**
 * Server-sent events over fetch, so that a bearer token can go with them. The page
 * opens with the last events the server holds (`?tail=`), remembers the position the
 * server tells (each event's `id:`, and position markers), and resumes exactly after it
 * on a reconnect (`?since=`): nothing is missed or shown twice. When the server no
 * longer holds the events after it (410 `compacted`), the page says so and starts over
 * with the recent events.
 */
async function follow() {
  let position = null;
  for (;;) {
    try {
      const query = position === null ? `tail=${TAIL}` : `since=${position}`;
      const resp = await fetch(`/v1/events?${query}`, { headers: { ...headers(), Accept: "text/event-stream" } });
      if (resp.status === 410) {
        const body = await resp.json().catch(() => ({}));
        const oldest = body.error && body.error.oldest_index;
        notice(`events after #${position} are no longer held (oldest #${oldest}): some were missed`);
        position = null;
        refreshLocks();
        continue;
      }
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      $("status").textContent = "live";
      $("status").className = "status good";
      const reader = resp.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true }).replace(/\r/g, "");
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let kind = "message", data = "", id = null;
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) kind = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
            else if (line.startsWith("id:")) id = Number(line.slice(3).trim());
          }
          if (kind === "lagged") notice("this page fell behind the server and missed some events");
          else if (data) { try { onEvent(kind, JSON.parse(data)); } catch (_) { /* not an event */ } }
          if (id !== null && Number.isFinite(id)) position = position === null ? id : Math.max(position, id);
        }
      }
    } catch (e) {
      $("status").textContent = `reconnecting (${e.message})`;
      $("status").className = "status bad";
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

/** A line in the feed that is not an event: something the reader should know. */
function notice(text) {
  const feed = $("feed");
  feed.prepend(Fenced.el("li", { class: "ev notice" }, text));
  while (feed.children.length > FEED_MAX) feed.lastChild.remove();
}

$("token").addEventListener("change", () => { sessionStorage.setItem("fenced-token", $("token").value.trim()); refreshLocks(); refreshKeys(); });
$("prefix").addEventListener("input", refreshLocks);
refreshLocks();
refreshKeys();
refreshCluster();
setInterval(refreshLocks, 1000);
setInterval(refreshKeys, 2000);
setInterval(refreshCluster, 1000);
follow();
