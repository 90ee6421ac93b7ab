// A watch on the service's events that misses nothing across a reconnect, as the Rust
// client's watch.rs.
//
// Every event has an `index`, strictly increasing and the same on every member. The
// watch remembers the last position the server told it (an event's index, or a position
// marker: a block with `id:` and no data, sent when a stream opens and while events of
// other prefixes pass by) and, when the stream breaks (a reset, its end, or no byte for
// 45 s), reopens it on whichever member answers (the client's failover) with `since` that
// position, so the events after it arrive exactly once. When the members no longer hold
// every event after it (410 `compacted`) or the stream fell behind (`lagged`), the watch
// throws `MissedEventsError` rather than go on with a gap.

import type http from "node:http";
import { StringDecoder } from "node:string_decoder";

import { Calls, isToken, unwrap } from "./calls.js";
import { ServerApi } from "./compat.js";
import { BadRequestError, BadResponseError, FencedError, MissedEventsError, UnavailableError, errorFromAnswer, isObject } from "./errors.js";
import { answerCode } from "./failover.js";
import { type Endpoint, TLS_REFUSED, sleep } from "./http.js";

/** No byte for this long (the server sends a comment at least every 15 s): the stream is taken for dead and reopened. */
export const WATCH_SILENCE_MS = 45_000;
/** How long a watch tries to reopen a broken stream before it throws `UnavailableError`. */
export const WATCH_RETRY_FOR_MS = 30_000;
/** The most one SSE block may take (an event is a few hundred bytes): more is a broken stream. */
const BLOCK_CHARS_MAX = 64 * 1024;
/** Unread text past this pauses the connection until the reader catches up. */
const BUFFERED_CHARS_MAX = 1024 * 1024;
const BACKOFF_FIRST_MS = 50;
const BACKOFF_MAX_MS = 2000;

interface EventBase {
  /** Its position: strictly increasing, the same on every member; also its SSE `id:`. */
  index: number;
  /** The lock table's time of the log entry, in milliseconds. */
  at_ms: number;
}

/** A lock was granted; `holder` is the label the holder gave, if any. */
export interface GrantedEvent extends EventBase {
  type: "granted";
  name: string;
  token: number;
  ttl_ms: number;
  holder?: string;
}

/** A lock was released: by its holder (`released`), with its lease (`revoked`), or by an operator (`forced`, `revokeLock`). */
export interface ReleasedEvent extends EventBase {
  type: "released";
  name: string;
  token: number;
  reason: "released" | "revoked" | "forced";
}

/** A lock's lease ran out. */
export interface ExpiredEvent extends EventBase {
  type: "expired";
  name: string;
  token: number;
}

/** The fenced store took a write or a fenced read under `token`. */
export interface StoreAcceptedEvent extends EventBase {
  type: "store_accepted";
  key: string;
  token: number;
  op: "write" | "read";
}

/** The fenced store refused `token`: the key had seen `highest_seen`. */
export interface StoreRejectedEvent extends EventBase {
  type: "store_rejected";
  key: string;
  token: number;
  highest_seen: number;
  op: "write" | "read";
}

/** An event of a type this client does not know (a newer server's): `event` is its type, `data` its JSON. */
export interface OtherEvent extends EventBase {
  type: "other";
  event: string;
  data: Record<string, unknown>;
}

/** One event, with the server's field names; narrow it on `type`. */
export type WatchEvent = GrantedEvent | ReleasedEvent | ExpiredEvent | StoreAcceptedEvent | StoreRejectedEvent | OtherEvent;

export interface WatchOptions {
  /** Aborting it closes the watch, as `close()` does. */
  signal?: AbortSignal;
  /** @internal How long a stream may be silent before it is taken for dead (default 45 s; tests shorten it). */
  silenceMs?: number;
  /** @internal How long a broken stream is reopened before `UnavailableError` (default 30 s; tests shorten it). */
  retryForMs?: number;
}

/** What a watch needs of its client. */
export interface WatchSource {
  readonly calls: Calls;
  serverApi(): Promise<ServerApi>;
}

const DONE: IteratorReturnResult<undefined> = { done: true, value: undefined };

/**
 * A watch of the events of lock names and store keys that start with a prefix
 * (`client.watch`): an async iterable (`for await (const e of watch)`), one event at a
 * time. `next()` throws `MissedEventsError` when it cannot go on without a gap (final:
 * later calls throw it again), `UnavailableError` after 30 s without a stream (call again
 * to go on trying from the same position), and any other refusal of the server as its
 * typed error. `close()` (or leaving a `for await` loop, or the `signal`) ends it.
 */
