// The API's calls, one function each, over the members (failover.ts): what is sent,
// what may be retried, and how an answer is read. Internal: `Client` and `Lock` are
// the public surface.

import { Answer } from "./http.js";
import { Members, Outcome, Tried, movesOn } from "./failover.js";
import {
  BadResponseError,
  FencedError,
  NotHolderError,
  StaleTokenError,
  UnavailableError,
  badArgument,
  errorFromAnswer,
  isObject,
} from "./errors.js";

/** A grant as the server answers it. */
export interface GrantBody {
  name: string;
  token: number;
  leaseId: string;
  ttlMs: number;
  /** A set acquired together: every name's token, in sorted order. */
  tokens?: Map<string, number>;
  /** The service's signature (hex) of every lock's token, when it signs grants. */
  signatures?: Map<string, string>;
}

/** A fenced write's answer. */
export interface PutResult {
  key: string;
  token: number;
  /** The key's mark after the write (equal to `token`). */
  highestSeen: number;
}

/** A read's answer. */
export interface GetResult {
  value: Uint8Array;
  /** The key's mark after the read, when it has one. */
  highestSeen: number | undefined;
}

export class Calls {
  readonly members: Members;
  readonly requestTimeoutMs: number;

  constructor(members: Members, requestTimeoutMs: number) {
    this.members = members;
    this.requestTimeoutMs = requestTimeoutMs;
  }

  /**
   * One acquire under the implicit lease `leaseId` (the caller drew it), waiting in the
   * queue up to `waitMs`. Every attempt, on this member or the next, names the same
   * lease, so a retry after a lost answer gets the first attempt's grant, or waits
   * beside it (docs/server.md, *Retried implicit acquires*). A retry waits only what
   * is left of the wait. `holder`, when given, is sent as `"holder"` on every attempt,
   * unchanged (the server checks it: 400 `invalid_holder`). Resolves with the last
   * attempt's outcome and whether the service answered it (a grant or a refusal that
   * left nothing behind).
   */
  async acquireOnce(name: string, leaseId: string, ttlMs: number, waitMs: number, signal?: AbortSignal, holder?: string, names?: string[]): Promise<{ tried: Tried; answered: boolean }> {
    const path = names === undefined ? `/v1/locks/${segment(name)}/acquire` : "/v1/locks/acquire";
    const giveUpAt = performance.now() + waitMs;
    const deadline = giveUpAt + this.requestTimeoutMs;
    const tried = await this.members.each(
      deadline,
      (ep, s) => {
        const waitLeft = Math.max(0, Math.floor(giveUpAt - performance.now()));
        const json = { ...(names !== undefined ? { names } : {}), lease_id: leaseId, ttl_ms: ttlMs, wait_ms: waitLeft, ...(holder !== undefined ? { holder } : {}) };
        return ep.send({ method: "POST", path, json, timeoutMs: Math.max(1, deadline - performance.now()), signal: s });
      },
      { retrySingle: true, signal },
    );
    return { tried, answered: !movesOn(tried.outcome) && tried.outcome.ok };
  }

  /** Keeps `leaseId` alive once: the TTL the server answered. Idempotent, so retried. */
  async keepalive(leaseId: string, deadline: number, signal?: AbortSignal): Promise<number> {
    const path = `/v1/leases/${leaseId}/keepalive`;
    const a = await this.#call(deadline, path, "POST", undefined, signal);
    return readLease(a, "keepalive").ttlMs;
  }

  /** Revokes a lease (its locks are released). A lease already gone counts as revoked. */
  async revoke(leaseId: string): Promise<void> {
    const deadline = performance.now() + this.requestTimeoutMs;
    const tried = await this.members.each(deadline, (ep, s) => ep.send({ method: "DELETE", path: `/v1/leases/${leaseId}`, timeoutMs: this.requestTimeoutMs, signal: s }), { retrySingle: true });
    const a = unwrap(tried.outcome);
    if (a.status === 204 || a.status === 200 || a.status === 404) return;
    throw errorFromAnswer(a.status, a.body, "revoking the lease");
  }

  /**
   * An operator's revoke of `name`, only while `token` holds it: the token taken. Named,
   * it is safe to retry: a retry after a lost answer finds the lock free or held by the
   * next holder, and takes nothing. But then the first attempt's fate is unknown, so that
   * `not_holder` is reported as `UnavailableError` (`uncertain`), never as a clean refusal.
   */
  async revokeLock(name: string, token: number): Promise<number> {
    const deadline = performance.now() + this.requestTimeoutMs;
    const path = `/v1/locks/${segment(name)}/revoke`;
    const tried = await this.members.each(deadline, (ep, s) => ep.send({ method: "POST", path, json: { token }, timeoutMs: Math.max(1, deadline - performance.now()), signal: s }), { retrySingle: true });
    const a = unwrap(tried.outcome);
    if (a.status === 200) {
      const v = json(a, "revoke");
      if (v.token !== token || v.revoked !== true) throw bad("revoke", `asked to revoke token ${token}, answered ${JSON.stringify(v)}`);
      return token;
    }
    const e = errorFromAnswer(a.status, a.body, `revoking '${name}' from token ${token}`);
    if (e instanceof NotHolderError && tried.uncertain) {
      throw new UnavailableError("uncertain", `the revoke of '${name}' from token ${token} was retried after a lost answer and the retry found the token no longer holding it (${e.message}): the first attempt may have taken it`, undefined, e.details, { cause: e });
    }
    throw e;
  }

