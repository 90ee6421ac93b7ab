// A retried acquire names the same implicit lease, so it gets the first attempt's grant:
// twice through the internal call, through a proxy that drops the first answer, and
// through a member that falls silent after granting. A call that gives up revokes it.

import assert from "node:assert/strict";
import { after, describe, it } from "node:test";

import { readGrant, unwrap } from "../src/calls.js";
import { Client, LockHeldError, StaleTokenError, UnavailableError, newLeaseId } from "../src/index.js";
import { Proxy } from "./proxy.js";
import { PATIENCE_MS, SKIP, Server, eventually, unique, within, withServer } from "./support.js";

const ACQUIRE = /^\/v1\/locks\/[^/]+\/acquire$/;
const PUT = /^\/v1\/store\//;

describe("retried acquires", { skip: SKIP }, () => {
  let server: Server;
  let client: Client;
  const proxies: Proxy[] = [];
  const proxy = async (): Promise<Proxy> => {
    const p = await Proxy.start(server.port);
    proxies.push(p);
    return p;
  };
  after(async () => {
    for (const p of proxies) await p.close();
  });
  withServer((s, c) => ((server = s), (client = c)));

  it("gets the same grant and token for the same lease id, twice through the internal call", async () => {
    const name = unique("same-id");
    const leaseId = newLeaseId();
    const first = await client.calls.acquireOnce(name, leaseId, 3000, 0);
    const second = await client.calls.acquireOnce(name, leaseId, 3000, 0);
    const a = readGrant(unwrap(first.tried.outcome), name);
    const b = readGrant(unwrap(second.tried.outcome), name);
    assert.equal(a.leaseId, leaseId);
    assert.deepEqual(b, a, "the second attempt got the first one's grant");
    // Another id is another caller: refused.
    const other = await client.calls.acquireOnce(name, newLeaseId(), 3000, 0);
    assert.equal(unwrap(other.tried.outcome).status, 409);
    await client.revokeLease(leaseId);
  });

  it("waits beside its first attempt in the queue and is granted with it", async () => {
    const name = unique("same-id-queue");
    const holder = await client.tryLock(name, { ttlMs: 3000 });
    const leaseId = newLeaseId();
    const first = client.calls.acquireOnce(name, leaseId, 3000, PATIENCE_MS);
    await eventually("the first attempt queues", async () => (await server.lockInfo(name)).waiters === 1);
    const second = client.calls.acquireOnce(name, leaseId, 3000, PATIENCE_MS);
    await holder.release();
    const [a, b] = await within(PATIENCE_MS, "both attempts are granted", Promise.all([first, second]));
    const ga = readGrant(unwrap(a.tried.outcome), name);
    const gb = readGrant(unwrap(b.tried.outcome), name);
    assert.deepEqual(gb, ga);
    assert.ok(ga.token > holder.token);
    await client.revokeLease(leaseId);
  });

  it("gets the same grant when a proxy drops the first answer with its connection", async () => {
    const name = unique("dropped");
    const p = await proxy();
    p.dropNext = { path: ACQUIRE, after: "close" };
    const c = new Client({ endpoints: p.url, requestTimeoutMs: 5000 });
    const lock = await c.lock(name, { ttlMs: 3000, waitMs: 0 });
    assert.equal(p.dropped.length, 1, "the first answer was dropped");
    const lost = p.dropped[0]!;
    assert.equal(lost.status, 200, "and it was a grant");
    assert.equal(lost.body.token, lock.token, "the retry got the dropped grant's token");
    assert.equal(lost.body.lease_id, lock.leaseId);
    assert.deepEqual(p.acquireLeaseIds, [lock.leaseId, lock.leaseId], "two attempts, one lease id");
    // One grant, not two: the lock is held by that lease, and nobody else gets it.
    const info = await server.lockInfo(name);
    assert.deepEqual([info.held, info.token], [true, lock.token]);
    await assert.rejects(client.tryLock(name), LockHeldError);
    await lock.release();
    assert.equal((await server.lockInfo(name)).held, false);
    c.close();
  });

  it("sends the same holder label on the retry after a dropped answer", async () => {
    const name = unique("dropped-holder");
    const p = await proxy();
    p.dropNext = { path: ACQUIRE, after: "close" };
    const c = new Client({ endpoints: p.url, requestTimeoutMs: 5000 });
    const lock = await c.lock(name, { ttlMs: 3000, waitMs: 0, holder: "worker-7@host-b" });
    assert.equal(p.dropped.length, 1, "the first answer was dropped");
    assert.equal(p.dropped[0]!.body.token, lock.token, "the retry got the dropped grant");
    assert.deepEqual(p.acquireLeaseIds, [lock.leaseId, lock.leaseId], "two attempts, one lease id");
    assert.deepEqual(p.acquireHolders, ["worker-7@host-b", "worker-7@host-b"], "and one label");
    assert.equal((await server.lockInfo(name)).holder, "worker-7@host-b");
    await lock.release();
    // Without one, none is sent.
    const plain = await c.tryLock(name, { ttlMs: 3000 });
    assert.deepEqual(p.acquireHolders.slice(2), [undefined]);
    await plain.release();
    c.close();
  });

  it("gets the same grant on the next member after one granted and fell silent", async () => {
    const name = unique("silent");
    const p = await proxy();
    p.dropNext = { path: ACQUIRE, after: "silent" };
    const c = new Client({ endpoints: [p.url, server.url], attemptTimeoutMs: 300, requestTimeoutMs: 5000 });
    const lock = await within(PATIENCE_MS, "the acquire", c.lock(name, { ttlMs: 3000, waitMs: 0 }));
    assert.equal(p.dropped.length, 1);
    assert.equal(p.dropped[0]!.body.token, lock.token, "the retry on the next member got the silent member's grant");
    assert.equal(p.dropped[0]!.body.lease_id, lock.leaseId);
    assert.equal(c.endpoint, server.url, "calls now go to the member that answered");
    await lock.release();
    assert.equal((await server.lockInfo(name)).held, false);
    c.close();
  });

  it("revokes the implicit lease of an acquire abandoned after the server granted it", async () => {
    const name = unique("abandoned");
    const p = await proxy();
    p.dropNext = { path: ACQUIRE, after: "swallow" }; // granted, the answer never comes; other connections pass
    const c = new Client({ endpoints: p.url, requestTimeoutMs: 5000 });
    const ac = new AbortController();
    const acquiring = c.lock(name, { ttlMs: 20_000, waitMs: 0, signal: ac.signal });
    await eventually("the server granted it", () => p.dropped.length === 1);
    assert.equal((await server.lockInfo(name)).held, true);
    ac.abort();
    await assert.rejects(within(5000, "the abandoned acquire settles", acquiring));
    // Given back at once, not after its 20 s TTL.
    await eventually("the lock is free again", async () => !(await server.lockInfo(name)).held, 5000);
    c.close();
  });

  it("retries a fenced write whose answer was lost: the same token twice is harmless", async () => {
    const p = await proxy();
    const c = new Client({ endpoints: p.url, requestTimeoutMs: 5000 });
    const lock = await c.tryLock(unique("put-retry"), { ttlMs: 3000 });
    const key = unique("put-retry-key");
    p.dropNext = { path: PUT, after: "close" };
    assert.deepEqual(await c.store.put(key, "v", { token: lock.token }), { key, token: lock.token, highestSeen: lock.token });
    assert.equal(p.dropped.length, 1, "the first answer was dropped");
    assert.equal(p.dropped[0]!.status, 200, "the first attempt had been applied");
    await lock.release();
    c.close();
  });

  it("reports a retried write refused as stale as uncertain, never as a clean refusal", async () => {
    const p = await proxy();
    const name = unique("put-uncertain");
    const key = `${name}/k`;
    const old = await client.tryLock(name, { ttlMs: 3000 });
    // The first member applies the write and falls silent; the client moves on after 2 s.
    const c = new Client({ endpoints: [p.url, server.url], attemptTimeoutMs: 2000, requestTimeoutMs: 8000 });
    await c.serverApi();
    p.dropNext = { path: PUT, after: "silent" };
    const writing = c.store.put(key, "old", { token: old.token });
    await eventually("the first attempt was applied", () => p.dropped.length === 1);
    // Meanwhile a newer holder writes: the retry under the old token is refused.
    await old.release();
    const fresh = await client.tryLock(name, { ttlMs: 3000 });
    await client.store.put(key, "fresh", { token: fresh.token });
    const e = await within(PATIENCE_MS, "the retried write", writing).then(
      () => assert.fail("accepted"),
      (e: unknown) => e,
    );
    assert.ok(e instanceof UnavailableError && !(e instanceof StaleTokenError), String(e));
    assert.equal(e.code, "uncertain");
    assert.equal(e.details.highest_seen, fresh.token);
    assert.match(e.message, /may have been applied/);
    await fresh.release();
    c.close();
  });
});
