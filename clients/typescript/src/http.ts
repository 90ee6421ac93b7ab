// The HTTP transport of one endpoint: node's http/https with a keep-alive agent, the
// bearer token, a custom CA, and time-outs; and whether a failed request may have
// reached the server, which decides what may be retried.

import http from "node:http";
import https from "node:https";

import { BadResponseError, FencedError, UnavailableError, badArgument } from "./errors.js";

/** A whole answer (every answer of the API is small; store values are bounded by the server). */
export interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  /**
   * An open stream's body as it arrives (`openStream`, a 200 `text/event-stream`; `body`
   * is then empty). The reader owns it: destroying it closes the connection.
   */
  stream?: http.IncomingMessage;
}

export interface SendOptions {
  method: "GET" | "POST" | "PUT" | "DELETE";
  /** Starts with `/`. */
  path: string;
  headers?: Record<string, string>;
  /** A JSON body (sent as `application/json`). */
  json?: unknown;
  /** A raw body (sent as `application/octet-stream`). */
  bytes?: Uint8Array;
  /** Bound on this request's round trip. */
  timeoutMs: number;
  /** Aborting it closes the connection (the server then withdraws a queued acquire). */
  signal?: AbortSignal;
}

/** Codes of a failure in transit; `unreachable` is the only one that never reached the server. */
export const UNREACHABLE = "unreachable";
export const CONNECTION_LOST = "connection_lost";
export const TIMEOUT = "timeout";
/** The TLS handshake failed (a certificate not trusted, a name mismatch, this client's certificate refused): never sent, and trying again will not help. */
export const TLS_REFUSED = "tls_refused";

/**
 * The server refused this client's certificate: a TLS alert (unknown CA, bad certificate,
 * ...). With TLS 1.3 the client's side of the handshake is over before the server has
 * judged the certificate, so the alert arrives as an error once "connected"; the server
 * read no request on that connection.
 */
function isCertificateRefused(e: Error): boolean {
  const code = (e as NodeJS.ErrnoException).code ?? "";
  return /^ERR_SSL_(SSLV3|TLSV1|TLSV13)_ALERT_(UNKNOWN_CA|BAD_CERTIFICATE|CERTIFICATE_[A-Z_]+|UNSUPPORTED_CERTIFICATE|ACCESS_DENIED)$/.test(code);
}

function isTlsFailure(e: Error): boolean {
  const code = (e as NodeJS.ErrnoException).code ?? "";
  return /^(ERR_TLS_|ERR_SSL_|CERT_|UNABLE_TO_|DEPTH_ZERO_|SELF_SIGNED_|HOSTNAME_MISMATCH)/.test(code) || /certificate/i.test(e.message);
}

/** The largest answer read; more is refused as a bad response. */
const ANSWER_BYTES_MAX = 64 * 1024 * 1024;

/** The largest error answer read when a stream was asked for. */
const STREAM_REFUSAL_BYTES_MAX = 1024 * 1024;

/** Idle keep-alive connections are closed after this, well below the server's 60 s idle time-out. */
const FREE_SOCKET_TIMEOUT_MS = 30_000;

export interface EndpointOptions {
  authToken?: string | undefined;
  /** PEM certificates an `https://` server must chain to. */
  ca?: string | Buffer | undefined;
  /** This client's certificate chain and key (PEM), presented to an `https://` server that asks for one. */
  cert?: Buffer | undefined;
  key?: Buffer | undefined;
  connectTimeoutMs: number;
  /** Tries of a request whose connection could not be opened (1 with several endpoints: the next member is tried instead). */
  connectAttempts: number;
}

/** One endpoint, `http(s)://host:port`. */
export class Endpoint {
  /** `http://host:port`, no trailing slash. */
  readonly url: string;
  readonly #tls: boolean;
  readonly #host: string;
  readonly #port: number;
  readonly #agent: http.Agent;
  /** Streams (the event stream) have connections of their own: never pooled, never timed out by the agent, untouched by `close()`. */
  readonly #streamAgent: http.Agent;
  readonly #auth: string | undefined;
  readonly #connectTimeoutMs: number;
  readonly #connectAttempts: number;