export class Watch implements AsyncIterableIterator<WatchEvent> {
  /** The prefix watched ("" for every name and key). */
  readonly prefix: string;
  readonly #source: WatchSource;
  readonly #silenceMs: number;
  readonly #retryForMs: number;
  #position: number | undefined;
  /** Whether a stream was ever open: from then on, a reopen needs the position. */
  #started: boolean;
  #stream: EventStream | undefined;
  readonly #ready: WatchEvent[] = [];
  /** Aborted by close(): ends waits, opens and the stream. */
  readonly #stop = new AbortController();
  /** A final error, thrown again by every later call. */
  #failed: FencedError | undefined;
  /** Calls of next() run one after the other. */
  #queue: Promise<unknown> = Promise.resolve();

  /** @internal Made by `Client.watch`. */
  constructor(source: WatchSource, prefix: string, since: number | undefined, options: WatchOptions = {}) {
    this.#source = source;
    this.prefix = prefix;
    this.#position = since;
    this.#started = since !== undefined;
    this.#silenceMs = options.silenceMs ?? WATCH_SILENCE_MS;
    this.#retryForMs = options.retryForMs ?? WATCH_RETRY_FOR_MS;
    const signal = options.signal;
    if (signal !== undefined) {
      if (signal.aborted) this.close();
      else signal.addEventListener("abort", () => this.close(), { once: true });
    }
  }

  /**
   * The last position the server told this watch (an event's index or a position
   * marker); `undefined` before the first. A new watch from here (`since`) misses
   * nothing and repeats nothing.
   */
  get position(): number | undefined {
    return this.#position;
  }

  /** Whether the watch was closed. */
  get closed(): boolean {
    return this.#stop.signal.aborted;
  }

  /** The next event; done once the watch is closed. */
  next(): Promise<IteratorResult<WatchEvent, undefined>> {
    const n = this.#queue.then(() => this.#next());
    this.#queue = n.catch(() => {});
    return n;
  }

