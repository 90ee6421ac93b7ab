// The event stream and an operator's revoke. Against scripted SSE servers: blocks,
// position markers, comments, CRLF, a repeated index skipped, an unknown type, resuming
// after the last position (after an end, and after 45 s of silence, here shortened),
// `lagged`, 410 `compacted` and a stream that broke before it said its position thrown
// as MissedEventsError, giving up in time with UnavailableError. Against real servers: a
// watch under load whose connection is cut again and again and whose server is killed -9
// and restarted sees every acknowledged grant exactly once, in order, and nothing of
// another prefix; a resume older than `events_retained` is MissedEventsError; a revoked
// lock is lost to its holder, granted higher to the next waiter, and its holder's write
// is refused.

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { join } from "node:path";
import { after, describe, it } from "node:test";

import {
  BadRequestError,
  Client,
  Lock,
  MissedEventsError,
  NotHolderError,
  StaleTokenError,
  UnavailableError,
  Watch,
  WatchEvent,
} from "../src/index.js";
import { apiDoc } from "./apidoc.js";
import { Proxy } from "./proxy.js";
import { PATIENCE_MS, SKIP, Server, eventually, sleep, tempDir, unique, within, withServer } from "./support.js";

/** A fake server: the API document, and `events(n, req, res)` for the n-th (from 1) `GET /v1/events`, whose URLs it keeps. */
async function sseServer(events: (n: number, req: http.IncomingMessage, res: http.ServerResponse) => void): Promise<{ url: string; opens: string[]; close: () => Promise<void> }> {
  const opens: string[] = [];
  const s = http.createServer((req, res) => {
    if (req.url === "/openapi.json") {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(apiDoc({ version: "9.9.9", revoke: true, events: true })));
      return;
    }
    if (req.url?.startsWith("/v1/events")) {
      opens.push(req.url);
      events(opens.length, req, res);
      return;
    }
    res.writeHead(404, { "content-type": "application/json" });
    res.end(JSON.stringify({ error: { code: "not_found", message: "no" } }));
  });
  await new Promise<void>((ok) => s.listen(0, "127.0.0.1", ok));
  const url = `http://127.0.0.1:${(s.address() as net.AddressInfo).port}`;
  return {
    url,
    opens,
    close: () =>
      new Promise((ok) => {
        s.closeAllConnections();
        s.close(() => ok());
      }),
  };
}

const stream = (res: http.ServerResponse): void => {
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
};
const marker = (id: number): string => `id: ${id}\n: position\n\n`;
const event = (e: Record<string, unknown> & { index: number; type: string }): string => `id: ${e.index}\nevent: ${e.type}\ndata: ${JSON.stringify({ at_ms: 1, ...e })}\n\n`;

/** The next event, which must come within `ms`. */
async function nextEvent(w: Watch, ms = 5000): Promise<WatchEvent> {
  const r = await within(ms, "the next event", w.next());
  assert.equal(r.done, false, "the watch went on");
  return r.value as WatchEvent;
}

/** What `p` rejects with (it must reject within `ms`). */
async function rejection(p: Promise<unknown>, ms = 10_000): Promise<unknown> {
  return within(ms, "the rejection", p).then(
    (v) => assert.fail(`resolved with ${JSON.stringify(v)}`),
    (e: unknown) => e,
  );
}

