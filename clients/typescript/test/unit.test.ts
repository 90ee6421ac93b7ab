// Without a server: the error table against docs/server.md, configuration, encoding,
// the API check, and the lock's deadline rules on a fake transport.

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import { describe, it } from "node:test";

import { Calls, readGrant, segment } from "../src/calls.js";
import { readServerApi } from "../src/compat.js";
import { apiDoc } from "./apidoc.js";
import {
  BadRequestError,
  Client,
  ERROR_CLASSES,
  FencedError,
  ForbiddenError,
  IncompatibleServerError,
  LeaseNotFoundError,
  Lock,
  LockHeldError,
  LockLostError,
  MissedEventsError,
  NotLeaderError,
  RecoveringError,
  StaleTokenError,
  TokenNotIssuedError,
  TokenRequiredError,
  UnauthorizedError,
  UnavailableError,
  errorFromAnswer,
  newLeaseId,
  parseDurationMs,
  validUntil,
} from "../src/index.js";
import { PACKAGE_DIR, sleep, within } from "./support.js";

const body = (error: Record<string, unknown>): string => JSON.stringify({ error });

describe("errors", () => {
  it("gives every code in docs/server.md a class of its own", (t) => {
    const doc = resolve(PACKAGE_DIR, "../../docs/server.md");
    if (!existsSync(doc)) {
      if (process.env.CI === "true") assert.fail(`CI=true and no ${doc}`);
      t.skip(`no ${doc} (outside the repository)`);
      return;
    }
    const codes = new Set<string>();
    // "409 `lock_held`", "400 `invalid_name`, `invalid_lease_id`, `wait_out_of_range`", ...
    for (const m of readFileSync(doc, "utf8").matchAll(/\b[45]\d\d ((?:`[a-z][a-z0-9_]*`(?:, (?:or |and )?| or | and )?)+)/g)) {
      for (const c of m[1]!.matchAll(/`([a-z][a-z0-9_]*)`/g)) codes.add(c[1]!);
    }
    // The parse itself must have worked: these are in the table.
    for (const known of ["lock_held", "stale_token", "token_not_issued", "lease_not_found", "not_leader", "token_required", "too_many_waiters"]) {
      assert.ok(codes.has(known), `the parse of docs/server.md missed ${known}`);
    }
    assert.ok(codes.size >= 30, `only ${codes.size} codes found`);
    const missing = [...codes].filter((c) => !(c in ERROR_CLASSES));
    assert.deepEqual(missing, [], "codes of docs/server.md with no class");
  });

  it("maps answers to typed errors with the server's code, status and details", () => {
    const stale = errorFromAnswer(409, body({ code: "stale_token", message: "stale", token: 3, highest_seen: 7 }), "writing");
    assert.ok(stale instanceof StaleTokenError && stale instanceof FencedError && stale instanceof Error);
    assert.deepEqual([stale.code, stale.status, stale.token, stale.highestSeen, stale.name], ["stale_token", 409, 3, 7, "StaleTokenError"]);
    assert.match(stale.message, /^writing: stale \(409 stale_token\)$/);
    const notIssued = errorFromAnswer(409, body({ code: "token_not_issued", message: "no", token: 99, highest_issued: 9 }), "w");
    assert.ok(notIssued instanceof TokenNotIssuedError);
    assert.deepEqual([notIssued.token, notIssued.highestIssued], [99, 9]);
    const recovering = errorFromAnswer(503, body({ code: "recovering", message: "grace", retry_after_ms: 1500 }), "a");
    assert.ok(recovering instanceof RecoveringError && recovering instanceof UnavailableError);
    assert.equal(recovering.retryAfterMs, 1500);
    const follower = errorFromAnswer(503, body({ code: "not_leader", message: "no", leader_id: 2 }), "a");
    assert.ok(follower instanceof NotLeaderError && follower instanceof UnavailableError);
    assert.equal(follower.leaderId, 2);
    assert.ok(errorFromAnswer(428, body({ code: "token_required", message: "t" }), "w") instanceof TokenRequiredError);
    assert.ok(errorFromAnswer(401, body({ code: "unauthorized", message: "no" }), "w") instanceof UnauthorizedError);
    assert.ok(errorFromAnswer(404, body({ code: "lease_not_found", message: "gone" }), "k") instanceof LeaseNotFoundError);
    const compacted = errorFromAnswer(410, body({ code: "compacted", message: "gone", oldest_index: 17 }), "watching");
    assert.ok(compacted instanceof MissedEventsError && compacted instanceof FencedError);
    assert.deepEqual([compacted.code, compacted.status, compacted.oldestIndex], ["compacted", 410, 17]);
    const held = errorFromAnswer(409, body({ code: "lock_held", message: "held", holder_token: 4 }), "a");
    assert.ok(held instanceof LockHeldError && held.holderToken === 4);
    // Not the API's shape: the status decides, the raw text is kept.
    const gateway = errorFromAnswer(502, "<html>bad gateway</html>", "a");
    assert.ok(gateway instanceof UnavailableError);
    assert.equal(gateway.code, "http_502");
    assert.ok(errorFromAnswer(403, "forbidden", "a") instanceof ForbiddenError);
    // A code this client does not know keeps its code, with the class of its status.
    const unknown = errorFromAnswer(409, body({ code: "something_new", message: "m", x: 1 }), "a");
    assert.equal(unknown.constructor, FencedError);
    assert.deepEqual([unknown.code, unknown.details], ["something_new", { x: 1 }]);
    assert.equal(new LockLostError("expired", "n").code, "lock_lost");
  });
});