  /** Closes the watch (a `for await` loop left early calls it). */
  async return(): Promise<IteratorResult<WatchEvent, undefined>> {
    this.close();
    return DONE;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  /** Closes the stream and ends the watch: a `next()` waiting resolves done. Idempotent. */
  close(): void {
    if (this.#stop.signal.aborted) return;
    this.#stop.abort(new FencedError("aborted", "the watch was closed"));
    this.#stream?.destroy();
    this.#stream = undefined;
  }

  async #next(): Promise<IteratorResult<WatchEvent, undefined>> {
    if (this.#failed !== undefined) throw this.#failed;
    // Since when no stream has given a block: bounded by the retry time.
    let brokenSince: number | undefined;
    let backoffMs = BACKOFF_FIRST_MS;
    // Opens since the last block: the first reopen after a break is at once, the next ones back off.
    let opens = 0;
    // Bounded: every turn reads a block, or backs off and ends by the retry time.
    for (;;) {
      const ready = this.#ready.shift();
      if (ready !== undefined) return { done: false, value: ready };
      if (this.closed) return DONE;
      if (this.#stream === undefined) {
        if (opens > 0) {
          try {
            await sleep(backoffMs, this.#stop.signal);
          } catch {
            return DONE; // closed
          }
          backoffMs = Math.min(backoffMs * 2, BACKOFF_MAX_MS);
        }
        opens += 1;
        try {
          this.#stream = await this.#open();
        } catch (e) {
          if (this.closed) return DONE;
          if (e instanceof UnavailableError && e.code !== TLS_REFUSED) {
            brokenSince ??= performance.now();
            if (performance.now() - brokenSince >= this.#retryForMs) throw e;
            continue;
          }
          throw this.#fail(e);
        }
        if (this.closed) {
          this.#stream.destroy();
          this.#stream = undefined;
          return DONE;
        }
      }
      const stream = this.#stream;
      const block = await stream.block();
      if (block === undefined) {
        stream.destroy();
        if (this.#stream === stream) this.#stream = undefined;
        if (this.closed) return DONE;
        brokenSince ??= performance.now();
        if (opens > 0 && performance.now() - brokenSince >= this.#retryForMs) {
          throw new UnavailableError("connection_lost", `watching '${this.prefix}': the event stream kept breaking for ${this.#retryForMs} ms (${stream.why})`);
        }
        continue;
      }
      brokenSince = undefined;
      backoffMs = BACKOFF_FIRST_MS;
      opens = 0;
      try {
        this.#handle(block);
      } catch (e) {
        throw this.#fail(e);
      }
    }
  }

  /** Ends the watch with `e`, thrown again by every later call. */
  #fail(e: unknown): FencedError {
    const f = e instanceof FencedError ? e : new FencedError("unknown", String(e), undefined, {}, { cause: e });
    this.#failed = f;
    this.close();
    return f;
  }

  /** Opens a stream from the position, on whichever member answers. */
  async #open(): Promise<EventStream> {
    const api = await this.#source.serverApi();
    if (!api.servesEvents) {
      throw new BadRequestError("watch_unsupported", `the server (Fenced ${api.version}) serves no event stream (GET /v1/events)`);
    }
    const query: string[] = [];
    if (this.prefix !== "") query.push(`prefix=${encodeURIComponent(this.prefix)}`);
    const since = this.#position;
    if (since !== undefined) query.push(`since=${since}`);
    else if (this.#started) {
      // A stream that broke before it said where it started cannot resume.
      throw new MissedEventsError("position_unknown", `watching '${this.prefix}': the event stream broke before the server told its position; events may have been missed`);
    }
    const path = `/v1/events${query.length > 0 ? `?${query.join("&")}` : ""}`;
    const calls = this.#source.calls;
    const deadline = performance.now() + calls.requestTimeoutMs;
    const tried = await calls.members.each(
      deadline,
      (ep, signal) => ep.openStream({ path, timeoutMs: Math.max(1, deadline - performance.now()), signal }),
      { retrySingle: true, signal: this.#stop.signal },
    );
    const a = unwrap(tried.outcome);
    const stream = a.stream ?? (a.status === 410 && answerCode(a) === "compacted" ? await this.#openElsewhere(path) : undefined);
    if (stream !== undefined) {
      this.#started = true;
      return new EventStream(stream, this.#silenceMs);
    }
    const what = since === undefined ? `watching '${this.prefix}'` : `watching '${this.prefix}' after index ${since}`;
    if (a.status === 200) throw new BadResponseError("bad_response", `${what}: answered ${String(a.headers["content-type"])}, not an event stream`);
    throw errorFromAnswer(a.status, a.body, what);
  }

  /**
   * After `compacted` from the member that answered (a member restarted from a snapshot
   * holds its events only from there on): each other member once, in turn, for one that
   * still holds the events after the position. Indexes are the same on every member, so
   * the stream resumes exactly where it was. Undefined when none does, or none could be asked.
   */
  async #openElsewhere(path: string): Promise<http.IncomingMessage | undefined> {
    const members = this.#source.calls.members;
    const all = members.endpoints;
    const answered = all.indexOf(members.current);
    const timeoutMs = this.#source.calls.requestTimeoutMs;
    for (let k = 1; k < all.length && !this.#stop.signal.aborted; k++) {
      const ep = all[(answered + k) % all.length] as Endpoint;
      try {
        const a = await ep.openStream({ path, timeoutMs, signal: this.#stop.signal });
        if (a.stream !== undefined) return a.stream;
      } catch {
        // Unreachable, silent or refused: the next member.
      }
    }
    return undefined;
  }

  /** One SSE block: an event (queued), a position marker, a comment, or `lagged` (thrown). */
  #handle(block: string): void {
    let id: number | undefined;
    let kind: string | undefined;
    let data: string | undefined;
    for (const line of block.split("\n")) {
      if (line === "" || line.startsWith(":")) continue; // a comment: a keep-alive, or a marker's note
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "id") id = /^\d+$/.test(value.trim()) ? Number(value.trim()) : undefined;
      else if (field === "event") kind = value.trim();
      else if (field === "data") data = data === undefined ? value : `${data}\n${value}`;
    }
    if (id !== undefined && !Number.isSafeInteger(id)) throw new BadResponseError("bad_response", `watching '${this.prefix}': the position ${id} is not a safe integer`);
    let json: Record<string, unknown> | undefined;
    if (data !== undefined) {
      try {
        const v: unknown = JSON.parse(data);
        if (isObject(v)) json = v;
      } catch {
        // below
      }
      if (json === undefined) throw new BadResponseError("bad_response", `watching '${this.prefix}': an event's data is not a JSON object: ${data.slice(0, 200)}`);
    }
    if (kind === "lagged" || json?.type === "lagged") {
      const missed = typeof json?.missed === "number" ? json.missed : undefined;
      throw new MissedEventsError(
        "lagged",
        `watching '${this.prefix}': the stream fell behind what the server holds after index ${String(this.#position)}${missed === undefined ? "" : ` (at least ${missed} positions missed)`}`,
        undefined,
        missed === undefined ? {} : { missed },
      );
    }
    if (json !== undefined) {
      const event = readEvent(json, kind, this.prefix);
      // Already delivered (cannot happen with a server that resumes exactly).
      if (this.#position === undefined || event.index > this.#position) {
        this.#ready.push(event);
        this.#position = event.index;
      }
    }
    if (id !== undefined) this.#position = this.#position === undefined ? id : Math.max(this.#position, id);
  }
}

/** Reads an event's JSON, checking the fields of its type. */
function readEvent(v: Record<string, unknown>, kind: string | undefined, prefix: string): WatchEvent {
  const type = typeof v.type === "string" ? v.type : kind;
  const bad = (why: string): never => {
    throw new BadResponseError("bad_response", `watching '${prefix}': a ${String(type)} event ${why}: ${JSON.stringify(v).slice(0, 200)}`);
  };
  if (typeof v.index !== "number" || !Number.isSafeInteger(v.index) || v.index < 0) bad("has no index");
  if (typeof v.at_ms !== "number") bad("has no at_ms");
  const str = (f: string): void => void (typeof v[f] !== "string" && bad(`has no ${f}`));
  const tok = (f: string): void => void (!isToken(v[f]) && bad(`has no ${f}`));
  switch (type) {
    case "granted":
      str("name");
      tok("token");
      if (typeof v.ttl_ms !== "number") bad("has no ttl_ms");
      if (v.holder !== undefined && v.holder !== null && typeof v.holder !== "string") bad("has a holder that is not a string");
      break;
    case "released":
      str("name");
      tok("token");
      str("reason");
      break;
    case "expired":
      str("name");
      tok("token");
      break;
    case "store_accepted":
      str("key");
      tok("token");
      str("op");
      break;
    case "store_rejected":
      str("key");
      tok("token");
      tok("highest_seen");
      str("op");
      break;
    default:
      return { type: "other", index: v.index as number, at_ms: v.at_ms as number, event: String(type), data: v };
  }
  return v as unknown as WatchEvent;
}

/** One open stream's bytes, read block by block (a block ends with a blank line). */
class EventStream {
  readonly #res: http.IncomingMessage;
  readonly #decoder = new StringDecoder("utf8");
  readonly #silenceMs: number;
  #buf = "";
  #ended = false;
  /** Why it ended, for a message. */
  why = "";
  #wake: (() => void) | undefined;
  #silence: NodeJS.Timeout | undefined;

  constructor(res: http.IncomingMessage, silenceMs: number) {
    this.#res = res;
    this.#silenceMs = silenceMs;
    res.on("data", (chunk: Buffer) => {
      // SSE lines may end with CRLF: a CR is never part of what the server sends otherwise.
      this.#buf += this.#decoder.write(chunk).replace(/\r/g, "");
      this.#armSilence();
      if (this.#buf.length > BUFFERED_CHARS_MAX) res.pause();
      this.#notify();
    });
    res.on("end", () => this.#end("the server ended the stream"));
    res.on("error", (e: Error) => this.#end(`the stream broke: ${e.message}`));
    res.on("close", () => this.#end("the connection closed"));
    this.#armSilence();
  }

  /** The next whole block, without its blank line; `undefined` once the stream ended or broke. */
  async block(): Promise<string | undefined> {
    for (;;) {
      const end = this.#buf.indexOf("\n\n");
      if (end >= 0) {
        const block = this.#buf.slice(0, end);
        this.#buf = this.#buf.slice(end + 2);
        if (this.#res.isPaused() && this.#buf.length < BUFFERED_CHARS_MAX / 4) this.#res.resume();
        return block;
      }
      if (this.#buf.length > BLOCK_CHARS_MAX) {
        this.#end(`a block longer than ${BLOCK_CHARS_MAX} characters`);
        return undefined;
      }
      if (this.#ended) return undefined;
      await new Promise<void>((resolve) => (this.#wake = resolve));
    }
  }

  destroy(): void {
    this.#end(this.why || "closed");
  }

  #end(why: string): void {
    if (!this.#ended) {
      this.#ended = true;
      this.why = why;
    }
    clearTimeout(this.#silence);
    this.#res.destroy();
    this.#notify();
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  #armSilence(): void {
    clearTimeout(this.#silence);
    if (this.#ended) return;
    this.#silence = setTimeout(() => {
      // A reader that lags holds the connection paused: that is not the server's silence.
      if (this.#res.isPaused()) this.#armSilence();
      else this.#end(`no byte for ${this.#silenceMs} ms`);
    }, this.#silenceMs);
    this.#silence.unref();
  }
}
