// Shared by the console's pages: calling the API and showing its errors.
"use strict";

const Fenced = {
  /** Calls the API; resolves to parsed JSON, rejects with the server's own message. */
  async call(method, path, body) {
    const init = { method, headers: {} };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (e) {
      throw new Error(`cannot reach the server (${e.message})`);
    }
    const text = await resp.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { /* not JSON */ }
    if (!resp.ok) {
      const err = data && data.error;
      const msg = err ? `${err.message} (${resp.status} ${err.code})` : `HTTP ${resp.status}`;
      throw new Error(msg);
    }
    return data;
  },

  banner(message) {
    const b = document.getElementById("banner");
    if (!message) { b.hidden = true; b.textContent = ""; return; }
    b.textContent = message;
    b.hidden = false;
  },

  el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c);
    return e;
  },

  svg(tag, attrs) {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  },
};
