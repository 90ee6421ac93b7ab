// A held lock: the grant, a background keepalive, and an honest lost-lock signal.
//
// The lock trusts this process's monotonic clock (performance.now()), not the server:
// it is valid until the send time of its last successful acquire or keepalive, plus
// the TTL, minus a margin (a tenth of the TTL by default). A keepalive the server
// refuses (404 lease_not_found, 401, 403), or one that cannot come back before that
// deadline, makes it lost at once; a timer makes it lost at the deadline if nothing
// succeeded. Lost is final. The timers are unref'd: a lock never holds the process open.

import { Calls, GrantBody } from "./calls.js";
import { FencedError, ForbiddenError, LeaseNotFoundError, LockLostError, LostReason, UnauthorizedError } from "./errors.js";
import { sleep } from "./http.js";

/** What an acquire produced: the server's grant, with the deadline's terms. */
export interface Grant extends GrantBody {
  /** The TTL as granted (never above the one asked for). */
  ttlMs: number;
  marginMs: number;
  /** performance.now() just before the acquire (or the renewal after a queue) was sent. */
  sentAt: number;
}

/** The client-side deadline of a lease last renewed by a request sent at `sentAt`. */
export function validUntil(sentAt: number, ttlMs: number, marginMs: number): number {
  return sentAt + Math.max(0, ttlMs - marginMs);
}

/** The margin kept below the TTL when the caller names none. */
export function defaultMargin(ttlMs: number): number {
  return ttlMs / 10;
}

export class Lock {
  /** The lock's name. */
  readonly name: string;
  /** The grant's fencing token: pass it with every operation on the resource. */
  readonly token: number;
  /** The lease the lock is held under (32 hex digits); only this lock uses it. */
  readonly leaseId: string;
  /** The lease's TTL as granted. */
  readonly ttlMs: number;
  /** Kept below the TTL in the deadline. */
  readonly marginMs: number;
  /** Every lock held with its token: a set of `Client.lockAll` (sorted by name), or this one lock. Fence each resource with its own lock's. */
  readonly tokens: ReadonlyMap<string, number>;
  /**
   * The service's signature of `token` for this lock (hex), when it signs grants
   * (`grant_signing_key`): what a gate given the keys asks for (`Verified`, a key under
   * the server's `signed_key_prefix`). `undefined` otherwise.
   */
  readonly signature: string | undefined;
  /** Every lock's signature (hex), as `tokens`; empty when the service does not sign. */
  readonly signatures: ReadonlyMap<string, string>;

  readonly #calls: Calls;
  #validUntil: number;
  readonly #lost = new AbortController();
  #reason: LostReason | undefined;
  /** Aborted on release: stops the keepalive and its request. */
  readonly #stop = new AbortController();
  #deadlineTimer: NodeJS.Timeout | undefined;
  #released: Promise<void> | undefined;

  /** @internal Made by `Client.lock`. */
  constructor(grant: Grant, calls: Calls) {
    this.name = grant.name;
    this.token = grant.token;
    this.leaseId = grant.leaseId;
    this.ttlMs = grant.ttlMs;
    this.marginMs = grant.marginMs;
    this.tokens = grant.tokens ?? new Map([[grant.name, grant.token]]);
    this.signatures = grant.signatures ?? new Map();
    this.signature = this.signatures.get(grant.name);
    this.#calls = calls;
    this.#validUntil = validUntil(grant.sentAt, grant.ttlMs, grant.marginMs);
    this.#armDeadline();
    void this.#keepalive(grant.sentAt);
  }

  /** The client-side deadline, on performance.now()'s clock: past it the lock is lost whatever the server says. */
  get validUntil(): number {
    return this.#validUntil;
  }

  /**
   * Aborted (with a `LockLostError` as its reason) when the lock is lost or can no
   * longer be trusted. Reading it checks the clock too. The abort comes from a timer:
   * code that wakes in the same turn of the event loop as the end of a long pause may
   * run before it, so call `check()` right before each write.
   */
  get signal(): AbortSignal {
    this.#checkClock();
    return this.#lost.signal;
  }

  /** Why the lock was lost, once it was. */
  get lostReason(): LostReason | undefined {
    this.#checkClock();
    return this.#reason;
  }