  /** Creates a lease of `ttlMs`. Not retried after it may have reached a member (it would make a second lease). */
  async createLease(ttlMs: number): Promise<{ leaseId: string; ttlMs: number }> {
    const deadline = performance.now() + this.requestTimeoutMs;
    const tried = await this.members.each(deadline, (ep, s) => ep.send({ method: "POST", path: "/v1/leases", json: { ttl_ms: ttlMs }, timeoutMs: this.requestTimeoutMs, signal: s }), { retrySingle: false });
    const a = unwrap(tried.outcome);
    if (a.status !== 201 && a.status !== 200) throw errorFromAnswer(a.status, a.body, "creating a lease");
    return readLease(a, "create lease");
  }

  /** Whether `token` is the current grant of `name` (Chubby's CheckSequencer), and the holder's token. */
  async check(name: string, token: number): Promise<{ current: boolean; token: number | null }> {
    const deadline = performance.now() + this.requestTimeoutMs;
    const a = await this.#call(deadline, `/v1/locks/${segment(name)}/check`, "POST", { token });
    if (a.status !== 200) throw errorFromAnswer(a.status, a.body, `checking token ${token} of '${name}'`);
    const v = json(a, "check");
    if (typeof v.current !== "boolean") throw bad("check", "no 'current'");
    return { current: v.current, token: typeof v.token === "number" ? v.token : null };
  }

  /** `GET path` as JSON (the views: a lock, the cluster). */
  async view(what: string, path: string): Promise<Record<string, unknown>> {
    const deadline = performance.now() + this.requestTimeoutMs;
    const a = await this.#call(deadline, path, "GET");
    if (a.status !== 200) throw errorFromAnswer(a.status, a.body, what);
    return json(a, what);
  }

  /**
   * A fenced write. Retried after a lost answer it may have been applied twice under
   * one token: harmless (the gate admits a token equal to the mark, and any other
   * writer's token is higher and would have refused the retry). But a retry refused
   * as stale leaves the first attempt's fate unknown, so that refusal is reported as
   * `UnavailableError`, never as a clean `StaleTokenError`.
   */
  async put(key: string, value: Uint8Array, token: number, signature?: string): Promise<PutResult> {
    const deadline = performance.now() + this.requestTimeoutMs;
    const path = `/v1/store/${segment(key)}`;
    const headers: Record<string, string> = { "fencing-token": String(token), ...signed(signature) };
    const tried = await this.members.each(deadline, (ep, s) => ep.send({ method: "PUT", path, headers, bytes: value, timeoutMs: Math.max(1, deadline - performance.now()), signal: s }), { retrySingle: true });
    const a = unwrap(tried.outcome);
    if (a.status === 200 || a.status === 201) {
      const v = json(a, "store write");
      if (v.token !== token || typeof v.highest_seen !== "number") throw bad("store write", `asked to write under token ${token}, answered ${JSON.stringify(v)}`);
      return { key, token, highestSeen: v.highest_seen };
    }
    const e = errorFromAnswer(a.status, a.body, `writing '${key}' under token ${token}`);
    if (e instanceof StaleTokenError && tried.uncertain) {
      throw new UnavailableError("uncertain", `the write of '${key}' under token ${token} was retried after a lost answer and the retry was refused as stale (${e.message}): the first attempt may have been applied`, undefined, e.details, { cause: e });
    }
    throw e;
  }

  /** A read, fenced when `token` is given; `null` when the key holds no value. */
  async get(key: string, token: number | undefined, signature?: string): Promise<GetResult | null> {
    const deadline = performance.now() + this.requestTimeoutMs;
    const headers: Record<string, string> = token === undefined ? {} : { "fencing-token": String(token), ...signed(signature) };
    const tried = await this.members.each(deadline, (ep, s) => ep.send({ method: "GET", path: `/v1/store/${segment(key)}`, headers, timeoutMs: Math.max(1, deadline - performance.now()), signal: s }), { retrySingle: true });
    const a = unwrap(tried.outcome);
    const header = a.headers["fencing-highest-seen"];
    const mark = typeof header === "string" && /^\d+$/.test(header.trim()) ? Number(header.trim()) : undefined;
    // A copy: the answer's buffer may be a slice of node's shared pool.
    if (a.status === 200) return { value: new Uint8Array(a.body), highestSeen: mark };
    const e = errorFromAnswer(a.status, a.body, token === undefined ? `reading '${key}'` : `reading '${key}' under token ${token}`);
    if (a.status === 404 && e.code === "not_found") return null;
    throw e;
  }

