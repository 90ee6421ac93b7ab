// Signed grants against a real server that signs (a key made with openssl, as a user
// would): every grant carries a signature the published keys verify; a `Verified` gate
// refuses another lock's real, higher token, a forged number and no signature before
// the resource is touched, while the same gate without keys takes the other lock's
// token and shuts the real holder out (the control); the server's own store takes
// only signed tokens under its `signed_key_prefix`.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { BadRequestError, BadSignatureError, Client, GrantKeys, NotFoundError, StaleTokenError, Verified, storeGate } from "../src/index.js";
import { SKIP, Server, tempDir, unique } from "./support.js";

describe("signed grants", { skip: SKIP }, () => {
  let server: Server;
  let client: Client;
  let keys: GrantKeys;
  before(async () => {
    const dir = tempDir("signing");
    const key = join(dir, "grant.pem");
    execFileSync("openssl", ["genpkey", "-algorithm", "ed25519", "-out", key]);
    writeFileSync(join(dir, "fenced.toml"), `grant_signing_key = ${JSON.stringify(key)}\nsigned_key_prefix = "acct/"\n`);
    server = await Server.start(["--config", join(dir, "fenced.toml")]);
    client = new Client({ endpoints: server.url, requestTimeoutMs: 5000 });
    keys = await client.grantKeys();
  });
  after(async () => {
    client?.close();
    await server?.stop();
  });

  it("a Verified gate refuses forged and borrowed tokens; without keys the same gate takes them", async () => {
    const real = await client.tryLock(unique("signed/real"), { ttlMs: 10_000 });
    const other = await client.tryLock(unique("signed/other"), { ttlMs: 10_000 });
    assert.ok(other.token > real.token && real.signature !== undefined && other.signature !== undefined);
    assert.ok(keys.verifies(real.name, real.token, real.signature));
    // The resource: keys of the server's store outside its signed prefix, where the
    // server itself checks marks only.
    const gate = storeGate(client.store);
    const kv = new Verified(gate, keys, real.name);
    const key = unique("plain/acct");
    const attacks = [
      { token: other.token, signature: other.signature },
      { token: 2 ** 53 - 1, signature: real.signature },
      { token: real.token, signature: undefined },
    ];
    for (const a of attacks) {
      await assert.rejects(kv.write(key, "hijack", a), (e: unknown) => e instanceof BadSignatureError && e.token === a.token && e.lock === real.name);
      await assert.rejects(kv.read(key, a), BadSignatureError);
    }
    assert.equal(await client.store.get(key), null, "nothing reached the resource");
    await kv.write(key, "100", { token: real.token, signature: real.signature });
    assert.equal(Buffer.from((await kv.read(key, { token: real.token, signature: real.signature })) ?? []).toString(), "100");
    // The control: no keys, the other lock's higher token is taken, the holder shut out.
    const control = unique("plain/control");
    await gate.write(control, Buffer.from("hijack"), other.token);
    await assert.rejects(gate.write(control, Buffer.from("100"), real.token), StaleTokenError);
    await real.release();
    await other.release();
  });

  it("the server's store takes signed tokens only under its prefix, and sets are signed per lock", async () => {
    const real = await client.tryLock("acct/ts", { ttlMs: 10_000 });
    const other = await client.tryLock(unique("elsewhere"), { ttlMs: 10_000 });
    await assert.rejects(client.store.put("acct/ts", "hijack", { token: other.token, signature: other.signature }), (e: unknown) => e instanceof BadSignatureError && e.code === "bad_signature" && e.lock === "acct/ts");
    await assert.rejects(client.store.put("acct/ts", "unsigned", { token: real.token }), (e: unknown) => e instanceof BadSignatureError && e.code === "signature_required");
    assert.equal((await client.store.put("acct/ts", "100", { token: real.token, signature: real.signature })).highestSeen, real.token);
    assert.equal(Buffer.from((await client.store.get("acct/ts", { token: real.token, signature: real.signature }))?.value ?? []).toString(), "100");
    await assert.rejects(client.store.put("acct/ts", "x", { token: real.token, signature: "zz" }), BadRequestError);
    const set = await client.lockAll([unique("set/a"), unique("set/b")], { ttlMs: 10_000 });
    assert.equal(set.signatures.size, 2);
    for (const [n, t] of set.tokens) assert.ok(keys.verifies(n, t, set.signatures.get(n)), n);
    const [a, b] = [...set.tokens.keys()] as [string, string];
    assert.ok(!keys.verifies(a, set.tokens.get(b) as number, set.signatures.get(b)), "each signature is its own lock's");
    await Promise.all([real.release(), other.release(), set.release()]);
  });

  it("a server that does not sign gives no signature and no keys; bad keys are refused", async () => {
    const plain = await Server.start();
    const c = new Client({ endpoints: plain.url, requestTimeoutMs: 5000 });
    try {
      const lock = await c.tryLock(unique("unsigned"), { ttlMs: 5000 });
      assert.equal(lock.signature, undefined);
      assert.equal(lock.signatures.size, 0);
      await assert.rejects(c.grantKeys(), NotFoundError);
      await lock.release();
    } finally {
      c.close();
      await plain.stop();
    }
    assert.throws(() => new GrantKeys("svc", ["not a key"]), BadRequestError);
    assert.throws(() => new GrantKeys("svc", []), BadRequestError);
  });
});
