// The client: configuration, the lazy API check, locks (lock, tryLock, withLock),
// leases, an operator's revoke of a lock, the event stream (watch.ts) and the fenced store.

import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { createSecureContext } from "node:tls";

import { GrantKeys } from "./signing.js";
import { Calls, GetResult, GrantBody, PutResult, checkName, isToken, readGrant, readGrantAll, segment, unwrap } from "./calls.js";
import { ServerApi, readServerApi } from "./compat.js";
import {
  BadRequestError,
  FencedError,
  IncompatibleServerError,
  LeaseNotFoundError,
  LockLostError,
  NotHolderError,
  RecoveringError,
  ShuttingDownError,
  badArgument,
  errorFromAnswer,
} from "./errors.js";
import { ATTEMPT_TIMEOUT_DEFAULT_MS, ATTEMPT_TIMEOUT_MIN_MS, Members } from "./failover.js";
import { Endpoint, abortError, sleep } from "./http.js";
import { Lock, defaultMargin } from "./lock.js";
import { Watch, WatchOptions } from "./watch.js";

/** The endpoint used when neither the options nor `FENCED_ENDPOINT` name one. */
export const ENDPOINT_DEFAULT = "http://127.0.0.1:7400";

export interface ClientOptions {
  /** `http(s)://host:port`, a list of them, or several separated by commas (a cluster's members); default `FENCED_ENDPOINT`, else `http://127.0.0.1:7400`. */
  endpoints?: string | readonly string[];
  /** Sent as `Authorization: Bearer ...`; default `FENCED_AUTH_TOKEN`. */
  authToken?: string;
  /** A PEM file of the certificates an `https://` server must chain to; default `FENCED_CA_FILE`, else node's roots. */
  caFile?: string;
  /**
   * This client's certificate (a PEM file, the chain from the leaf) for an `https://` server
   * with `client_ca`: the identity of its subject. Goes with `clientKey`; by default
   * `FENCED_CLIENT_CERT` and `FENCED_CLIENT_KEY`. Read and checked at construction; not
   * sent to an `http://` endpoint (no TLS there), as in the Rust client.
   */
  clientCert?: string;
  /** The private key (a PEM file, unencrypted) of `clientCert`. */
  clientKey?: string;
  /** Bounds a whole call, failovers included; a blocking acquire adds its wait. Default 10 000 ms. */
  requestTimeoutMs?: number;
  /** With several endpoints: how long a member may answer neither a request nor a probe before the call moves on. Default `FENCED_ATTEMPT_TIMEOUT` (`750ms`, `2s`), else 750 ms; at least 20 ms. */
  attemptTimeoutMs?: number;
  /** Bound on opening a connection. Default 3000 ms. */
  connectTimeoutMs?: number;
}

export interface LockOptions {
  /** The lease's TTL: how long the lock outlives a silent holder. Default 10 000 ms. */
  ttlMs?: number;
  /** How long to wait in the server's FIFO queue; 0 is a try-lock. Default 30 000 ms (`tryLock`: 0). */
  waitMs?: number;
  /** Kept below the TTL in the client-side deadline. Default a tenth of the TTL. */
  marginMs?: number;
  /**
   * A label naming the holder (a host, a process, a job: `"worker-7@host-b"`), shown as
   * `holder` in the lock's views (`lockInfo`, `locks`; `null` when none was given) and in
   * its `granted` event. 1 to 256 bytes of UTF-8 without control characters, never a
   * secret; the server judges it (`BadRequestError` with code `invalid_holder`, nothing
   * granted). Sent unchanged on every retry and failover of the call. A server whose API
   * document lists no `holder` on an acquire is refused here (`holder_unsupported`).
   */
  holder?: string;
  /** Aborting it withdraws a waiting acquire (its lease is revoked). */
  signal?: AbortSignal;
}

/** What `withLock`'s work is given. */
export interface LockContext {
  /** The fencing token: pass it with every operation on the resource. */
  token: number;
  /** Aborted when the lock is lost. */
  signal: AbortSignal;
  lock: Lock;
}

/** 128 random bits, 32 hex digits: the id of an implicit acquire's lease. */
export function newLeaseId(): string {
  return randomBytes(16).toString("hex");
}

