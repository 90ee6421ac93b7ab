// A server with a bearer token: refused without it or with a wrong one, FENCED_AUTH_TOKEN
// by default, and a keepalive refused 401 makes the lock lost at once.

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { Client, LockLostError, UnauthorizedError } from "../src/index.js";
import { Proxy } from "./proxy.js";
import { PATIENCE_MS, SKIP, Server, tempDir, unique, within } from "./support.js";

const TOKEN = "s3cret-token-1";

describe("auth", { skip: SKIP }, () => {
  let server: Server;
  before(async () => {
    const file = join(tempDir("auth"), "token");
    writeFileSync(file, `${TOKEN}\n`);
    server = await Server.start(["--auth-token-file", file]);
  });
  after(async () => {
    await server?.stop();
  });

  it("is refused without the token or with a wrong one, and served with it", async () => {
    const saved = process.env.FENCED_AUTH_TOKEN;
    try {
      delete process.env.FENCED_AUTH_TOKEN;
      const e = await new Client({ endpoints: server.url }).tryLock(unique("auth"), { ttlMs: 2000 }).then(
        () => assert.fail("granted without a token"),
        (e: unknown) => e,
      );
      assert.ok(e instanceof UnauthorizedError, String(e));
      assert.deepEqual([e.code, e.status], ["unauthorized", 401]);
      await assert.rejects(new Client({ endpoints: server.url, authToken: "wrong" }).store.get("k"), UnauthorizedError);
      const lock = await new Client({ endpoints: server.url, authToken: TOKEN }).tryLock(unique("auth"), { ttlMs: 2000 });
      await lock.release();
      process.env.FENCED_AUTH_TOKEN = TOKEN;
      const byEnv = await new Client({ endpoints: server.url }).tryLock(unique("auth"), { ttlMs: 2000 });
      await byEnv.release();
    } finally {
      if (saved === undefined) delete process.env.FENCED_AUTH_TOKEN;
      else process.env.FENCED_AUTH_TOKEN = saved;
    }
  });

  it("is lost at once when a keepalive is refused 401", async () => {
    const p = await Proxy.start(server.port);
    try {
      const c = new Client({ endpoints: p.url, authToken: TOKEN, requestTimeoutMs: 5000 });
      const ttlMs = 3000;
      const lock = await c.tryLock(unique("auth-keepalive"), { ttlMs });
      p.rewrite = [Buffer.from(TOKEN), Buffer.from("s3cret-token-X")]; // the credentials stop working
      const signal = lock.signal;
      const at = await within(PATIENCE_MS, "the signal aborts", new Promise<number>((r) => signal.addEventListener("abort", () => r(performance.now()), { once: true })));
      assert.equal(lock.lostReason, "unauthorized");
      assert.ok(at < lock.validUntil, "lost by the refused keepalive, before the deadline");
      p.rewrite = undefined;
      await assert.rejects(lock.release(), LockLostError);
      c.close();
    } finally {
      await p.close();
    }
  });
});