describe("the event stream, on scripted servers", () => {
  const closers: (() => Promise<void>)[] = [];
  after(async () => {
    for (const c of closers) await c();
  });
  const fake = async (events: Parameters<typeof sseServer>[0]) => {
    const f = await sseServer(events);
    closers.push(f.close);
    return f;
  };

  it("reads events, markers and comments, skips a repeat, and resumes after the last position when the stream ends", async () => {
    let second: http.ServerResponse | undefined;
    const f = await fake((n, _req, res) => {
      stream(res);
      if (n === 1) {
        res.write(marker(5).replace(/\n/g, "\r\n")); // CRLF is a line end too
        res.write(": keep-alive\n\n");
        const granted = event({ index: 6, type: "granted", name: "w/a", token: 3, ttl_ms: 5000, holder: "me" });
        res.write(granted.slice(0, 20)); // a block split across chunks
        setTimeout(() => {
          res.write(granted.slice(20));
          res.end(event({ index: 7, type: "released", name: "w/a", token: 3, reason: "forced" })); // then the stream ends
        }, 50);
        return;
      }
      second = res;
      res.write(marker(7));
      res.write(event({ index: 7, type: "released", name: "w/a", token: 3, reason: "forced" })); // a repeat: skipped
      res.write(event({ index: 8, type: "elected", term: 4 })); // a newer server's type
      res.write(marker(12)); // events of other prefixes passed by
      res.write(event({ index: 13, type: "store_rejected", key: "w/k", token: 2, highest_seen: 3, op: "write" }));
    });
    const c = new Client({ endpoints: f.url, requestTimeoutMs: 3000 });
    const w = c.watch("w/");
    assert.equal(w.position, undefined);
    assert.equal(f.opens.length, 0, "nothing is sent before the first next()");
    const g = await nextEvent(w);
    assert.deepEqual(g, { index: 6, type: "granted", at_ms: 1, name: "w/a", token: 3, ttl_ms: 5000, holder: "me" });
    assert.equal(w.position, 6);
    const r = await nextEvent(w);
    assert.ok(r.type === "released" && r.reason === "forced" && r.index === 7);
    const o = await nextEvent(w);
    assert.ok(o.type === "other");
    assert.deepEqual([o.index, o.event, o.data.term], [8, "elected", 4]);
    const s = await nextEvent(w);
    assert.ok(s.type === "store_rejected");
    assert.deepEqual([s.index, s.key, s.token, s.highest_seen, s.op], [13, "w/k", 2, 3, "write"]);
    assert.equal(w.position, 13, "the marker moved the position, and the event after it");
    assert.deepEqual(f.opens, ["/v1/events?prefix=w%2F", "/v1/events?prefix=w%2F&since=7"]);
    // Closing ends the iteration and the connection.
    const closedByServer = new Promise((r) => second?.on("close", r));
    const pending = w.next();
    w.close();
    assert.deepEqual(await within(2000, "the pending next", pending), { done: true, value: undefined });
    assert.deepEqual(await w.next(), { done: true, value: undefined });
    await within(2000, "the server sees the connection close", closedByServer);
    assert.equal(f.opens.length, 2);
  });

  it("is an async iterable: leaving the loop closes it, and so does the signal", async () => {
    const f = await fake((n, _req, res) => {
      stream(res);
      res.write(marker(0));
      for (let i = 1; i <= 3; i++) res.write(event({ index: i, type: "expired", name: `w/${n}`, token: i }));
    });
    const c = new Client({ endpoints: f.url });
    const w = c.watch();
    const seen: number[] = [];
    for await (const e of w) {
      seen.push(e.index);
      if (seen.length === 2) break;
    }
    assert.deepEqual(seen, [1, 2]);
    assert.equal(w.closed, true);
    assert.deepEqual(f.opens, ["/v1/events"], "no prefix: every event");
    const ac = new AbortController();
    const w2 = c.watch("", undefined, { signal: ac.signal });
    assert.equal((await nextEvent(w2)).index, 1);
    ac.abort();
    assert.deepEqual(await w2.next(), { done: true, value: undefined });
  });

  it("throws MissedEventsError on lagged, and again on every later call", async () => {
    const f = await fake((_n, _req, res) => {
      stream(res);
      res.write(marker(3));
      res.write(event({ index: 4, type: "expired", name: "w/a", token: 1 }));
      res.write(`event: lagged\ndata: {"type":"lagged","missed":40}\n\n`);
      res.write(event({ index: 60, type: "expired", name: "w/b", token: 2 }));
    });
    const c = new Client({ endpoints: f.url });
    const w = c.watch("w/");
    assert.equal((await nextEvent(w)).index, 4);
    const e = await rejection(w.next());
    assert.ok(e instanceof MissedEventsError, String(e));
    assert.equal(e.code, "lagged");
    assert.equal(e.details.missed, 40);
    assert.equal(e.oldestIndex, undefined);
    assert.equal(await rejection(w.next()), e, "final: never a silent gap");
    assert.equal(w.position, 4);
    assert.equal(f.opens.length, 1);
  });

  it("throws MissedEventsError with oldestIndex on 410 compacted", async () => {
    const f = await fake((_n, _req, res) => {
      res.writeHead(410, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "compacted", message: "events after 3 are no longer held", oldest_index: 17 } }));
    });
    const w = new Client({ endpoints: f.url }).watch("w/", 3);
    const e = await rejection(w.next());
    assert.ok(e instanceof MissedEventsError, String(e));
    assert.deepEqual([e.code, e.status, e.oldestIndex], ["compacted", 410, 17]);
    assert.deepEqual(f.opens, ["/v1/events?prefix=w%2F&since=3"]);
  });

  it("throws MissedEventsError when a stream broke before it said its position", async () => {
    const f = await fake((_n, _req, res) => {
      stream(res);
      res.write(": hello\n\n"); // a comment, no position
      setTimeout(() => res.destroy(), 20);
    });
    const w = new Client({ endpoints: f.url }).watch("w/");
    const e = await rejection(w.next());
    assert.ok(e instanceof MissedEventsError, String(e));
    assert.equal(e.code, "position_unknown");
    assert.equal(f.opens.length, 1, "it did not reopen from nowhere");
  });

  it("takes a silent stream for dead and resumes from its position", async () => {
    const f = await fake((n, _req, res) => {
      stream(res);
      res.write(marker(2));
      if (n === 2) res.write(event({ index: 3, type: "expired", name: "w/a", token: 1 }));
      // the first stays open and silent
    });
    const w = new Client({ endpoints: f.url }).watch("w/", undefined, { silenceMs: 300 });
    const started = performance.now();
    const e = await nextEvent(w);
    assert.equal(e.index, 3);
    assert.ok(performance.now() - started >= 290, "after the silence, not before");
    assert.deepEqual(f.opens, ["/v1/events?prefix=w%2F", "/v1/events?prefix=w%2F&since=2"]);
    w.close();
  });

  it("reopens on the next member when its member dies, from its position", async () => {
    const a = await fake((_n, _req, res) => {
      stream(res);
      res.write(marker(4));
      res.write(event({ index: 5, type: "expired", name: "w/a", token: 1 }));
    });
    const b = await fake((_n, _req, res) => {
      stream(res);
      res.write(marker(5));
      res.write(event({ index: 6, type: "expired", name: "w/b", token: 2 }));
    });
    const c = new Client({ endpoints: [a.url, b.url], requestTimeoutMs: 3000 });
    const w = c.watch("w/");
    assert.equal((await nextEvent(w)).index, 5);
    await a.close(); // its stream breaks, and it takes no connection any more
    assert.equal((await nextEvent(w)).index, 6);
    assert.deepEqual([a.opens, b.opens], [["/v1/events?prefix=w%2F"], ["/v1/events?prefix=w%2F&since=5"]]);
    assert.equal(c.endpoint, b.url, "the client's calls follow");
    w.close();
  });

  it("reopens with backoff until its retry time, then throws UnavailableError; a later call goes on", async () => {
    let up = false;
    const f = await fake((n, _req, res) => {
      if (n === 1 || up) {
        stream(res);
        res.write(marker(4));
        if (n === 1) setTimeout(() => res.destroy(), 20);
        else res.write(event({ index: 5, type: "expired", name: "w/a", token: 1 }));
        return;
      }
      res.writeHead(503, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "too_busy", message: "busy" } }));
    });
    const w = new Client({ endpoints: f.url, requestTimeoutMs: 2000 }).watch("w/", undefined, { retryForMs: 600 });
    const started = performance.now();
    const e = await rejection(w.next());
    const took = performance.now() - started;
    assert.ok(e instanceof UnavailableError, String(e));
    assert.equal(e.code, "too_busy");
    assert.ok(took >= 600 && took < 5000, `gave up after ${Math.round(took)} ms`);
    const tries = f.opens.length;
    assert.ok(tries >= 4 && tries <= 12, `${tries} opens: backed off, not a busy loop`);
    assert.ok(f.opens.slice(1).every((u) => u === "/v1/events?prefix=w%2F&since=4"), JSON.stringify(f.opens));
    up = true;
    assert.equal((await nextEvent(w)).index, 5, "the next call tried again from the same position");
    w.close();
  });
});