/** Reads `750ms`, `2s`, `5m`, `1h` or a bare number of milliseconds, as the Rust client and the CLI do. */
export function parseDurationMs(s: string, what: string): number {
  const m = /^(\d+)(ms|s|m|h)?$/.exec(s.trim());
  if (m === null) throw badArgument(`${what}: '${s}' is not a duration: write it like 750ms, 90s, 10m or 1h`);
  const scale = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(m[2] ?? "ms") as "ms" | "s" | "m" | "h"];
  const n = Number(m[1]) * scale;
  if (!Number.isSafeInteger(n)) throw badArgument(`${what}: '${s}' is too large`);
  return n;
}

function envValue(name: string): string | undefined {
  const v = process.env[name];
  return v === undefined || v.trim() === "" ? undefined : v;
}

/**
 * The client certificate and key, read: both given (`clientCert`, `clientKey`), else both of
 * `FENCED_CLIENT_CERT` and `FENCED_CLIENT_KEY`, else none. The two go together, never one
 * from each place; one without the other is refused rather than left for the server to 401.
 */
function clientCertFrom(cert: string | undefined, key: string | undefined): { cert: Buffer; key: Buffer; names: [string, string]; paths: [string, string] } | undefined {
  let names: [string, string];
  let paths: [string | undefined, string | undefined];
  if (cert !== undefined || key !== undefined) {
    names = ["clientCert", "clientKey"];
    paths = [cert, key];
  } else {
    names = ["FENCED_CLIENT_CERT", "FENCED_CLIENT_KEY"];
    paths = [envValue(names[0]), envValue(names[1])];
  }
  const [c, k] = paths;
  if (c === undefined && k === undefined) return undefined;
  if (c === undefined || k === undefined) {
    const [given, absent] = c === undefined ? [names[1], names[0]] : names;
    throw badArgument(`${names[0]} and ${names[1]} go together: ${given} is set and ${absent} is not`);
  }
  const read = (name: string, path: string): Buffer => {
    try {
      return readFileSync(path);
    } catch (e) {
      throw badArgument(`${name} ${path}: ${(e as Error).message}`);
    }
  };
  return { cert: read(names[0], c), key: read(names[1], k), names, paths: [c, k] };
}

function positiveMs(v: unknown, what: string, min = 1): number {
  if (typeof v !== "number" || !Number.isFinite(v) || v < min || v > 2 ** 31 - 1) {
    throw badArgument(`${what} must be a number of milliseconds from ${min} to ${2 ** 31 - 1}, not ${String(v)}`);
  }
  return v;
}

function wholeMs(v: unknown, what: string, min: number): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min) throw badArgument(`${what} must be a whole number of milliseconds, at least ${min}; not ${String(v)}`);
  return v;
}

function checkSignature(signature: unknown): string | undefined {
  if (signature !== undefined && (typeof signature !== "string" || !/^[0-9a-fA-F]{128}$/.test(signature))) {
    throw badArgument("a signature is 128 hex digits (Lock.signature)");
  }
  return signature;
}

/** The fenced key-value store in the server: `PUT`/`GET /v1/store/{key}` with `Fencing-Token`. */
export class Store {
  readonly #client: Client;
  /** @internal */
  constructor(client: Client) {
    this.#client = client;
  }

  /**
   * Writes `value` under `token`: accepted iff the token is at least the key's mark,
   * which then becomes `token`. A refusal throws `StaleTokenError` (`token`,
   * `highestSeen`) and changes nothing; a token the service never issued throws
   * `TokenNotIssuedError`.
   */
  async put(key: string, value: string | Uint8Array, options: { token: number; signature?: string }): Promise<PutResult> {
    checkName("store key", key);
    const token = options?.token;
    if (!isToken(token)) throw badArgument(`a fenced write needs a token, a positive integer below 2^53; not ${String(token)}`);
    const bytes = typeof value === "string" ? Buffer.from(value, "utf8") : value;
    if (!(bytes instanceof Uint8Array)) throw badArgument("the value must be a string or a Uint8Array");
    const signature = checkSignature(options.signature);
    await this.#client.serverApi();
    return this.#client.calls.put(key, bytes, token, signature);
  }

  /**
   * Reads `key`; with a token it is a fenced read, which moves the mark to the token
   * (a new holder's first read shuts out every older holder) and throws
   * `StaleTokenError` for a stale one. `null` when the key holds no value.
   */
  async get(key: string, options: { token?: number; signature?: string } = {}): Promise<GetResult | null> {
    checkName("store key", key);
    const token = options.token;
    if (token !== undefined && !isToken(token)) throw badArgument(`the token must be a positive integer below 2^53; not ${String(token)}`);
    const signature = checkSignature(options.signature);
    await this.#client.serverApi();
    return this.#client.calls.get(key, token, signature);
  }
}

