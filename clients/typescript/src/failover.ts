// Moving between the members of a cluster, as the Rust client does (its failover.rs):
// a call goes to the member that answered last and moves to the next when that one
// cannot be reached, answers `not_leader` or `shutting_down`, or falls silent; round
// after round (100 ms apart) until the call's deadline.
//
// Silent or busy: a live leader may keep a request on purpose (an acquire parked in the
// queue), so a request has no deadline of its own; the member has. When a request has
// had no answer for half the attempt time-out, the member is asked whether it is alive
// (`GET /readyz` answering `leader: true`), and must answer within the other half. A
// member that answers neither is left, and skipped by every call for one attempt
// time-out. Any answer from a member counts as that proof for every call waiting on it.
//
// Leaving a request does not undo it: the member may have applied it. The call is told
// (`uncertain`), and each call decides what that means for its answer.

import { Answer, CONNECTION_LOST, Endpoint, TIMEOUT, TLS_REFUSED, UNREACHABLE, abortError } from "./http.js";
import { UnavailableError, isObject } from "./errors.js";

/** A cluster's default election time-out (300 to 600 ms) plus a margin. */
export const ATTEMPT_TIMEOUT_DEFAULT_MS = 750;
/** Half of it bounds the probe, which must leave a live member on loopback time to answer. */
export const ATTEMPT_TIMEOUT_MIN_MS = 20;
/** The pause between rounds over every member while none takes the call. */
const ROUND_PAUSE_MS = 100;

/** What one attempt gave: the member's answer, or why there was none. */
export type Outcome = { ok: true; answer: Answer } | { ok: false; error: unknown };

/** A call's outcome, and whether an earlier attempt of it may have reached a member. */
export interface Tried {
  outcome: Outcome;
  uncertain: boolean;
}

/** How a call is made on one member: the request, aborted by `signal` when the call leaves it. */
export type Call = (endpoint: Endpoint, signal: AbortSignal) => Promise<Answer>;

export interface EachOptions {
  /** With a single member, whether a failure in transit is tried again on it (idempotent calls). */
  retrySingle: boolean;
  /** The caller's own abort (a withdrawn acquire). */
  signal?: AbortSignal | undefined;
}

/** The error code of an error answer, if it has the API's error shape. */
export function answerCode(a: Answer): string | undefined {
  if (a.status < 400) return undefined;
  try {
    const v: unknown = JSON.parse(a.body.toString("utf8"));
    const e = isObject(v) ? v.error : undefined;
    return isObject(e) && typeof e.code === "string" ? e.code : undefined;
  } catch {
    return undefined;
  }
}

/** A failure in transit: the member could not be reached, the connection broke, or no answer came in time. */
export function inTransit(error: unknown): boolean {
  return error instanceof UnavailableError && [UNREACHABLE, TLS_REFUSED, CONNECTION_LOST, TIMEOUT].includes(error.code);
}

/** Never reached the member: the endpoint already tried its connection as often as it should. */
function neverSent(o: Outcome): boolean {
  return !o.ok && o.error instanceof UnavailableError && (o.error.code === UNREACHABLE || o.error.code === TLS_REFUSED);
}

/** The call goes to the next member: nothing was done, or the member cannot be asked. */
export function movesOn(o: Outcome): boolean {
  if (!o.ok) return inTransit(o.error);
  if (o.answer.status !== 503) return false;
  const code = answerCode(o.answer);
  return code === "not_leader" || code === "shutting_down";
}

type Attempt = { kind: "answered"; outcome: Outcome } | { kind: "silent" } | { kind: "timed_out" };

export class Members {
  readonly endpoints: readonly Endpoint[];
  readonly attemptTimeoutMs: number;
  /** The member that answered last. */
  #current = 0;
  /** Per member: its last answer (or probe) showing it alive and leading; performance.now(). */
  readonly #answeredAt: number[];
  /** Per member: calls skip it until then (found silent). */
  readonly #silentUntil: number[];

  constructor(endpoints: Endpoint[], attemptTimeoutMs: number) {
    this.endpoints = endpoints;
    this.attemptTimeoutMs = attemptTimeoutMs;
    this.#answeredAt = endpoints.map(() => -Infinity);
    this.#silentUntil = endpoints.map(() => -Infinity);
  }