  /** One idempotent call: moved on and retried until `deadline`. */
  async #call(deadline: number, path: string, method: "GET" | "POST", body?: unknown, signal?: AbortSignal): Promise<Answer> {
    const tried = await this.members.each(
      deadline,
      (ep, s) => ep.send({ method, path, ...(body !== undefined ? { json: body } : {}), timeoutMs: Math.max(1, deadline - performance.now()), signal: s }),
      { retrySingle: true, signal },
    );
    return unwrap(tried.outcome);
  }
}

/** The answer, or the error that stood for it. */
export function unwrap(o: Outcome): Answer {
  if (o.ok) return o.answer;
  throw o.error instanceof Error ? o.error : new FencedError("unknown", String(o.error));
}

/** Reads a grant: `{"name","token","lease_id","ttl_ms"}`. */
/** The store's `Fencing-Signature` header, when a signature is given. */
function signed(signature: string | undefined): Record<string, string> {
  return signature === undefined ? {} : { "fencing-signature": signature };
}

export function readGrant(a: Answer, name: string): GrantBody {
  const v = json(a, "acquire");
  const { token, lease_id: leaseId, ttl_ms: ttlMs } = v;
  if (v.name !== name) throw bad("acquire", `asked for lock '${name}', granted '${String(v.name)}'`);
  if (!isToken(token)) throw bad("acquire", `the token ${JSON.stringify(token)} is not a positive integer below 2^53`);
  if (typeof leaseId !== "string" || !/^[0-9a-f]{32}$/i.test(leaseId)) throw bad("acquire", "no lease id");
  if (typeof ttlMs !== "number" || !(ttlMs > 0)) throw bad("acquire", "no TTL");
  const signatures = typeof v.signature === "string" ? new Map([[name, v.signature]]) : undefined;
  return { name, token, leaseId: leaseId.toLowerCase(), ttlMs, ...(signatures ? { signatures } : {}) };
}

/** The answer to `POST /v1/locks/acquire`: the first grant, with every name's token. */
export function readGrantAll(a: Answer, names: readonly string[]): GrantBody {
  const v = json(a, "acquire");
  const grants = v.grants;
  if (!Array.isArray(grants) || grants.length !== names.length) throw bad("acquire", `asked for locks ${JSON.stringify(names)}, granted ${JSON.stringify(v).slice(0, 200)}`);
  const tokens = new Map<string, number>();
  const signatures = new Map<string, string>();
  let first: GrantBody | undefined;
  for (const [i, g] of grants.entries()) {
    const one = readGrant({ ...a, body: Buffer.from(JSON.stringify(g)) }, names[i] as string);
    if (first !== undefined && one.leaseId !== first.leaseId) throw bad("acquire", "the locks of one request were granted under different leases");
    first ??= one;
    tokens.set(one.name, one.token);
    const sig = one.signatures?.get(one.name);
    if (sig !== undefined) signatures.set(one.name, sig);
  }
  // Signed, every grant carries one; a set signed only in part is no signed set.
  const signed = signatures.size === grants.length ? { signatures } : { signatures: undefined };
  return { ...(first as GrantBody), tokens, ...signed };
}

function readLease(a: Answer, what: string): { leaseId: string; ttlMs: number } {
  if (a.status !== 200 && a.status !== 201) throw errorFromAnswer(a.status, a.body, what);
  const v = json(a, what);
  if (typeof v.lease_id !== "string" || typeof v.ttl_ms !== "number") throw bad(what, JSON.stringify(v));
  return { leaseId: v.lease_id, ttlMs: v.ttl_ms };
}

function json(a: Answer, what: string): Record<string, unknown> {
  try {
    const v: unknown = JSON.parse(a.body.toString("utf8"));
    if (isObject(v)) return v;
  } catch {
    // below
  }
  throw bad(what, `not a JSON object: ${a.body.toString("utf8").slice(0, 200)}`);
}

function bad(what: string, detail: string): BadResponseError {
  return new BadResponseError("bad_response", `${what}: the server's answer cannot be read: ${detail}`);
}

/** Tokens are JSON numbers; every one the service issues is a positive integer below 2^53. */
export function isToken(t: unknown): t is number {
  return typeof t === "number" && Number.isSafeInteger(t) && t > 0;
}

/** Percent-encodes one path segment: everything but RFC 3986's unreserved characters, so `orders/42` stays one segment. */
export function segment(s: string): string {
  return encodeURIComponent(s).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** Checks a lock name or store key as the server will (1 to 256 bytes of UTF-8, no control characters). */
export function checkName(what: "lock name" | "store key", s: unknown): string {
  if (typeof s !== "string" || s === "") throw badArgument(`the ${what} must be a non-empty string`);
  if (LONE_SURROGATE.test(s)) throw badArgument(`the ${what} is not valid Unicode (a lone surrogate)`);
  const bytes = Buffer.byteLength(s, "utf8");
  if (bytes > 256) throw badArgument(`the ${what} is ${bytes} bytes of UTF-8; at most 256`);
  if (CONTROL.test(s)) throw badArgument(`the ${what} has a control character`);
  return s;
}

