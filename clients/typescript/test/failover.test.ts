// Several endpoints: a dead port, a follower answering not_leader, a silent member, all
// members down; a waiting acquire on a live leader is not cut; the API check.

import assert from "node:assert/strict";
import http from "node:http";
import net from "node:net";
import { after, before, describe, it } from "node:test";

import { BadRequestError, Client, FencedError, IncompatibleServerError, LockHeldError, UnavailableError } from "../src/index.js";
import { Proxy } from "./proxy.js";
import { PATIENCE_MS, SKIP, Server, freePort, sleep, unique, within } from "./support.js";

/** An HTTP server answering every request with `answer`; counts them by path. */
async function fakeServer(answer: (req: http.IncomingMessage, res: http.ServerResponse) => void): Promise<{ url: string; hits: string[]; close: () => Promise<void> }> {
  const hits: string[] = [];
  const s = http.createServer((req, res) => {
    hits.push(`${req.method} ${req.url}`);
    req.resume();
    req.on("end", () => answer(req, res));
  });
  await new Promise<void>((ok) => s.listen(0, "127.0.0.1", ok));
  const url = `http://127.0.0.1:${(s.address() as net.AddressInfo).port}`;
  return { url, hits, close: () => new Promise((ok) => { s.closeAllConnections(); s.close(() => ok()); }) };
}