export class Client {
  /** The members, in the order given. */
  readonly endpoints: readonly string[];
  /** The fenced store. */
  readonly store: Store;
  /** @internal The API's calls. */
  readonly calls: Calls;
  readonly #requestTimeoutMs: number;
  #api: Promise<ServerApi> | undefined;

  constructor(options: ClientOptions = {}) {
    const given = options.endpoints ?? envValue("FENCED_ENDPOINT") ?? ENDPOINT_DEFAULT;
    const list = (typeof given === "string" ? [given] : [...given])
      .flatMap((e) => e.split(","))
      .map((e) => e.trim())
      .filter((e) => e !== "");
    if (list.length === 0) throw badArgument("no endpoint given");
    const authToken = options.authToken ?? envValue("FENCED_AUTH_TOKEN");
    const caFile = options.caFile ?? envValue("FENCED_CA_FILE");
    let ca: Buffer | undefined;
    if (caFile !== undefined) {
      try {
        ca = readFileSync(caFile);
      } catch (e) {
        throw new BadRequestError("bad_argument", `the CA file ${caFile}: ${(e as Error).message}`);
      }
    }
    const client = clientCertFrom(options.clientCert, options.clientKey);
    if (client !== undefined) {
      // Refuses here, not at the first handshake, a pair that cannot be used.
      try {
        createSecureContext({ cert: client.cert, key: client.key });
      } catch (e) {
        const why = (e as NodeJS.ErrnoException).code === "ERR_OSSL_X509_KEY_VALUES_MISMATCH" ? "the key is not the certificate's" : "not a PEM certificate chain and its unencrypted private key";
        throw badArgument(`${client.names[0]} ${client.paths[0]} and ${client.names[1]} ${client.paths[1]}: ${why} (${(e as Error).message})`);
      }
    }
    const requestTimeoutMs = positiveMs(options.requestTimeoutMs ?? 10_000, "requestTimeoutMs");
    const envAttempt = envValue("FENCED_ATTEMPT_TIMEOUT");
    const attemptTimeoutMs =
      options.attemptTimeoutMs ?? (envAttempt !== undefined ? parseDurationMs(envAttempt, "FENCED_ATTEMPT_TIMEOUT") : ATTEMPT_TIMEOUT_DEFAULT_MS);
    if (typeof attemptTimeoutMs !== "number" || !(attemptTimeoutMs >= ATTEMPT_TIMEOUT_MIN_MS)) {
      throw badArgument(`the attempt time-out must be at least ${ATTEMPT_TIMEOUT_MIN_MS} ms, not ${String(attemptTimeoutMs)}`);
    }
    const connectTimeoutMs = positiveMs(options.connectTimeoutMs ?? 3000, "connectTimeoutMs");
    // With several members a refused connection sends the call to the next one at once.
    const connectAttempts = list.length > 1 ? 1 : 4;
    const tlsClient = client === undefined ? {} : { cert: client.cert, key: client.key };
    const endpoints = list.map((e) => new Endpoint(e, { authToken, ca, ...tlsClient, connectTimeoutMs, connectAttempts }));
    this.endpoints = endpoints.map((e) => e.url);
    this.#requestTimeoutMs = requestTimeoutMs;
    this.calls = new Calls(new Members(endpoints, positiveMs(attemptTimeoutMs, "attemptTimeoutMs", ATTEMPT_TIMEOUT_MIN_MS)), requestTimeoutMs);
    this.store = new Store(this);
  }

  /** The member calls go to now (the one that answered last). */
  get endpoint(): string {
    return this.calls.members.current.url;
  }

