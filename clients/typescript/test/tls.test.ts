// https with a CA of the test's own (openssl): trusted through caFile or FENCED_CA_FILE,
// refused without it.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { Client, UnavailableError } from "../src/index.js";
import { SKIP, Server, tempDir, unique } from "./support.js";

/** Makes a CA and a server certificate for 127.0.0.1 signed by it; why not, if openssl is missing. */
function makeCerts(dir: string): string | false {
  const run = (args: string[]): string | false => {
    const r = spawnSync("openssl", args, { cwd: dir, encoding: "utf8" });
    if (r.error) return `openssl: ${r.error.message}`;
    return r.status === 0 ? false : `openssl ${args[0]}: ${r.stderr}`;
  };
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  writeFileSync(join(dir, "ext.cnf"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n");
  return (
    run(["req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=fenced-test-ca"]) ||
    run(["req", ...ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]) ||
    run(["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf"])
  );
}

const dir = SKIP ? "" : tempDir("tls");
const NO_CERTS: string | false = SKIP ? SKIP : makeCerts(dir);
if (NO_CERTS && !SKIP) {
  if (process.env.CI === "true") throw new Error(`CI=true and no test certificates: ${NO_CERTS}`);
  console.log(`# skipping the TLS tests: ${NO_CERTS}`);
}

describe("https", { skip: NO_CERTS }, () => {
  let server: Server;
  const caFile = join(dir, "ca.pem");
  before(async () => {
    server = await Server.start(["--tls-cert", join(dir, "server.pem"), "--tls-key", join(dir, "server.key")], readFileSync(caFile));
  });
  after(async () => {
    await server?.stop();
  });

  it("trusts the server through caFile, or FENCED_CA_FILE", async () => {
    assert.match(server.url, /^https:/);
    const c = new Client({ endpoints: server.url, caFile });
    const lock = await c.tryLock(unique("tls"), { ttlMs: 2000 });
    await c.store.put(unique("tls-key"), "v", { token: lock.token });
    await lock.release();
    c.close();
    const saved = process.env.FENCED_CA_FILE;
    try {
      process.env.FENCED_CA_FILE = caFile;
      const byEnv = new Client({ endpoints: server.url });
      await (await byEnv.tryLock(unique("tls"), { ttlMs: 2000 })).release();
      byEnv.close();
    } finally {
      if (saved === undefined) delete process.env.FENCED_CA_FILE;
      else process.env.FENCED_CA_FILE = saved;
    }
  });

  it("refuses a server whose certificate does not chain to a trusted root", async () => {
    const c = new Client({ endpoints: server.url, requestTimeoutMs: 20_000 });
    const started = performance.now();
    const e = await c.tryLock(unique("tls"), { ttlMs: 2000 }).then(
      () => assert.fail("trusted an unknown CA"),
      (e: unknown) => e,
    );
    assert.ok(e instanceof UnavailableError, String(e));
    assert.equal(e.code, "tls_refused");
    assert.match(e.message, /certificate/i);
    assert.ok(performance.now() - started < 10_000, "refused at once, not retried until the request time-out");
  });
});