describe("configuration", () => {
  it("reads durations as the CLI does", () => {
    assert.equal(parseDurationMs("750ms", "x"), 750);
    assert.equal(parseDurationMs(" 2s ", "x"), 2000);
    assert.equal(parseDurationMs("5m", "x"), 300_000);
    assert.equal(parseDurationMs("1h", "x"), 3_600_000);
    assert.equal(parseDurationMs("40", "x"), 40);
    for (const bad of ["soon", "", "1.5s", "-1s", "2d", "99999999999999999999"]) assert.throws(() => parseDurationMs(bad, "x"), BadRequestError, bad);
  });

  it("takes endpoints from the options, a comma list, or FENCED_ENDPOINT", () => {
    const saved = { ...process.env };
    try {
      process.env.FENCED_ENDPOINT = "http://127.0.0.1:1, http://127.0.0.1:2/";
      assert.deepEqual(new Client().endpoints, ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
      assert.deepEqual(new Client({ endpoints: ["http://a:1", "https://b:2"] }).endpoints, ["http://a:1", "https://b:2"]);
      delete process.env.FENCED_ENDPOINT;
      assert.deepEqual(new Client().endpoints, ["http://127.0.0.1:7400"]);
      for (const bad of ["127.0.0.1:7400", "http://x:1/v1", "fenced://x:1", "ftp://x:1", " , "]) {
        assert.throws(() => new Client({ endpoints: bad }), BadRequestError, bad);
      }
      assert.throws(() => new Client({ endpoints: "fenced://x:1" }), /HTTP API only/);
      process.env.FENCED_ATTEMPT_TIMEOUT = "soon";
      assert.throws(() => new Client({ endpoints: "http://a:1" }), /FENCED_ATTEMPT_TIMEOUT/);
      process.env.FENCED_ATTEMPT_TIMEOUT = "5ms";
      assert.throws(() => new Client({ endpoints: "http://a:1" }), /at least 20 ms/);
      process.env.FENCED_ATTEMPT_TIMEOUT = "2s";
      assert.equal(new Client({ endpoints: "http://a:1" }).calls.members.attemptTimeoutMs, 2000);
      assert.equal(new Client({ endpoints: "http://a:1", attemptTimeoutMs: 40 }).calls.members.attemptTimeoutMs, 40);
      delete process.env.FENCED_ATTEMPT_TIMEOUT;
      assert.equal(new Client({ endpoints: "http://a:1" }).calls.members.attemptTimeoutMs, 750);
      assert.throws(() => new Client({ endpoints: "http://a:1", caFile: "/nonexistent/ca.pem" }), /CA file/);
    } finally {
      process.env = saved;
    }
  });

  it("keeps a name one path segment, and draws 128-bit lease ids", () => {
    assert.equal(segment("orders/42"), "orders%2F42");
    assert.equal(segment("a b?c#d%"), "a%20b%3Fc%23d%25");
    assert.equal(segment("plain-name_1.x~"), "plain-name_1.x~");
    assert.equal(segment("é!*'()"), "%C3%A9%21%2A%27%28%29");
    const ids = new Set(Array.from({ length: 100 }, () => newLeaseId()));
    assert.equal(ids.size, 100);
    for (const id of ids) assert.match(id, /^[0-9a-f]{32}$/);
  });

  it("reads a grant only with a token JavaScript holds exactly", () => {
    const grant = (v: Record<string, unknown>) => ({ status: 200, headers: {}, body: Buffer.from(JSON.stringify(v)) });
    const ok = { name: "n", token: 5, lease_id: "a".repeat(32), ttl_ms: 1000 };
    assert.deepEqual(readGrant(grant(ok), "n"), { name: "n", token: 5, leaseId: "a".repeat(32), ttlMs: 1000 });
    assert.throws(() => readGrant(grant({ ...ok, token: 2 ** 53 }), "n"), /below 2\^53/);
    assert.throws(() => readGrant(grant({ ...ok, token: 0 }), "n"), /positive integer/);
    assert.throws(() => readGrant(grant({ ...ok, name: "other" }), "n"), /granted 'other'/);
  });
});

describe("the API check", () => {
  const doc = (over: Record<string, unknown> = {}) => {
    const d = { ...apiDoc(), ...over };
    return { status: 200, headers: {}, body: Buffer.from(JSON.stringify(d)) };
  };

  it("accepts the Fenced API v1 and refuses anything else, saying what is missing", () => {
    assert.deepEqual(readServerApi(doc(), "http://x"), { title: "Fenced", version: "0.1.0", acceptsHolder: false, revokesLocks: false, servesEvents: false });
    const holderAcquire = {
      properties: { lease_id: {}, ttl_ms: {}, wait_ms: {}, holder: {} },
      oneOf: [{ required: ["lease_id"] }, { required: ["ttl_ms"] }, { required: ["lease_id", "ttl_ms"] }],
    };
    const withHolder = doc({ components: { schemas: { AcquireRequest: holderAcquire } } });
    assert.deepEqual(readServerApi(withHolder, "http://x"), { title: "Fenced", version: "0.1.0", acceptsHolder: true, revokesLocks: false, servesEvents: false });
    const withBoth = { status: 200, headers: {}, body: Buffer.from(JSON.stringify(apiDoc({ revoke: true, events: true }))) };
    assert.deepEqual(readServerApi(withBoth, "http://x"), { title: "Fenced", version: "0.1.0", acceptsHolder: false, revokesLocks: true, servesEvents: true });
    const refused = (a: ReturnType<typeof doc>, why: RegExp) =>
      assert.throws(() => readServerApi(a, "http://x"), (e: unknown) => e instanceof IncompatibleServerError && e.code === "incompatible_server" && why.test(e.message));
    refused(doc({ info: { title: "Other" } }), /title is "Other"/);
    refused(doc({ openapi: "2.0" }), /not OpenAPI 3/);
    refused(doc({ paths: {} }), /lacks POST \/v1\/leases, .*GET \/readyz/);
    refused(doc({ components: { schemas: { AcquireRequest: { properties: { ttl_ms: {} } } } } }), /implicit lease named by the caller/);
    refused({ status: 404, headers: {}, body: Buffer.from("not found") }, /answered 404/);
    refused({ status: 200, headers: {}, body: Buffer.from("<html>") }, /not JSON/);
    // A member that cannot answer now is not judged (and not remembered as incompatible).
    const busy = { status: 503, headers: {}, body: Buffer.from(JSON.stringify({ error: { code: "shutting_down", message: "bye" } })) };
    assert.throws(() => readServerApi(busy, "http://x"), (e: unknown) => e instanceof UnavailableError && !(e instanceof IncompatibleServerError));
  });
});

/** A fake transport for the lock's keepalive: each keepalive runs `answer`. */
function fakeCalls(answer: (deadline: number, signal: AbortSignal | undefined) => Promise<number>): Calls {
  const fake = {
    requestTimeoutMs: 10_000,
    keepalive: (_lease: string, deadline: number, signal?: AbortSignal) => answer(deadline, signal),
    release: async () => {},
    revoke: async () => {},
  };
  return fake as unknown as Calls;
}

function lockOn(calls: Calls, ttlMs: number, marginMs = ttlMs / 10): { lock: Lock; sentAt: number } {
  const sentAt = performance.now();
  const lock = new Lock({ name: "n", token: 7, leaseId: "b".repeat(32), ttlMs, marginMs, sentAt }, calls);
  return { lock, sentAt };
}

const lostAt = (lock: Lock): Promise<number> =>
  within(10_000, "the signal aborts", new Promise((r) => lock.signal.addEventListener("abort", () => r(performance.now()), { once: true })));

describe("the deadline", () => {
  it("is the send time plus the TTL minus the margin", () => {
    assert.equal(validUntil(1000, 10_000, 1000), 10_000);
    assert.equal(validUntil(1000, 10_000, 0), 11_000);
    assert.equal(validUntil(1000, 10_000, 60_000), 1000, "a margin past the TTL leaves nothing");
  });

  it("never moves on its own: keepalives that fail leave it where it was, and a timer fires at it", async () => {
    let tries = 0;
    const { lock, sentAt } = lockOn(
      fakeCalls(async () => {
        tries++;
        throw new UnavailableError("connection_lost", "down");
      }),
      600,
    );
    const deadline = lock.validUntil;
    assert.equal(deadline, sentAt + 540);
    const at = await lostAt(lock);
    assert.ok(at >= deadline, `lost ${deadline - at} ms before the deadline`);
    assert.ok(at < deadline + 1000, `lost ${at - deadline} ms after the deadline`);
    assert.equal(lock.validUntil, deadline, "no keepalive extended the deadline");
    assert.equal(lock.lostReason, "expired");
    assert.ok(tries >= 2, `the keepalive was retried (${tries} tries)`);
    await assert.rejects(lock.release(), LockLostError);
  });

  it("moves to the keepalive's send time plus the TTL, never to its answer's", async () => {
    const sends: number[] = [];
    const answered: number[] = [];
    const { lock } = lockOn(
      fakeCalls(async () => {
        const sent = performance.now();
        sends.push(sent);
        await sleep(50);
        answered.push(sent);
        return 600;
      }),
      600,
    );
    await sleep(470); // keepalives at TTL/3 after each successful send
    assert.ok(answered.length >= 1, "a keepalive was answered");
    const last = answered[answered.length - 1]!;
    // The lock reads its clock just before the send, so at most a little before `last`.
    const after = lock.validUntil - last;
    assert.ok(after <= 540 && after > 540 - 20, `deadline ${after} ms after the last answered send, not 540`);
    assert.equal(lock.isValid(), true);
    await lock.release();
    const count = sends.length;
    await sleep(300);
    assert.equal(sends.length, count, "no keepalive after release");
  });

  it("is lost at once on 404 lease_not_found or 401, and lost is final", async () => {
    for (const [error, reason] of [
      [new LeaseNotFoundError("lease_not_found", "gone", 404), "lease_not_found"],
      [new UnauthorizedError("unauthorized", "no", 401), "unauthorized"],
      [new ForbiddenError("forbidden", "no", 403), "unauthorized"],
    ] as const) {
      let answered = false;
      const { lock, sentAt } = lockOn(
        fakeCalls(async () => {
          if (answered) return 3000; // a later success must not revive it
          answered = true;
          throw error;
        }),
        3000,
      );
      const at = await lostAt(lock);
      assert.ok(at < lock.validUntil && at >= sentAt + 1000 - 5, "lost at the first keepalive (TTL/3), not at the deadline");
      assert.equal(lock.lostReason, reason);
      await sleep(1100);
      assert.equal(lock.isValid(), false, "lost is final");
      assert.throws(() => lock.check(), LockLostError);
      await assert.rejects(lock.release(), LockLostError);
    }
  });

  it("is lost when a keepalive answers after the deadline", async () => {
    const { lock } = lockOn(
      fakeCalls(async (deadline) => {
        await sleep(deadline - performance.now() + 30); // ignores its deadline, as a slow server would
        return 600;
      }),
      600,
    );
    const deadline = lock.validUntil;
    await lostAt(lock);
    // The deadline timer fires first; either way it is lost, and not extended.
    assert.ok(lock.lostReason === "expired" || lock.lostReason === "keepalive_too_late");
    assert.equal(lock.validUntil, deadline);
  });

  it("reads the clock itself in check(), before any timer runs", () => {
    const { lock } = lockOn(fakeCalls(() => new Promise(() => {})), 200, 0);
    const until = lock.validUntil;
    while (performance.now() < until + 5) {
      // a synchronous pause, as a long GC: no timer can run
    }
    assert.throws(() => lock.check(), (e: unknown) => e instanceof LockLostError && e.reason === "expired");
    assert.equal(lock.signal.aborted, true);
  });
});
