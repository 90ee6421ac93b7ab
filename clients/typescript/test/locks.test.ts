// Locks against a real server: acquire and release, try-lock refused, FIFO waiting,
// the renewal after a queue, keepalive, a revoked lease, withLock, a withdrawn waiter.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { BadRequestError, Client, LockHeldError, LockLostError, Lock } from "../src/index.js";
import { PATIENCE_MS, SKIP, Server, eventually, sleep, unique, within, withServer } from "./support.js";

describe("locks", { skip: SKIP }, () => {
  let server: Server;
  let client: Client;
  withServer((s, c) => ((server = s), (client = c)));

  it("acquires with a token and a deadline counted from the send, and releases", async () => {
    const name = unique("basic");
    const ttlMs = 2000;
    const sent = performance.now();
    const lock = await client.lock(name, { ttlMs, waitMs: 0 });
    const answered = performance.now();
    assert.equal(lock.name, name);
    assert.ok(Number.isSafeInteger(lock.token) && lock.token > 0, `token ${lock.token}`);
    assert.match(lock.leaseId, /^[0-9a-f]{32}$/);
    assert.equal(lock.ttlMs, ttlMs);
    assert.equal(lock.marginMs, ttlMs / 10);
    // valid_until = send + TTL - margin: between the call's start and its answer.
    assert.ok(lock.validUntil >= sent + ttlMs - ttlMs / 10 && lock.validUntil <= answered + ttlMs - ttlMs / 10, `validUntil ${lock.validUntil - sent} ms after the send`);
    assert.equal(lock.isValid(), true);
    assert.equal(lock.check(), lock.token);
    assert.equal(lock.signal.aborted, false);
    const info = await server.lockInfo(name);
    assert.deepEqual([info.held, info.token], [true, lock.token]);
    await lock.release();
    assert.equal((await server.lockInfo(name)).held, false);
    await lock.release(); // a second release answers the first one's outcome
    const next = await client.tryLock(name, { ttlMs });
    assert.ok(next.token > lock.token, "the next grant's token is higher");
    await next.release();
  });

  it("refuses a try-lock on a held lock with LockHeldError", async () => {
    const name = unique("held");
    const lock = await client.tryLock(name, { ttlMs: 3000 });
    const other = new Client({ endpoints: server.url });
    const e = await other.tryLock(name, { ttlMs: 3000 }).then(
      () => assert.fail("granted twice"),
      (e: unknown) => e,
    );
    assert.ok(e instanceof LockHeldError, String(e));
    assert.equal(e.code, "lock_held");
    assert.equal(e.status, 409);
    assert.equal(e.holderToken, lock.token);
    // A wait that runs out is the same refusal.
    const waited = performance.now();
    await assert.rejects(other.lock(name, { ttlMs: 3000, waitMs: 300 }), LockHeldError);
    assert.ok(performance.now() - waited >= 290, "it waited");
    await lock.release();
    other.close();
  });

  it("grants waiters first in, first out, each with a higher token", async () => {
    const name = unique("fifo");
    const first = await client.tryLock(name, { ttlMs: 5000 });
    const order: string[] = [];
    const tokens: number[] = [];
    const waiters: Promise<void>[] = [];
    for (const who of ["b", "c", "d"]) {
      const c = new Client({ endpoints: server.url });
      waiters.push(
        c.lock(name, { ttlMs: 5000, waitMs: PATIENCE_MS }).then(async (l) => {
          order.push(who);
          tokens.push(l.token);
          await sleep(20);
          await l.release();
          c.close();
        }),
      );
      // Queue each only once the previous one waits on the server.
      const queued = order.length + waiters.length;
      await eventually(`${who} waits in the queue`, async () => (await server.lockInfo(name)).waiters === queued);
    }
    await first.release();
    await within(PATIENCE_MS, "every waiter is granted", Promise.all(waiters));
    assert.deepEqual(order, ["b", "c", "d"]);
    assert.ok(tokens[0]! > first.token && tokens[1]! > tokens[0]! && tokens[2]! > tokens[1]!, `tokens ${first.token}, ${tokens}`);
  });

  it("renews a grant that came after a wait in the queue at once", async () => {
    const name = unique("renew");
    const ttlMs = 1500;
    const holder = await client.tryLock(name, { ttlMs });
    const waiting = new Client({ endpoints: server.url }).lock(name, { ttlMs, waitMs: PATIENCE_MS });
    await eventually("the waiter queues", async () => (await server.lockInfo(name)).waiters === 1);
    await sleep(ttlMs / 2); // longer than TTL/3 in the queue
    const releasedAt = performance.now();
    await holder.release();
    const lock = await waiting;
    // Counted from the acquire's send, the deadline would be before releasedAt + TTL - margin:
    // the renewal was sent after the grant, itself after the release.
    assert.ok(lock.validUntil >= releasedAt + ttlMs - lock.marginMs, `deadline ${Math.round(lock.validUntil - releasedAt)} ms after the release`);
    await lock.release();
  });

  it("keeps the lock past its TTL by keepalive", async () => {
    const name = unique("long");
    const lock = await client.tryLock(name, { ttlMs: 1500 });
    const first = lock.validUntil;
    await sleep(3200);
    assert.equal(lock.isValid(), true, `lost: ${lock.lostReason}`);
    assert.ok(lock.validUntil > first + 1000, "keepalives moved the deadline");
    await assert.rejects(client.tryLock(name, { ttlMs: 1500 }), LockHeldError);
    await lock.release();
  });

  it("is lost at once when the server no longer knows its lease", async () => {
    const name = unique("revoked");
    const lock = await client.tryLock(name, { ttlMs: 3000 });
    const signal = lock.signal;
    await client.revokeLease(lock.leaseId);
    const at = await within(PATIENCE_MS, "the signal aborts", new Promise<number>((r) => signal.addEventListener("abort", () => r(performance.now()), { once: true })));
    // By the next keepalive's refusal, not by the timer at the deadline.
    assert.ok(at < lock.validUntil, "aborted before the deadline");
    assert.equal(signal.aborted, true);
    assert.equal(lock.lostReason, "lease_not_found");
    assert.ok(signal.reason instanceof LockLostError);
    assert.throws(() => lock.check(), (e: unknown) => e instanceof LockLostError && e.reason === "lease_not_found");
    assert.equal(lock.isValid(), false);
    await assert.rejects(lock.release(), LockLostError);
    const next = await client.tryLock(name, { ttlMs: 3000 });
    assert.ok(next.token > lock.token);
    await next.release();
  });

  it("withLock runs the work under the lock and releases after it", async () => {
    const name = unique("with");
    let seen: { token: number; aborted: boolean } | undefined;
    const out = await client.withLock(name, { ttlMs: 2000, waitMs: 0 }, async ({ token, signal }) => {
      seen = { token, aborted: signal.aborted };
      await assert.rejects(client.tryLock(name), LockHeldError);
      return "done";
    });
    assert.equal(out, "done");
    assert.ok(seen !== undefined && seen.token > 0 && !seen.aborted);
    assert.equal((await server.lockInfo(name)).held, false, "released after the work");
    // The work's own error comes back, and the lock is released all the same.
    await assert.rejects(
      client.withLock(name, { ttlMs: 2000, waitMs: 0 }, () => {
        throw new Error("work failed");
      }),
      /work failed/,
    );
    assert.equal((await server.lockInfo(name)).held, false);
  });

  it("withLock rejects with LockLostError when the lock is lost first", async () => {
    const name = unique("with-lost");
    let workSignal: AbortSignal | undefined;
    const started = performance.now();
    const e = await client
      .withLock(name, { ttlMs: 1500, waitMs: 0 }, async ({ signal, lock }) => {
        workSignal = signal;
        await client.revokeLease(lock.leaseId);
        // Work that ignores the signal is not waited for (an unref'd timer: nor by the test runner).
        await new Promise((r) => setTimeout(r, PATIENCE_MS).unref());
        return "finished";
      })
      .then(
        () => assert.fail("withLock resolved"),
        (e: unknown) => e,
      );
    assert.ok(e instanceof LockLostError, String(e));
    assert.equal(e.reason, "lease_not_found");
    assert.equal(workSignal?.aborted, true);
    assert.ok(performance.now() - started < PATIENCE_MS / 2, "it did not wait for the work");
  });

  it("withdraws a waiting acquire when its signal aborts, and revokes its lease", async () => {
    const name = unique("withdraw");
    const holder = await client.tryLock(name, { ttlMs: 3000 });
    const ac = new AbortController();
    const waiting = client.lock(name, { ttlMs: 3000, waitMs: PATIENCE_MS, signal: ac.signal });
    await eventually("the waiter queues", async () => (await server.lockInfo(name)).waiters === 1);
    ac.abort();
    await assert.rejects(within(5000, "the aborted acquire settles", waiting));
    await eventually("the server takes the waiter out of the queue", async () => (await server.lockInfo(name)).waiters === 0);
    await holder.release();
    // Nobody holds it: the withdrawn waiter did not get it behind our back.
    await sleep(100);
    assert.equal((await server.lockInfo(name)).held, false);
  });

  it("refuses bad arguments before sending anything", async () => {
    await assert.rejects(client.lock("", { ttlMs: 1000 }), BadRequestError);
    await assert.rejects(client.lock("x".repeat(257), { ttlMs: 1000 }), BadRequestError);
    await assert.rejects(client.lock("bad\nname", { ttlMs: 1000 }), BadRequestError);
    await assert.rejects(client.lock("ok", { ttlMs: 0 }), BadRequestError);
    await assert.rejects(client.lock("ok", { ttlMs: 1.5 }), BadRequestError);
    await assert.rejects(client.lock("ok", { ttlMs: 1000, holder: 7 as unknown as string }), (e: unknown) => e instanceof BadRequestError && e.code === "bad_argument" && e.status === undefined);
    // Out of the server's range: its own refusal, typed.
    await assert.rejects(client.lock(unique("ttl"), { ttlMs: 10 }), (e: unknown) => e instanceof BadRequestError && e.code === "ttl_out_of_range" && e.details.ttl_ms_min === 100);
  });

  it("shows a holder label in the lock's views, null without one, and the server refuses a bad one", async () => {
    const name = unique("holder");
    // (a) With a label: the views show it.
    const lock = await client.lock(name, { ttlMs: 3000, waitMs: 1000, holder: "worker-7@host-b" });
    const info = await client.lockInfo(name);
    assert.deepEqual([info.held, info.token, info.holder], [true, lock.token, "worker-7@host-b"]);
    assert.equal((await server.lockInfo(name)).holder, "worker-7@host-b");
    const listed = (await client.locks(name)).locks as { name: string; holder: string | null }[];
    assert.deepEqual(listed.map((l) => [l.name, l.holder]), [[name, "worker-7@host-b"]]);
    await lock.release();
    const free = await client.lockInfo(name);
    assert.equal(free.held, false);
    assert.ok("holder" in free && free.holder === null, `a free lock's holder: ${JSON.stringify(free)}`);
    // (b) Without one: null, the field present.
    const plain = await client.tryLock(name, { ttlMs: 3000 });
    const unlabelled = await client.lockInfo(name);
    assert.deepEqual([unlabelled.held, unlabelled.token], [true, plain.token]);
    assert.ok("holder" in unlabelled && unlabelled.holder === null, `no label: ${JSON.stringify(unlabelled)}`);
    assert.deepEqual(((await client.locks(name)).locks as { holder: string | null }[]).map((l) => l.holder), [null]);
    await plain.release();
    // tryLock and withLock take it too.
    const tried = await client.tryLock(name, { ttlMs: 3000, holder: "try@host-c" });
    assert.equal((await client.lockInfo(name)).holder, "try@host-c");
    await tried.release();
    const seen = await client.withLock(name, { ttlMs: 3000, waitMs: 0, holder: "with@host-d" }, async () => (await client.lockInfo(name)).holder);
    assert.equal(seen, "with@host-d");
    // (c) A bad label (too long, a control character): the server's 400 invalid_holder, nothing granted.
    for (const bad of ["h".repeat(300), "worker\n7"]) {
      await assert.rejects(
        client.lock(name, { ttlMs: 3000, waitMs: 1000, holder: bad }),
        (e: unknown) => e instanceof BadRequestError && e.code === "invalid_holder" && e.status === 400,
      );
      const after = await server.lockInfo(name);
      assert.deepEqual([after.held, after.token, after.waiters], [false, null, 0], `after ${JSON.stringify(bad.slice(0, 10))}: ${JSON.stringify(after)}`);
    }
    await assert.rejects(client.tryLock(name, { ttlMs: 3000, holder: "h".repeat(257) }), (e: unknown) => e instanceof BadRequestError && e.code === "invalid_holder");
    // Still free to take.
    const next = await client.tryLock(name, { ttlMs: 3000 });
    assert.ok(next.token > tried.token);
    await next.release();
  });

  it("keeps a name with slashes and other characters one lock", async () => {
    const name = `${unique("odd")}/a b?c#d%é`;
    const lock: Lock = await client.tryLock(name, { ttlMs: 2000 });
    const info = await client.lockInfo(name);
    assert.equal(info.name, name);
    assert.equal(info.token, lock.token);
    const checked = await client.check(name, lock.token);
    assert.deepEqual(checked, { current: true, token: lock.token });
    const listed = (await client.locks(name)).locks as { name: string; token: number }[];
    assert.deepEqual(listed.map((l) => [l.name, l.token]), [[name, lock.token]]);
    assert.equal(((await client.cluster()).members as unknown[]).length, 1, "a single server is a cluster of one");
    await lock.release();
    assert.deepEqual(await client.check(name, lock.token), { current: false, token: null });
  });

  it("lockAll grants a set together, a token each, or none of it; release frees every lock", async () => {
    const base = unique("set");
    const [a, b, z] = [`${base}/a`, `${base}/b`, `${base}/z`];
    const lock = await client.lockAll([b, a], { ttlMs: 5000, waitMs: 1000, holder: "job-1" });
    assert.deepEqual([...lock.tokens.keys()], [a, b], "sorted");
    assert.ok((lock.tokens.get(a) as number) < (lock.tokens.get(b) as number));
    assert.deepEqual([lock.name, lock.token], [a, lock.tokens.get(a)]);
    assert.equal((await client.lockInfo(b)).holder, "job-1");
    await assert.rejects(client.lockAll([b, z], { ttlMs: 5000, waitMs: 0 }), LockHeldError);
    assert.equal((await client.lockInfo(z)).held, false, "nothing of a refused set is taken");
    await lock.release();
    assert.deepEqual([(await client.lockInfo(a)).held, (await client.lockInfo(b)).held], [false, false]);
    await assert.rejects(client.lockAll([]), (e: unknown) => e instanceof BadRequestError && e.code === "invalid_names");
  });

  it("lockAll callers with random orders never deadlock or overlap", async () => {
    const base = unique("sets");
    const names = ["a", "b", "c", "d", "e"].map((k) => `${base}/${k}`);
    const held = new Map<string, number>();
    const counts = [0, 0, 0, 0, 0, 0];
    const stopAt = performance.now() + 4000;
    let seed = 7;
    const rand = (n: number): number => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed % n;
    };
    const caller = async (i: number): Promise<void> => {
      while (performance.now() < stopAt) {
        const pool = [...names];
        const want: string[] = [];
        const k = 2 + rand(2);
        while (want.length < k) want.push(pool.splice(rand(pool.length), 1)[0] as string);
        const lock = await client.lockAll(want, { ttlMs: 10_000, waitMs: 8000 });
        for (const n of want) {
          assert.ok(!held.has(n), `${n} held by ${String(held.get(n))} and ${i}`);
          held.set(n, i);
        }
        await sleep(1 + rand(8));
        for (const n of want) held.delete(n);
        await lock.release();
        counts[i] = (counts[i] as number) + 1;
      }
    };
    await Promise.all(counts.map((_, i) => caller(i)));
    assert.ok(counts.every((n) => n >= 3), `sets per caller: ${counts.join(", ")}`);
  });
});