describe("the event stream and revoke, on real servers", { skip: SKIP }, () => {
  let server: Server;
  let client: Client;
  const servers: Server[] = [];
  const proxies: Proxy[] = [];
  after(async () => {
    for (const p of proxies) await p.close();
    for (const s of servers) await s.stop();
  });
  withServer((s, c) => ((server = s), (client = c)));

  it("sees every acknowledged grant once, in order, and nothing of another prefix, while its connection is cut and its server killed -9", async () => {
    let s = await Server.start();
    servers.push(s);
    const p = await Proxy.start(s.port);
    proxies.push(p);
    const base = unique("watch");
    const prefix = `${base}/w/`;
    const watcher = new Client({ endpoints: p.url, requestTimeoutMs: 3000 });
    const w = watcher.watch(prefix);
    const seen: WatchEvent[] = [];
    let order = "";
    const consumer = (async () => {
      for await (const e of w) {
        const last = seen[seen.length - 1];
        if (last !== undefined && e.index <= last.index) order ||= `index ${e.index} after ${last.index}`;
        seen.push(e);
      }
    })();
    consumer.catch(() => {});
    await eventually("the watch has opened", () => w.position !== undefined);
    // Acquire/release cycles: three names, two loaders on the last (they queue), and one on another prefix.
    const load = new Client({ endpoints: s.url, requestTimeoutMs: 3000 });
    const stop = { done: false };
    const granted: { name: string; token: number }[] = [];
    const cycle = async (name: string, record: boolean): Promise<void> => {
      while (!stop.done) {
        let lock: Lock;
        try {
          lock = await load.lock(name, { ttlMs: 5000, waitMs: 2000 });
        } catch {
          await sleep(50);
          continue;
        }
        if (record) granted.push({ name, token: lock.token });
        await lock.release().catch(() => {});
      }
    };
    const loaders = [...[0, 1, 2, 2].map((i) => cycle(`${prefix}${i}`, true)), cycle(`${base}/other/0`, false)];
    for (let i = 0; i < 3; i++) {
      await sleep(400);
      p.cut(); // a reset mid-stream
    }
    await sleep(400);
    const beforeCrash = granted.length;
    s = await s.crashAndRestart(); // the same port and data directory
    servers.push(s);
    await sleep(800);
    p.cut();
    await sleep(600);
    stop.done = true;
    await within(PATIENCE_MS, "the loaders stop", Promise.all(loaders));
    await eventually(`every acknowledged grant is seen (${granted.length} of them)`, () => {
      const tokens = new Set(seen.map((e) => (e.type === "granted" ? e.token : 0)));
      return granted.every((g) => tokens.has(g.token));
    }, PATIENCE_MS, 50);
    await sleep(300); // a repeat would arrive by now
    w.close();
    await within(5000, "the consumer ends", consumer);
    assert.equal(order, "", "indexes strictly increase");
    assert.ok(beforeCrash >= 10 && granted.length > beforeCrash + 10, `too little load: ${beforeCrash} grants before the crash, ${granted.length} in all`);
    for (const g of granted) {
      const n = seen.filter((e) => e.type === "granted" && e.token === g.token && e.name === g.name).length;
      assert.equal(n, 1, `grant ${g.token} of ${g.name} seen ${n} times`);
    }
    const outside = seen.filter((e) => !("name" in e ? e.name : "key" in e ? e.key : "").startsWith(prefix));
    assert.deepEqual(outside, [], "nothing of another prefix");
    assert.ok(seen.some((e) => e.type === "released"), "releases are seen too");
    const opens = p.paths.filter((x) => x.startsWith("/v1/events"));
    assert.ok(opens.length >= 5, `the stream was reopened after each cut and the crash: ${JSON.stringify(opens)}`);
    assert.ok(opens.slice(1).every((x) => /&since=\d+$/.test(x)), `every reopen resumed from the position: ${JSON.stringify(opens)}`);
    watcher.close();
    load.close();
  });

  it("throws MissedEventsError with oldestIndex for a position older than events_retained, and resumes from oldestIndex - 1", async () => {
    const file = join(tempDir("events"), "fenced.toml");
    writeFileSync(file, "events_retained = 4\n");
    const s = await Server.start(["--config", file]);
    servers.push(s);
    const c = new Client({ endpoints: s.url, requestTimeoutMs: 3000 });
    const prefix = `${unique("retained")}/`;
    for (let i = 0; i < 5; i++) await (await c.tryLock(`${prefix}x`, { ttlMs: 2000 })).release();
    const w = c.watch(prefix, 0);
    const e = await rejection(w.next());
    assert.ok(e instanceof MissedEventsError, String(e));
    assert.deepEqual([e.code, e.status], ["compacted", 410]);
    const oldest = e.oldestIndex;
    assert.ok(oldest !== undefined && oldest > 1, `oldestIndex ${oldest}`);
    assert.equal(await rejection(w.next()), e, "final");
    const again = c.watch(prefix, oldest - 1);
    const first = await nextEvent(again);
    assert.ok(first.index >= oldest && (first.type === "granted" || first.type === "released"), JSON.stringify(first));
    again.close();
    c.close();
  });

  it("told compacted by one member, resumes on another that holds the events; MissedEventsError only when none does", async () => {
    // A member restarted from a snapshot holds its events only from there on, while the
    // others may still hold the position: here the first keeps four events, the second all.
    const file = join(tempDir("events"), "fenced.toml");
    writeFileSync(file, "events_retained = 4\n");
    const short = await Server.start(["--config", file]);
    servers.push(short);
    const name = `${unique("elsewhere")}/x`;
    for (const url of [short.url, server.url]) {
      const c = new Client({ endpoints: url, requestTimeoutMs: 3000 });
      for (let i = 0; i < 5; i++) await (await c.tryLock(name, { ttlMs: 2000 })).release();
      c.close();
    }
    const held = client.watch(name, 0);
    const expected = await nextEvent(held);
    held.close();
    const both = new Client({ endpoints: [short.url, server.url], requestTimeoutMs: 3000 });
    const w = both.watch(name, 0);
    assert.deepEqual(await nextEvent(w), expected);
    w.close();
    both.close();
    const alone = new Client({ endpoints: short.url, requestTimeoutMs: 3000 });
    const e = await rejection(alone.watch(name, 0).next());
    assert.ok(e instanceof MissedEventsError && e.code === "compacted", String(e));
    alone.close();
  });

  it("revokes a lock: its holder loses it at the next keepalive, the next waiter gets a higher token, and the old holder's write is refused", async () => {
    const name = unique("revoke");
    const key = `${name}/state`;
    const w = client.watch(name);
    const events: WatchEvent[] = [];
    const watching = (async () => {
      for await (const e of w) events.push(e);
    })();
    watching.catch(() => {});
    await eventually("the watch has opened", () => w.position !== undefined);
    const ttlMs = 1500;
    const guard = await client.tryLock(name, { ttlMs });
    await client.store.put(key, "old", { token: guard.token });
    const other = new Client({ endpoints: server.url, requestTimeoutMs: 5000 });
    const waiting = other.lock(name, { ttlMs: 5000, waitMs: PATIENCE_MS });
    await eventually("the waiter is queued", async () => (await server.lockInfo(name)).waiters === 1);
    const signal = guard.signal;
    const lost = new Promise<number>((r) => signal.addEventListener("abort", () => r(performance.now()), { once: true }));
    const revokedAt = performance.now();
    assert.equal(await client.revokeLock(name), guard.token, "the token taken");
    const next = await within(PATIENCE_MS, "the waiter's grant", waiting);
    assert.ok(next.token > guard.token, `the next waiter's token ${next.token} is above ${guard.token}`);
    const lostAt = await within(5000, "the guard hears", lost);
    assert.equal(guard.lostReason, "lease_not_found");
    assert.ok(lostAt - revokedAt <= ttlMs / 3 + 1000, `lost ${Math.round(lostAt - revokedAt)} ms after the revoke: at the next keepalive`);
    await client.store.put(key, "new", { token: next.token });
    const e = await rejection(client.store.put(key, "zombie", { token: guard.token }));
    assert.ok(e instanceof StaleTokenError, String(e));
    assert.deepEqual([e.token, e.highestSeen], [guard.token, next.token]);
    assert.equal(Buffer.from((await client.store.get(key))?.value ?? []).toString(), "new");
    // Naming the old token again takes nothing from the new holder.
    const refused = await rejection(client.revokeLock(name, guard.token));
    assert.ok(refused instanceof NotHolderError, String(refused));
    assert.equal(refused.holderToken, next.token);
    assert.equal((await server.lockInfo(name)).token, next.token);
    await assert.rejects(guard.release(), (x: unknown) => x instanceof Error && x.name === "LockLostError");
    // The stream told it all: granted, released by force, granted to the waiter.
    const locks = (): string[] =>
      events.filter((x) => x.type === "granted" || x.type === "released").map((x) => `${x.type} ${(x as { token: number }).token}${x.type === "released" ? ` ${x.reason}` : ""}`);
    await eventually("the events arrive", () => locks().length >= 3);
    assert.deepEqual(locks().slice(0, 3), [`granted ${guard.token}`, `released ${guard.token} forced`, `granted ${next.token}`]);
    await next.release();
    // Nobody holds it: refused here, after reading it.
    await assert.rejects(client.revokeLock(name), (x: unknown) => x instanceof NotHolderError && x.code === "not_holder");
    await assert.rejects(client.revokeLock(name, 0), BadRequestError);
    w.close();
    await within(5000, "the watch ends", watching);
    other.close();
  });

  it("reports a revoke retried after a lost answer as uncertain, never taking the next holder's lock", async () => {
    const name = unique("revoke-retry");
    const p = await Proxy.start(server.port);
    proxies.push(p);
    const c = new Client({ endpoints: p.url, requestTimeoutMs: 5000 });
    const held = await client.tryLock(name, { ttlMs: 5000 });
    p.dropNext = { path: /\/revoke$/, after: "close" };
    const e = await rejection(c.revokeLock(name));
    assert.ok(e instanceof UnavailableError && e.code === "uncertain", String(e));
    assert.equal(p.dropped[0]?.status, 200, "the first attempt did take it");
    assert.equal(p.dropped[0]?.body.token, held.token);
    assert.deepEqual(p.paths.filter((x) => x.endsWith("/revoke")).length, 2, "retried once, naming the token");
    assert.equal((await server.lockInfo(name)).held, false);
    c.close();
  });
});