  constructor(endpoint: string, o: EndpointOptions) {
    const base = endpoint.trim().replace(/\/+$/, "");
    let u: URL;
    try {
      u = new URL(base);
    } catch {
      throw badArgument(`endpoint '${endpoint}' is not a URL: write it like http://127.0.0.1:7400`);
    }
    if (u.protocol === "fenced:") {
      throw badArgument(`endpoint '${endpoint}': this client speaks the HTTP API only; use the server's http:// address`);
    }
    if (u.protocol !== "http:" && u.protocol !== "https:") {
      throw badArgument(`endpoint '${endpoint}' must start with http:// or https://`);
    }
    if (u.pathname !== "/" || u.search !== "" || u.hash !== "" || u.username !== "" || u.password !== "") {
      throw badArgument(`endpoint '${endpoint}' must be http(s)://HOST:PORT with no path`);
    }
    if (o.authToken !== undefined && /[\r\n]/.test(o.authToken)) {
      throw badArgument("the auth token has characters a header cannot carry");
    }
    this.#tls = u.protocol === "https:";
    this.url = `${u.protocol}//${u.host}`;
    this.#host = u.hostname.replace(/^\[|\]$/g, "");
    this.#port = u.port === "" ? (this.#tls ? 443 : 80) : Number(u.port);
    const agent = (agentOptions: http.AgentOptions): http.Agent =>
      this.#tls
        ? new https.Agent({
            ...agentOptions,
            ...(o.ca !== undefined ? { ca: o.ca } : {}),
            ...(o.cert !== undefined && o.key !== undefined ? { cert: o.cert, key: o.key } : {}),
          })
        : new http.Agent(agentOptions);
    this.#agent = agent({ keepAlive: true, timeout: FREE_SOCKET_TIMEOUT_MS });
    this.#streamAgent = agent({ keepAlive: false });
    this.#auth = o.authToken === undefined ? undefined : `Bearer ${o.authToken}`;
    this.#connectTimeoutMs = o.connectTimeoutMs;
    this.#connectAttempts = Math.max(1, o.connectAttempts);
  }