  /**
   * What the server said of its API (`GET /openapi.json`), read once per client before
   * its first call; throws `IncompatibleServerError` if it is not the API this client
   * speaks. A failure to reach it is not remembered: the next call asks again.
   */
  serverApi(): Promise<ServerApi> {
    if (this.#api === undefined) {
      const asked = (async () => {
        const deadline = performance.now() + this.#requestTimeoutMs;
        const tried = await this.calls.members.each(
          deadline,
          (ep, signal) => ep.send({ method: "GET", path: "/openapi.json", timeoutMs: Math.max(1, deadline - performance.now()), signal }),
          { retrySingle: true },
        );
        return readServerApi(unwrap(tried.outcome), this.endpoint);
      })();
      this.#api = asked;
      // A refusal is remembered; a server that could not be asked is asked again next time.
      asked.catch((e: unknown) => {
        if (!(e instanceof IncompatibleServerError) && this.#api === asked) this.#api = undefined;
      });
    }
    return this.#api;
  }

  /**
   * Acquires `name`, waiting up to `waitMs` in the server's FIFO queue. Rejects with
   * `LockHeldError` when it is not granted in time. The implicit lease is named here
   * (128 random bits); every retry of this call sends the same id, so a retry after a
   * lost answer gets the same grant. If the call fails without the service's answer,
   * or `signal` aborts it, that lease is revoked in the background. `holder`, when
   * given, goes with every attempt as it is.
   */
  async lock(name: string, options: LockOptions = {}): Promise<Lock> {
    checkName("lock name", name);
    return this.#acquire(name, options);
  }

  /**
   * Acquires every one of `names` together (`POST /v1/locks/acquire`), under one implicit
   * lease, or none of them within `waitMs` (`LockHeldError`). Callers naming the same
   * locks in any order never deadlock, and a waiter for several is not overtaken by later
   * waiters for one of them. The lock's `tokens` has a token per name (sorted); `name`
   * and `token` are the first's; its lost signal is the lease's, and `release()` ends the
   * lease, which releases every one. Retries and failover as `lock`.
   */
  async lockAll(names: readonly string[], options: LockOptions = {}): Promise<Lock> {
    if (!Array.isArray(names) || names.length === 0) throw new BadRequestError("invalid_names", "lockAll needs one or more lock names");
    for (const n of names) checkName("lock name", n);
    const sorted = [...new Set(names)].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
    return this.#acquire(sorted[0] as string, options, sorted);
  }

  async #acquire(name: string, options: LockOptions, names?: string[]): Promise<Lock> {
    const ttlMs = wholeMs(options.ttlMs ?? 10_000, "ttlMs", 1);
    const waitMs = wholeMs(options.waitMs ?? 30_000, "waitMs", 0);
    const marginMs = options.marginMs === undefined ? undefined : wholeMs(options.marginMs, "marginMs", 0);
    const holder: unknown = options.holder;
    // Only its type is checked here; its length and characters are the server's to judge.
    if (holder !== undefined && typeof holder !== "string") throw badArgument(`the holder label must be a string, not ${typeof holder}`);
    const signal = options.signal;
    if (signal?.aborted) throw abortError(signal, `acquiring '${name}'`);
    const api = await this.serverApi();
    if (holder !== undefined && !api.acceptsHolder) {
      throw new BadRequestError("holder_unsupported", `the server at ${this.endpoint} (Fenced ${api.version}) takes no holder label on an acquire; leave 'holder' out`);
    }
    const started = performance.now();
    const giveUpAt = started + waitMs;
    let grant: GrantBody;
    let sentAt: number;
    // Bounded: a round ends by its deadline, and a new one starts only before giveUpAt.
    for (;;) {
      const leaseId = newLeaseId();
      sentAt = performance.now();
      const waitLeft = Math.max(0, Math.floor(giveUpAt - sentAt));
      const { tried, answered } = await this.calls.acquireOnce(name, leaseId, ttlMs, waitLeft, signal, holder, names);
      if (!answered) {
        this.#revokeInBackground(leaseId);
        const o = tried.outcome;
        throw o.ok ? errorFromAnswer(o.answer.status, o.answer.body, `acquiring '${name}'`) : unwrap(o);
      }
      const a = unwrap(tried.outcome);
      if (a.status === 200) {
        try {
          grant = names === undefined ? readGrant(a, name) : readGrantAll(a, names);
        } catch (e) {
          this.#revokeInBackground(leaseId);
          throw e;
        }
        if (grant.leaseId !== leaseId) {
          this.#revokeInBackground(grant.leaseId);
          throw new FencedError("bad_response", `acquiring '${name}': granted under lease ${grant.leaseId}, asked for ${leaseId}`);
        }
        break;
      }
      const e = errorFromAnswer(a.status, a.body, `acquiring '${name}'`);
      // A refusal ends the server's implicit lease; but after an attempt whose answer was
      // lost, give the id back all the same (best effort): it may name what that attempt left.
      if (tried.uncertain) this.#revokeInBackground(leaseId);
      // Refused before anything was granted: retrying is safe while the wait lasts.
      const retryable = e instanceof RecoveringError || e instanceof ShuttingDownError || e.code === "too_many_connections";
      if (!retryable || performance.now() >= giveUpAt) throw e;
      const pauseMs = Math.min((e as RecoveringError).retryAfterMs ?? 200, giveUpAt - performance.now());
      await sleep(pauseMs, signal);
    }
    const ttl = Math.min(grant.ttlMs, ttlMs);
    // A grant after a long wait in the queue: renewed once at once, so the lock starts
    // with a full deadline rather than one counted from the send of the acquire.
    if (performance.now() - started > ttl / 3) {
      const renewedAt = performance.now();
      try {
        await this.calls.keepalive(grant.leaseId, renewedAt + this.#requestTimeoutMs);
        sentAt = renewedAt;
      } catch (e) {
        if (e instanceof LeaseNotFoundError) throw new LockLostError("lease_not_found", name);
        // otherwise the lock's own keepalive retries until the deadline
      }
    }
    const lock = new Lock({ ...grant, ttlMs: ttl, marginMs: marginMs ?? defaultMargin(ttl), sentAt }, this.calls);
    if (signal?.aborted) {
      lock.release().catch(() => {});
      throw abortError(signal, `acquiring '${name}'`);
    }
    return lock;
  }

  /** `lock` without waiting: `LockHeldError` when the lock is held. */
  tryLock(name: string, options: Omit<LockOptions, "waitMs"> = {}): Promise<Lock> {
    return this.lock(name, { ...options, waitMs: 0 });
  }

  /**
   * Acquires `name`, runs `work`, releases. If the lock is lost first, rejects with
   * `LockLostError` at that moment (the work is not waited for: honour `signal` in it);
   * if the work throws, its error. A release that fails after the work finished under
   * a valid lock only delays the next holder until the lease expires, and is not an error.
   */
  async withLock<T>(name: string, options: LockOptions, work: (ctx: LockContext) => Promise<T> | T): Promise<T> {
    const lock = await this.lock(name, options);
    const signal = lock.signal;
    const lost = new Promise<never>((_, reject) => {
      if (signal.aborted) reject(signal.reason);
      signal.addEventListener("abort", () => reject(signal.reason), { once: true });
    });
    lost.catch(() => {});
    let run: Promise<T>;
    try {
      run = Promise.resolve(work({ token: lock.token, signal, lock }));
    } catch (e) {
      run = Promise.reject(e);
    }
    run.catch(() => {}); // once the lock is lost, the work's own outcome is nobody's
    let outcome: { ok: true; value: T } | { ok: false; error: unknown };
    try {
      outcome = { ok: true, value: await Promise.race([run, lost]) };
    } catch (error) {
      outcome = { ok: false, error };
    }
    let released: unknown;
    try {
      await lock.release();
    } catch (e) {
      released = e;
    }
    if (!outcome.ok) throw outcome.error;
    if (released instanceof LockLostError) throw released;
    return outcome.value;
  }

  /** Whether `token` is still the current grant of `name` (Chubby's CheckSequencer), and the holder's token. */
  async check(name: string, token: number): Promise<{ current: boolean; token: number | null }> {
    checkName("lock name", name);
    if (!isToken(token)) throw badArgument(`the token must be a positive integer below 2^53; not ${String(token)}`);
    await this.serverApi();
    return this.calls.check(name, token);
  }

  /**
   * `GET /v1/keys`: the keys that verify this service's grant signatures, for a
   * `Verified` gate (fetch once, or configure them). The server answers 404
   * `not_signing` (`NotFoundError`) when it does not sign.
   */
  async grantKeys(): Promise<GrantKeys> {
    await this.serverApi();
    return GrantKeys.fromJson(await this.calls.view("reading the grant keys", "/v1/keys"));
  }

  /** One lock as the server describes it: `{name, held, token, expires_in_ms, waiters, blocked_for_ms, holder}` (`holder`: the holder's label, `null` when it gave none or the lock is free). */
  async lockInfo(name: string): Promise<Record<string, unknown>> {
    checkName("lock name", name);
    await this.serverApi();
    return this.calls.view(`describing '${name}'`, `/v1/locks/${segment(name)}`);
  }

  /** The locks whose names start with `prefix`, in name order, as the server lists them (`GET /v1/locks`: `{locks: [...]}`, at most its `list_locks_max`). */
  async locks(prefix?: string): Promise<Record<string, unknown>> {
    if (prefix !== undefined && (typeof prefix !== "string" || Buffer.byteLength(prefix) > 256)) throw badArgument("the prefix must be a string of at most 256 bytes");
    await this.serverApi();
    const query = prefix === undefined ? "" : `?prefix=${encodeURIComponent(prefix)}`;
    return this.calls.view("listing locks", `/v1/locks${query}`);
  }

  /** The cluster as the member that answers sees it (`GET /v1/cluster`). */
  async cluster(): Promise<Record<string, unknown>> {
    await this.serverApi();
    return this.calls.view("the cluster's status", "/v1/cluster");
  }

  /**
   * An operator's release: takes lock `name` from its holder (the `admin` right on the
   * name when the server has identities). With `token`, only while that token holds it;
   * without, the lock is read first (`GET /v1/locks/{name}`) and its current token is
   * named, so that a retry on another member (the first answer lost) can never take the
   * lock from the holder granted after the revoke. Resolves to the token taken; the next
   * waiter is granted with a higher one, and the old holder's `Lock` is lost at its next
   * keepalive (`lease_not_found`). `NotHolderError` when nobody holds it, or another token
   * does (`holderToken`).
   */
  async revokeLock(name: string, token?: number): Promise<number> {
    checkName("lock name", name);
    if (token !== undefined && !isToken(token)) throw badArgument(`the token must be a positive integer below 2^53; not ${String(token)}`);
    const api = await this.serverApi();
    if (!api.revokesLocks) {
      throw new BadRequestError("revoke_unsupported", `the server at ${this.endpoint} (Fenced ${api.version}) takes no revoke of a lock (POST /v1/locks/{name}/revoke)`);
    }
    let held = token;
    if (held === undefined) {
      const view = await this.calls.view(`describing '${name}'`, `/v1/locks/${segment(name)}`);
      if (view.held !== true || !isToken(view.token)) throw new NotHolderError("not_holder", `revoking '${name}': nobody holds it`);
      held = view.token;
    }
    return this.calls.revokeLock(name, held);
  }

  /**
   * Watches the events of lock names and store keys that start with `prefix` ("" for
   * all): from now, or exactly after index `since` (a position an earlier watch reached:
   * `watch.position`). Iterate it with `for await`; a broken stream is reopened from its
   * last position on any member, so nothing is missed or repeated, and a gap it cannot
   * avoid is thrown as `MissedEventsError`. Nothing is sent before the first `next()`.
   * Close it with `close()`, by leaving the loop, or with `options.signal`.
   */
  watch(prefix = "", since?: number, options: WatchOptions = {}): Watch {
    if (typeof prefix !== "string" || Buffer.byteLength(prefix) > 256) throw badArgument("the prefix must be a string of at most 256 bytes");
    if (since !== undefined && !(Number.isSafeInteger(since) && since >= 0)) throw badArgument(`since must be an event index, a whole number from 0; not ${String(since)}`);
    return new Watch(this, prefix, since, options);
  }

  /** Creates a lease (for callers that manage leases themselves; a lock makes its own). */
  async createLease(ttlMs: number): Promise<{ leaseId: string; ttlMs: number }> {
    await this.serverApi();
    return this.calls.createLease(wholeMs(ttlMs, "ttlMs", 1));
  }

  /** Keeps a lease alive once; its TTL. `LeaseNotFoundError` once it is gone. */
  async keepalive(leaseId: string): Promise<number> {
    await this.serverApi();
    return this.calls.keepalive(checkLeaseId(leaseId), performance.now() + this.#requestTimeoutMs);
  }

  /** Revokes a lease: every lock held under it is released. Idempotent. */
  async revokeLease(leaseId: string): Promise<void> {
    await this.serverApi();
    return this.calls.revoke(checkLeaseId(leaseId));
  }

  /** Closes idle connections (calls in flight and open watches go on; a later call opens new ones). */
  close(): void {
    for (const e of this.calls.members.endpoints) e.close();
  }

  /** Best effort: a lease nobody will use is given back now rather than after its TTL. */
  #revokeInBackground(leaseId: string): void {
    this.calls.revoke(leaseId).catch(() => {});
  }
}

function checkLeaseId(id: string): string {
  if (typeof id !== "string" || !/^[0-9a-fA-F]{32}$/.test(id)) throw badArgument(`a lease id is 32 hex digits, not ${JSON.stringify(id)}`);
  return id;
}
