// The fenced store against a real server: the gate refuses a stale writer once a newer
// holder wrote, fenced reads move the mark, and tokens never issued are refused.

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { BadRequestError, Client, StaleTokenError, TokenNotIssuedError, UnavailableError } from "../src/index.js";
import { SKIP, Server, unique, withServer } from "./support.js";

const text = (b: Uint8Array | undefined): string => Buffer.from(b ?? new Uint8Array()).toString("utf8");

describe("the fenced store", { skip: SKIP }, () => {
  let server: Server;
  let client: Client;
  withServer((s, c) => ((server = s), (client = c)));

  it("refuses the old holder's write once a newer holder wrote", async () => {
    const name = unique("gate");
    const key = `${name}/state`;
    const old = await client.tryLock(name, { ttlMs: 2000 });
    assert.deepEqual(await client.store.put(key, "old", { token: old.token }), { key, token: old.token, highestSeen: old.token });
    await old.release();
    const fresh = await client.tryLock(name, { ttlMs: 2000 });
    assert.ok(fresh.token > old.token);
    assert.deepEqual(await client.store.put(key, "new", { token: fresh.token }), { key, token: fresh.token, highestSeen: fresh.token });
    const e = await client.store.put(key, "zombie", { token: old.token }).then(
      () => assert.fail("the stale write was accepted"),
      (e: unknown) => e,
    );
    assert.ok(e instanceof StaleTokenError, String(e));
    assert.equal(e.code, "stale_token");
    assert.equal(e.status, 409);
    assert.equal(e.token, old.token);
    assert.equal(e.highestSeen, fresh.token);
    // The refusal changed nothing.
    const read = await client.store.get(key);
    assert.equal(text(read?.value), "new");
    assert.equal(read?.highestSeen, fresh.token);
    await fresh.release();
  });

  it("moves the mark on a fenced read, so the old holder is shut out before the new one writes", async () => {
    const key = unique("read-mark");
    const a = await client.tryLock(`${key}/lock`, { ttlMs: 2000 });
    await client.store.put(key, "v1", { token: a.token });
    await a.release();
    const b = await client.tryLock(`${key}/lock`, { ttlMs: 2000 });
    const read = await client.store.get(key, { token: b.token });
    assert.equal(text(read?.value), "v1");
    assert.equal(read?.highestSeen, b.token);
    await assert.rejects(client.store.put(key, "late", { token: a.token }), (e: unknown) => e instanceof StaleTokenError && e.highestSeen === b.token);
    await assert.rejects(client.store.get(key, { token: a.token }), StaleTokenError);
    await b.release();
  });

  it("answers null for a key with no value, and keeps bytes as bytes", async () => {
    assert.equal(await client.store.get(unique("absent")), null);
    const lock = await client.tryLock(unique("bytes"), { ttlMs: 2000 });
    const key = unique("bytes-key");
    const all = new Uint8Array(256).map((_, i) => i);
    await client.store.put(key, all, { token: lock.token });
    const read = await client.store.get(key, { token: lock.token });
    assert.ok(read !== null && read.value instanceof Uint8Array);
    assert.deepEqual([...read.value], [...all]);
    await lock.release();
  });

  it("refuses a token the service never issued", async () => {
    const lock = await client.tryLock(unique("issued"), { ttlMs: 2000 });
    const e = await client.store.put(unique("issued-key"), "x", { token: lock.token + 1_000_000 }).then(
      () => assert.fail("accepted"),
      (e: unknown) => e,
    );
    assert.ok(e instanceof TokenNotIssuedError, String(e));
    assert.equal(e.code, "token_not_issued");
    assert.equal(e.token, lock.token + 1_000_000);
    assert.ok(e.highestIssued !== undefined && e.highestIssued >= lock.token);
    await lock.release();
  });

  it("refuses a write without a valid token before sending it", async () => {
    const key = unique("no-token");
    for (const token of [undefined, 0, -1, 1.5, 2 ** 53, Number.NaN]) {
      await assert.rejects(client.store.put(key, "x", { token: token as number }), BadRequestError, `token ${token}`);
    }
    await assert.rejects(client.store.put("", "x", { token: 1 }), BadRequestError);
    assert.ok(!(new BadRequestError("x", "y") instanceof UnavailableError));
  });
});