  get current(): Endpoint {
    return this.endpoints[this.#current % this.endpoints.length] as Endpoint;
  }

  /** Runs `call` on the current member, and on the next while `moves` says so or the member is silent, until `deadline` (performance.now()). */
  async each(deadline: number, call: Call, o: EachOptions, moves: (o: Outcome) => boolean = movesOn): Promise<Tried> {
    const n = this.endpoints.length;
    const started = performance.now();
    const first = this.#current;
    let uncertain = false;
    let last: Outcome | undefined;
    // Bounded: every round waits ROUND_PAUSE_MS or more, and the loop ends at the deadline.
    for (let k = 0; ; k++) {
      const i = (first + k) % n;
      const skip = n > 1 && this.#isSilent(i) && !this.endpoints.every((_, j) => this.#isSilent(j));
      if (!skip) {
        const a = await this.#attempt(i, call, deadline, o.signal);
        if (a.kind === "timed_out") break;
        if (a.kind === "silent") {
          uncertain = true;
          const e = new UnavailableError(TIMEOUT, `${this.endpoints[i]?.url}: silent for ${this.attemptTimeoutMs} ms; moved on`);
          last = { ok: false, error: e };
        } else {
          if (!moves(a.outcome)) {
            if (a.outcome.ok) this.#markAnswered(i);
            this.#current = i;
            return { outcome: a.outcome, uncertain };
          }
          // One member: a connection that could not be opened was already tried again by
          // the endpoint (as the Rust client does); a lost answer is tried again here.
          if (n === 1 && (!o.retrySingle || neverSent(a.outcome))) return { outcome: a.outcome, uncertain };
          // A connection that broke, a time-out, or a refusal after a proposal may have done it.
          uncertain ||= !a.outcome.ok ? !neverSent(a.outcome) : answerCode(a.outcome.answer) === "not_leader";
          last = a.outcome;
        }
      }
      if ((k + 1) % n === 0) {
        if (performance.now() + ROUND_PAUSE_MS > deadline || o.signal?.aborted) break;
        await pause(ROUND_PAUSE_MS);
      }
    }
    if (o.signal?.aborted) return { outcome: { ok: false, error: abortError(o.signal, "the call") }, uncertain: true };
    if (last !== undefined && performance.now() < deadline) return { outcome: last, uncertain: true };
    const tried = this.endpoints.map((e) => e.url).join(", ");
    const ms = Math.round(deadline - started);
    const why = last !== undefined && !last.ok && last.error instanceof Error ? `; last: ${last.error.message}` : "";
    return { outcome: { ok: false, error: new UnavailableError(TIMEOUT, `no member answered within ${ms} ms (tried ${tried})${why}`) }, uncertain: true };
  }

  /** One attempt on member `i`, waiting while the member shows it is alive (with several members). */
  async #attempt(i: number, call: Call, deadline: number, outer: AbortSignal | undefined): Promise<Attempt> {
    const ep = this.endpoints[i] as Endpoint;
    const ac = new AbortController();
    const onOuter = (): void => ac.abort(outer?.reason);
    if (outer?.aborted) ac.abort(outer.reason);
    outer?.addEventListener("abort", onOuter, { once: true });
    const request: Promise<Outcome> = call(ep, ac.signal).then(
      (answer) => ({ ok: true, answer }),
      (error: unknown) => ({ ok: false, error }),
    );
    const timers = new Timers();
    try {
      if (this.endpoints.length === 1) {
        const r = await Promise.race([request, timers.after(deadline - performance.now(), "deadline" as const)]);
        if (r === "deadline") return this.#leave(ac, { kind: "timed_out" });
        return { kind: "answered", outcome: r };
      }
      const half = this.attemptTimeoutMs / 2;
      const startedAt = performance.now();
      for (;;) {
        const left = deadline - performance.now();
        const r = await Promise.race([request, timers.after(Math.min(half, left), "tick" as const)]);
        if (r !== "tick") return { kind: "answered", outcome: r };
        if (performance.now() >= deadline) return this.#leave(ac, { kind: "timed_out" });
        if (this.#foundSilentSince(i, startedAt)) return this.#leave(ac, { kind: "silent" });
        if (performance.now() - this.#answeredAt[i]! < half) continue;
        const probe = ep.probe(half, ac.signal).then((alive) => ({ alive }));
        const r2 = await Promise.race([request, probe, timers.after(deadline - performance.now(), "deadline" as const)]);
        if (r2 === "deadline") return this.#leave(ac, { kind: "timed_out" });
        if ("alive" in r2) {
          if (!r2.alive) {
            this.#markSilent(i);
            return this.#leave(ac, { kind: "silent" });
          }
          this.#markAnswered(i);
          continue;
        }
        return { kind: "answered", outcome: r2 };
      }
    } finally {
      timers.clear();
      outer?.removeEventListener("abort", onOuter);
    }
  }

  /** Leaves a request: its connection closes (a queued acquire is withdrawn by the server). */
  #leave(ac: AbortController, a: Attempt): Attempt {
    ac.abort(new UnavailableError(TIMEOUT, "the call left this member"));
    return a;
  }

  #markAnswered(i: number): void {
    this.#answeredAt[i] = Math.max(this.#answeredAt[i]!, performance.now());
    this.#silentUntil[i] = -Infinity;
  }

  #markSilent(i: number): void {
    this.#silentUntil[i] = Math.max(this.#silentUntil[i]!, performance.now() + this.attemptTimeoutMs);
  }

  /** Found silent by a probe that ended at or after `since`. */
  #foundSilentSince(i: number, since: number): boolean {
    const until = this.#silentUntil[i]!;
    return until > performance.now() && until - this.attemptTimeoutMs >= since;
  }

  #isSilent(i: number): boolean {
    return this.#silentUntil[i]! > performance.now();
  }
}

/** Timers for one race, all cleared together. */
class Timers {
  readonly #handles: NodeJS.Timeout[] = [];
  after<T>(ms: number, value: T): Promise<T> {
    return new Promise((resolve) => {
      this.#handles.push(setTimeout(() => resolve(value), Math.max(0, ms)));
    });
  }
  clear(): void {
    for (const h of this.#handles) clearTimeout(h);
  }
}

function pause(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
