// https with a CA of the test's own (openssl): trusted through caFile or FENCED_CA_FILE,
// refused without it; and client certificates (mutual TLS): a server with --client-ca
// whose one identity is found by the subject of its certificate.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { BadRequestError, Client, ForbiddenError, UnauthorizedError, UnavailableError } from "../src/index.js";
import { SKIP, Server, tempDir, unique } from "./support.js";

/** Runs `openssl args` in `dir`: `false` when it succeeded, else why not (openssl missing, or its error). */
function openssl(dir: string): (args: string[]) => string | false {
  return (args) => {
    const r = spawnSync("openssl", args, { cwd: dir, encoding: "utf8" });
    if (r.error) return `openssl: ${r.error.message}`;
    return r.status === 0 ? false : `openssl ${args[0]}: ${r.stderr}`;
  };
}

/** A new P-256 key, unencrypted, for `openssl req`. */
const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

/** Makes a CA and a server certificate for 127.0.0.1 signed by it; why not, if openssl is missing. */
function makeCerts(dir: string): string | false {
  const run = openssl(dir);
  writeFileSync(join(dir, "ext.cnf"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n");
  return (
    run(["req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=fenced-test-ca"]) ||
    run(["req", ...ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]) ||
    run(["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf"])
  );
}

/**
 * Client certificates as docs/server.md makes them: a clients' CA signing `reports` and
 * `stranger`, and another CA signing a `rogue` with `reports`' very subject.
 */
function makeClientCerts(dir: string): string | false {
  const run = openssl(dir);
  writeFileSync(join(dir, "client.cnf"), "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n");
  const ca = (name: string) => run(["req", "-x509", ...ec, "-keyout", `${name}.key`, "-out", `${name}.pem`, "-days", "2", "-subj", `/CN=fenced test ${name}`]);
  const leaf = (ca: string, name: string, subj: string) =>
    run(["req", "-new", ...ec, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", subj]) ||
    run(["x509", "-req", "-in", `${name}.csr`, "-CA", `${ca}.pem`, "-CAkey", `${ca}.key`, "-CAcreateserial", "-out", `${name}.pem`, "-days", "2", "-extfile", "client.cnf"]);
  return (
    ca("clients-ca") ||
    ca("rogue-ca") ||
    leaf("clients-ca", "reports", "/O=Acme/CN=reports") ||
    leaf("clients-ca", "stranger", "/O=Acme/CN=stranger") ||
    leaf("rogue-ca", "rogue", "/O=Acme/CN=reports")
  );
}

const dir = SKIP ? "" : tempDir("tls");
const NO_CERTS: string | false = SKIP ? SKIP : makeCerts(dir) || makeClientCerts(dir);
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

/** Runs `f` with these environment variables set (`undefined`: unset), then puts them back. */
async function withEnv<T>(vars: Record<string, string | undefined>, f: () => Promise<T> | T): Promise<T> {
  const saved = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  const put = (v: Record<string, string | undefined>) => {
    for (const [k, x] of Object.entries(v)) {
      if (x === undefined) delete process.env[k];
      else process.env[k] = x;
    }
  };
  try {
    put(vars);
    return await f();
  } finally {
    put(saved);
  }
}

const NO_CLIENT_ENV = { FENCED_CLIENT_CERT: undefined, FENCED_CLIENT_KEY: undefined, FENCED_AUTH_TOKEN: undefined, FENCED_CA_FILE: undefined };

/** Whatever `p` rejects with; fails if it resolves. */
function rejection(p: Promise<unknown>, what: string): Promise<unknown> {
  return p.then(
    () => assert.fail(what),
    (e: unknown) => e,
  );
}

describe("client certificates", { skip: NO_CERTS }, () => {
  let server: Server;
  const caFile = join(dir, "ca.pem");
  const pair = (leaf: string) => ({ clientCert: join(dir, `${leaf}.pem`), clientKey: join(dir, `${leaf}.key`) });
  const client = (o: { clientCert?: string; clientKey?: string } = {}) => new Client({ endpoints: server.url, caFile, requestTimeoutMs: 5000, ...o });
  before(async () => {
    // One identity, found by the subject of its certificate: `lock` under reports/ and nothing else (no store, no admin).
    writeFileSync(
      join(dir, "identities.toml"),
      '[[identity]]\nname = "reports"\ncert_subject = "CN=reports,O=Acme"\nallow = [{ prefix = "reports/", ops = ["lock"] }]\n',
    );
    server = await Server.start(
      ["--tls-cert", join(dir, "server.pem"), "--tls-key", join(dir, "server.key"), "--client-ca", join(dir, "clients-ca.pem"), "--identities-file", join(dir, "identities.toml")],
      readFileSync(caFile),
    );
  });
  after(async () => {
    await server?.stop();
  });

  it("is the identity of its subject, given as clientCert/clientKey or FENCED_CLIENT_CERT/FENCED_CLIENT_KEY", () =>
    withEnv(NO_CLIENT_ENV, async () => {
      const c = client(pair("reports"));
      const lock = await c.tryLock(`reports/${unique("mtls")}`, { ttlMs: 600 });
      assert.ok(lock.token >= 1);
      await new Promise((r) => setTimeout(r, 1000));
      assert.ok(lock.isValid(), `keepalives go out with the certificate too: ${String(lock.lostReason)}`);
      await lock.release();
      c.close();
      await withEnv({ FENCED_CLIENT_CERT: pair("reports").clientCert, FENCED_CLIENT_KEY: pair("reports").clientKey }, async () => {
        const byEnv = client();
        const second = await byEnv.tryLock(`reports/${unique("mtls")}`, { ttlMs: 5000 });
        assert.ok(second.token > lock.token);
        await second.release();
        byEnv.close();
      });
    }));

  it("gets its rights and no more: refused outside its prefix and for the store, nothing issued", () =>
    withEnv(NO_CLIENT_ENV, async () => {
      const c = client(pair("reports"));
      const name = unique("mtls");
      const before = await c.tryLock(`reports/${name}/a`, { ttlMs: 5000 });
      const e = await rejection(c.tryLock(`orders/${name}`, { ttlMs: 5000 }), "granted outside its prefix");
      assert.ok(e instanceof ForbiddenError, String(e));
      assert.deepEqual([e.code, e.status, e.details.identity, e.details.name], ["forbidden", 403, "reports", `orders/${name}`]);
      await assert.rejects(c.store.put(`reports/${name}/a`, "v", { token: before.token }), ForbiddenError);
      await assert.rejects(c.store.get(`reports/${name}/a`), ForbiddenError);
      // The server's tokens come from one counter: a refused acquire that had been granted would leave a gap.
      const after = await c.tryLock(`reports/${name}/b`, { ttlMs: 5000 });
      assert.equal(after.token, before.token + 1);
      await before.release();
      await after.release();
      c.close();
    }));

  it("without a certificate, or with one whose subject is no identity, is unauthenticated (401)", () =>
    withEnv(NO_CLIENT_ENV, async () => {
      for (const o of [{}, pair("stranger")]) {
        const c = client(o);
        const e = await rejection(c.tryLock(`reports/${unique("mtls")}`, { ttlMs: 5000 }), `granted with ${JSON.stringify(o)}`);
        assert.ok(e instanceof UnauthorizedError, String(e));
        assert.deepEqual([e.code, e.status], ["unauthorized", 401]);
        c.close();
      }
    }));

  it("signed by another CA gets no TLS session: tls_refused at once, not a 401", () =>
    withEnv(NO_CLIENT_ENV, async () => {
      const c = client(pair("rogue"));
      const started = performance.now();
      const e = await rejection(c.tryLock(`reports/${unique("mtls")}`, { ttlMs: 5000 }), "granted to another CA's certificate");
      // The server answers the handshake with a TLS alert (unknown CA) before any HTTP.
      assert.ok(e instanceof UnavailableError, String(e));
      assert.equal(e.code, "tls_refused", e.message);
      assert.match(e.message, /alert unknown ca/);
      assert.ok(performance.now() - started < 2000, "refused at once, not retried until the request time-out");
      c.close();
    }));

  it("needs its key: one without the other, or a key that is not the certificate's, is refused at construction", async () => {
    const good = pair("reports");
    await withEnv(NO_CLIENT_ENV, () => {
      for (const o of [{ clientCert: good.clientCert }, { clientKey: good.clientKey }]) {
        assert.throws(() => client(o), (e: unknown) => e instanceof BadRequestError && /clientCert and clientKey go together/.test(e.message));
      }
      assert.throws(() => client({ clientCert: good.clientCert, clientKey: pair("rogue").clientKey }), /the key is not the certificate's/);
      assert.throws(() => client({ clientCert: join(dir, "absent.pem"), clientKey: good.clientKey }), /absent\.pem/);
    });
    await withEnv({ ...NO_CLIENT_ENV, FENCED_CLIENT_KEY: good.clientKey }, () => {
      assert.throws(() => client(), (e: unknown) => e instanceof BadRequestError && /FENCED_CLIENT_CERT and FENCED_CLIENT_KEY go together/.test(e.message));
    });
    // On http:// there is no handshake: the pair is checked, never sent, and an open server serves the call (as in the Rust client).
    const plain = await Server.start();
    try {
      const c = new Client({ endpoints: plain.url, ...good });
      await (await c.tryLock(unique("mtls"), { ttlMs: 5000 })).release();
      c.close();
    } finally {
      await plain.stop();
    }
  });
});