  /** Whether the lock can still be trusted right now: not lost, and before `validUntil` (read from the clock). */
  isValid(): boolean {
    this.#checkClock();
    return this.#reason === undefined;
  }

  /** The token if the lock can still be trusted now; throws `LockLostError` otherwise. */
  check(): number {
    this.#checkClock();
    if (this.#reason !== undefined) throw new LockLostError(this.#reason, this.name);
    return this.token;
  }

  /**
   * Releases the lock and deletes its lease. Rejects with `LockLostError` if the lock
   * had been lost before (the work done under it may not have been exclusive); the
   * release is still sent. Calling it again answers the first call's outcome.
   */
  release(): Promise<void> {
    this.#released ??= this.#release();
    return this.#released;
  }

  async #release(): Promise<void> {
    this.#checkClock();
    const reason = this.#reason;
    this.#halt();
    let failure: unknown;
    try {
      // Ending the implicit lease, which only this lock (or set) used, releases every
      // lock of it in one command (reported as a release).
      await this.#calls.revoke(this.leaseId);
    } catch (e) {
      failure = e;
    }
    if (reason !== undefined) throw new LockLostError(reason, this.name);
    if (failure !== undefined) throw failure;
  }

  #checkClock(): void {
    if (this.#reason === undefined && !this.#stop.signal.aborted && performance.now() >= this.#validUntil) this.#lose("expired");
  }

  #lose(reason: LostReason): void {
    if (this.#reason !== undefined) return;
    this.#reason = reason;
    this.#halt();
    this.#lost.abort(new LockLostError(reason, this.name));
  }

  /** Stops the timers and the keepalive (on loss or release). */
  #halt(): void {
    clearTimeout(this.#deadlineTimer);
    this.#stop.abort();
  }

  /** A timer at the deadline: fires the lost signal if nothing moved it meanwhile. */
  #armDeadline(): void {
    clearTimeout(this.#deadlineTimer);
    if (this.#stop.signal.aborted) return;
    const fire = (): void => {
      if (performance.now() >= this.#validUntil) this.#lose("expired");
      else this.#armDeadline(); // a timer may fire a fraction of a millisecond early
    };
    this.#deadlineTimer = setTimeout(fire, Math.max(0, Math.ceil(this.#validUntil - performance.now())));
    this.#deadlineTimer.unref();
  }

  #extend(sentAt: number, ttlMs: number): void {
    const next = validUntil(sentAt, Math.min(ttlMs, this.ttlMs), this.marginMs);
    if (next > this.#validUntil) {
      this.#validUntil = next;
      this.#armDeadline();
    }
  }

  /**
   * Keeps the lease alive every TTL/3, counted from the last successful send. A
   * keepalive that fails in transit is retried (it is idempotent) while the deadline
   * allows; its answer only ever moves the deadline to its own send time + TTL − margin.
   */
  async #keepalive(sentAt: number): Promise<void> {
    const stop = this.#stop.signal;
    const retryStepMs = Math.max(this.ttlMs / 10, 10);
    let next = sentAt + this.ttlMs / 3;
    // Bounded: every turn sleeps, and the loop ends at the deadline, on loss or on release.
    while (!stop.aborted) {
      try {
        await sleep(next - performance.now(), stop, true);
      } catch {
        return; // released or lost
      }
      const deadline = this.#validUntil;
      const sent = performance.now();
      if (sent >= deadline) return this.#lose("expired");
      let ttlMs: number;
      try {
        ttlMs = await this.#calls.keepalive(this.leaseId, Math.min(deadline, sent + this.#calls.requestTimeoutMs), stop);
      } catch (e) {
        if (stop.aborted) return;
        if (e instanceof LeaseNotFoundError) return this.#lose("lease_not_found");
        if (e instanceof UnauthorizedError || e instanceof ForbiddenError) return this.#lose("unauthorized");
        // The answer could not come before the deadline: the lease may be gone.
        if (performance.now() >= deadline) return this.#lose("expired");
        if (!(e instanceof FencedError)) return this.#lose("expired"); // a bug here must not look like a live lock
        next = performance.now() + retryStepMs;
        continue;
      }
      if (stop.aborted) return;
      if (performance.now() >= deadline) return this.#lose("keepalive_too_late");
      this.#extend(sent, ttlMs);
      next = sent + this.ttlMs / 3;
    }
  }
}