function json(res: http.ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

describe("failover", { skip: SKIP }, () => {
  let server: Server;
  const closers: (() => Promise<void>)[] = [];
  before(async () => {
    server = await Server.start();
  });
  after(async () => {
    for (const c of closers) await c();
    await server?.stop();
  });

  it("moves past a dead first endpoint and stays on the one that answered", async () => {
    const dead = `http://127.0.0.1:${await freePort()}`;
    const c = new Client({ endpoints: [dead, server.url], requestTimeoutMs: 20_000 });
    const started = performance.now();
    const lock = await c.tryLock(unique("dead-first"), { ttlMs: 2000 });
    assert.ok(performance.now() - started < 10_000, "a refused connection moves on, not at the end of the request time-out");
    assert.equal(c.endpoint, server.url);
    await c.store.put(unique("dead-first-key"), "v", { token: lock.token });
    await lock.release();
    c.close();
  });

  it("moves past a member that answers not_leader", async () => {
    const doc = await (await fetch(`${server.url}/openapi.json`)).text();
    const follower = await fakeServer((req, res) => {
      if (req.url === "/openapi.json") return json(res, 200, JSON.parse(doc)); // a member serves it whatever its role
      if (req.url === "/readyz") return json(res, 200, { status: "ready", leader: false, leader_id: 2 });
      json(res, 503, { error: { code: "not_leader", message: "this member is not the leader", leader_id: 2 } });
    });
    closers.push(follower.close);
    const c = new Client({ endpoints: [follower.url, server.url], requestTimeoutMs: 5000 });
    const name = unique("follower");
    const lock = await c.tryLock(name, { ttlMs: 2000 });
    assert.ok(follower.hits.some((h) => h.startsWith("POST /v1/locks/")), `the follower was asked first: ${follower.hits}`);
    assert.equal(c.endpoint, server.url);
    assert.equal((await server.lockInfo(name)).token, lock.token);
    await lock.release();
    c.close();
  });

  it("leaves a silent member after the attempt time-out, and skips it afterwards", async () => {
    const held = new Set<net.Socket>();
    let accepted = 0;
    const silent = net.createServer((s) => {
      s.on("error", () => {});
      accepted += 1;
      held.add(s); // accepted, never answered
    });
    await new Promise<void>((ok) => silent.listen(0, "127.0.0.1", ok));
    closers.push(() => {
      for (const s of held) s.destroy();
      return new Promise((ok) => silent.close(() => ok()));
    });
    const url = `http://127.0.0.1:${(silent.address() as net.AddressInfo).port}`;
    const c = new Client({ endpoints: [url, server.url], attemptTimeoutMs: 200, requestTimeoutMs: 20_000 });
    const started = performance.now();
    const lock = await within(PATIENCE_MS, "the acquire", c.tryLock(unique("silent"), { ttlMs: 2000 }));
    const took = performance.now() - started;
    assert.ok(took >= 200 && took < 10_000, `moved on after ${Math.round(took)} ms: after the attempt time-out, not the request time-out`);
    assert.ok(accepted >= 2, "the request, then the probe, went to the silent member");
    assert.equal(c.endpoint, server.url);
    const before = accepted;
    await lock.release();
    assert.equal(accepted, before, "the next calls went straight to the member that answered");
    c.close();
  });

  it("gives up with UnavailableError within its request time-out when no member answers", async () => {
    const dead = [`http://127.0.0.1:${await freePort()}`, `http://127.0.0.1:${await freePort()}`];
    const c = new Client({ endpoints: dead, requestTimeoutMs: 1000 });
    const started = performance.now();
    const e = await c.tryLock(unique("nobody"), { ttlMs: 2000 }).then(
      () => assert.fail("granted by nobody"),
      (e: unknown) => e,
    );
    const took = performance.now() - started;
    assert.ok(e instanceof UnavailableError, String(e));
    assert.match(e.message, /127\.0\.0\.1/);
    assert.ok(took < 3000, `gave up after ${Math.round(took)} ms`);
    // One endpoint alone: the same, bounded by the same time-out.
    const one = new Client({ endpoints: dead[0]!, requestTimeoutMs: 1000 });
    const t1 = performance.now();
    await assert.rejects(one.tryLock(unique("nobody"), { ttlMs: 2000 }), UnavailableError);
    assert.ok(performance.now() - t1 < 3000);
  });

  it("keeps waiting on a live leader that holds an acquire in its queue past the attempt time-out", async () => {
    const p = await Proxy.start(server.port);
    closers.push(() => p.close());
    const dead = `http://127.0.0.1:${await freePort()}`;
    const name = unique("parked");
    const holder = await new Client({ endpoints: server.url }).tryLock(name, { ttlMs: 3000 });
    const c = new Client({ endpoints: [p.url, dead], attemptTimeoutMs: 200, requestTimeoutMs: 5000 });
    const waiting = c.lock(name, { ttlMs: 3000, waitMs: 5000 });
    await sleep(1000); // five attempt time-outs: the leader answers its probes meanwhile
    await holder.release();
    const lock = await within(5000, "the waiter is granted", waiting);
    assert.ok(lock.token > holder.token);
    assert.equal(p.acquireLeaseIds.length, 1, `one attempt, not cut: ${p.acquireLeaseIds}`);
    await assert.rejects(c.tryLock(name), LockHeldError);
    await lock.release();
    c.close();
  });

  it("refuses a server that does not speak its API, once, with a clear error", async () => {
    const other = await fakeServer((req, res) => {
      if (req.url === "/openapi.json") return json(res, 200, { openapi: "3.1.0", info: { title: "Something else", version: "9" }, paths: {} });
      json(res, 200, {});
    });
    closers.push(other.close);
    const c = new Client({ endpoints: other.url });
    await assert.rejects(c.tryLock("x"), (e: unknown) => e instanceof IncompatibleServerError && /title is "Something else"/.test(e.message));
    await assert.rejects(c.store.get("x"), IncompatibleServerError);
    assert.deepEqual(other.hits, ["GET /openapi.json"], "asked once, and nothing else was sent");
    const none = await fakeServer((_req, res) => json(res, 404, { error: { code: "not_found", message: "no" } }));
    closers.push(none.close);
    await assert.rejects(new Client({ endpoints: none.url }).tryLock("x"), (e: unknown) => e instanceof IncompatibleServerError && /answered 404/.test(e.message));
    // A member that cannot answer now is asked again on the next call, not refused for good.
    const doc = await (await fetch(`${server.url}/openapi.json`)).text();
    let asked = 0;
    const flaky = await fakeServer((_req, res) => {
      asked += 1;
      if (asked === 1) return json(res, 500, { error: { code: "internal", message: "the server could not complete the request" } });
      json(res, 200, JSON.parse(doc));
    });
    closers.push(flaky.close);
    const f = new Client({ endpoints: flaky.url, requestTimeoutMs: 2000 });
    await assert.rejects(f.serverApi(), (e: unknown) => e instanceof FencedError && e.code === "internal" && !(e instanceof IncompatibleServerError));
    assert.equal((await f.serverApi()).title, "Fenced");
    // The real server passes, and says its version.
    const api = await new Client({ endpoints: server.url }).serverApi();
    assert.equal(api.title, "Fenced");
    assert.match(api.version, /^\d+\.\d+\.\d+/);
    assert.equal(api.acceptsHolder, true, "its acquire takes a holder label");
  });

  it("refuses a holder label, sending nothing, to a server whose acquire takes none", async () => {
    const doc = JSON.parse(await (await fetch(`${server.url}/openapi.json`)).text()) as { components: { schemas: { AcquireRequest: { properties: Record<string, unknown> } } } };
    delete doc.components.schemas.AcquireRequest.properties.holder;
    const older = await fakeServer((req, res) => {
      if (req.url === "/openapi.json") return json(res, 200, doc);
      json(res, 500, { error: { code: "internal", message: "not expected" } });
    });
    closers.push(older.close);
    const c = new Client({ endpoints: older.url });
    assert.equal((await c.serverApi()).acceptsHolder, false);
    await assert.rejects(c.lock("x", { ttlMs: 1000, holder: "worker-7@host-b" }), (e: unknown) => e instanceof BadRequestError && e.code === "holder_unsupported");
    assert.deepEqual(older.hits, ["GET /openapi.json"], "nothing but the API check was sent");
  });
});