  /**
   * Sends one request. Only a request whose connection could not be opened is tried
   * again here (it never left, so nothing can happen twice); every other failure is
   * an `UnavailableError` (`connection_lost`, `timeout`) for the caller to judge.
   */
  async send(o: SendOptions): Promise<Answer> {
    let backoffMs = 50;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.#sendOnce(o);
      } catch (e) {
        const retry = e instanceof FencedError && e.code === UNREACHABLE && attempt < this.#connectAttempts;
        if (!retry || o.signal?.aborted) throw e;
        await sleep(Math.min(backoffMs, o.timeoutMs), o.signal);
        backoffMs *= 2;
      }
    }
  }

  /**
   * `GET path` whose answer is a stream (the event stream), on a connection of its own:
   * resolves once the head came within `timeoutMs`, a 200 `text/event-stream` with its
   * body as `stream`, anything else read whole (a refusal is small). A connection that
   * could not be opened is tried again as in `send`. Aborting `signal` after the stream
   * opened closes it (the call left this member: nobody will read it).
   */
  async openStream(o: { path: string; timeoutMs: number; signal?: AbortSignal; headers?: Record<string, string> }): Promise<Answer> {
    let backoffMs = 50;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.#sendOnce({ method: "GET", ...o, headers: { accept: "text/event-stream", ...o.headers } }, true);
      } catch (e) {
        const retry = e instanceof FencedError && e.code === UNREACHABLE && attempt < this.#connectAttempts;
        if (!retry || o.signal?.aborted) throw e;
        await sleep(Math.min(backoffMs, o.timeoutMs), o.signal);
        backoffMs *= 2;
      }
    }
  }

  /** Whether the member shows within `withinMs` that it is alive and leads (`GET /readyz` with `leader: true`). */
  async probe(withinMs: number, signal?: AbortSignal): Promise<boolean> {
    try {
      const a = await this.#sendOnce({ method: "GET", path: "/readyz", timeoutMs: withinMs, ...(signal ? { signal } : {}) });
      if (a.status !== 200) return false;
      const v: unknown = JSON.parse(a.body.toString("utf8"));
      return typeof v === "object" && v !== null && (v as { leader?: unknown }).leader === true;
    } catch {
      return false;
    }
  }

  /** Closes idle connections; requests in flight go on. */
  close(): void {
    this.#agent.destroy();
  }

  #sendOnce(o: SendOptions, stream = false): Promise<Answer> {
    const where = `${o.method} ${this.url}${o.path}`;
    const headers: Record<string, string> = { ...o.headers };
    if (this.#auth !== undefined) headers.authorization = this.#auth;
    let body: Buffer | undefined;
    if (o.json !== undefined) {
      body = Buffer.from(JSON.stringify(o.json), "utf8");
      headers["content-type"] = "application/json";
    } else if (o.bytes !== undefined) {
      body = Buffer.from(o.bytes.buffer, o.bytes.byteOffset, o.bytes.byteLength);
      headers["content-type"] = "application/octet-stream";
    }
    headers["content-length"] = String(body?.length ?? 0);
    return new Promise<Answer>((resolve, reject) => {
      if (o.signal?.aborted) return reject(abortError(o.signal, where));
      const mod = this.#tls ? https : http;
      const req = mod.request({
        host: this.#host,
        port: this.#port,
        method: o.method,
        path: o.path,
        headers,
        agent: stream ? this.#streamAgent : this.#agent,
      });
      // Whether the connection was open, so that the request may have been read.
      let connected = false;
      let settled = false;
      let connectTimer: NodeJS.Timeout | undefined;
      const finish = (err: Error | undefined, answer?: Answer): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        clearTimeout(connectTimer);
        o.signal?.removeEventListener("abort", onAbort);
        if (err !== undefined) {
          req.destroy();
          reject(err);
        } else {
          resolve(answer as Answer);
        }
      };
      const failed = (e: Error): Error => {
        if (this.#tls && isCertificateRefused(e)) {
          return new UnavailableError(TLS_REFUSED, `${where}: TLS: the server refused this client's certificate: ${e.message.trim()}`, undefined, {}, { cause: e });
        }
        if (connected) return new UnavailableError(CONNECTION_LOST, `${where}: the connection broke before the answer: ${e.message}`, undefined, {}, { cause: e });
        if (this.#tls && isTlsFailure(e)) return new UnavailableError(TLS_REFUSED, `${where}: TLS: ${e.message}`, undefined, {}, { cause: e });
        return new UnavailableError(UNREACHABLE, `${where}: could not connect: ${e.message}`, undefined, {}, { cause: e });
      };
      const timer = setTimeout(() => {
        finish(
          connected
            ? new UnavailableError(TIMEOUT, `${where}: no answer within ${o.timeoutMs} ms`)
            : new UnavailableError(UNREACHABLE, `${where}: could not connect within ${o.timeoutMs} ms`),
        );
      }, o.timeoutMs);
      timer.unref();
      const onAbort = (): void => finish(abortError(o.signal as AbortSignal, where));
      o.signal?.addEventListener("abort", onAbort, { once: true });
      req.on("socket", (socket) => {
        if (!socket.connecting) {
          connected = true; // a kept-alive connection
          return;
        }
        socket.once(this.#tls ? "secureConnect" : "connect", () => {
          connected = true;
          clearTimeout(connectTimer);
        });
        connectTimer = setTimeout(() => {
          if (!connected) finish(new UnavailableError(UNREACHABLE, `${where}: could not connect within ${this.#connectTimeoutMs} ms`));
        }, Math.min(this.#connectTimeoutMs, o.timeoutMs));
        connectTimer.unref();
      });
      req.on("error", (e) => finish(failed(e)));
      req.on("response", (res) => {
        if (stream && res.statusCode === 200 && /^text\/event-stream\b/i.test(res.headers["content-type"] ?? "")) {
          finish(undefined, { status: 200, headers: res.headers, body: Buffer.alloc(0), stream: res });
          // The reader owns it now; a call that left this member after the head came closes it.
          const signal = o.signal;
          if (signal !== undefined) signal.addEventListener("abort", () => res.destroy(), { once: true });
          res.on("error", () => {}); // the reader hears of it through "close"
          return;
        }
        const max = stream ? STREAM_REFUSAL_BYTES_MAX : ANSWER_BYTES_MAX;
        const chunks: Buffer[] = [];
        let size = 0;
        res.on("data", (c: Buffer) => {
          size += c.length;
          if (size > max) {
            finish(new BadResponseError("bad_response", `${where}: the answer is larger than ${max} bytes`));
            return;
          }
          chunks.push(c);
        });
        res.on("end", () => finish(undefined, { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on("error", (e) => finish(failed(e)));
        res.on("close", () => {
          if (!res.complete) finish(failed(new Error("the answer was cut short")));
        });
      });
      req.end(body);
    });
  }
}

/** The error a request aborted by its caller rejects with: the signal's reason when it is an Error. */
export function abortError(signal: AbortSignal, where: string): Error {
  const r: unknown = signal.reason;
  if (r instanceof Error && r.name !== "AbortError") return r;
  return new FencedError("aborted", `${where}: aborted by the caller`, undefined, {}, { cause: r });
}

/**
 * Resolves after `ms`, or rejects when `signal` aborts. `unref`: the timer does not
 * hold the process open (the lock's background timers); a wait a caller awaits keeps it.
 */
export function sleep(ms: number, signal?: AbortSignal, unref = false): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal, "waiting"));
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    if (unref) t.unref();
    const onAbort = (): void => {
      clearTimeout(t);
      reject(abortError(signal as AbortSignal, "waiting"));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
