// A loopback TCP proxy in front of a server, for the faults a test needs: the answer to
// the first acquire dropped (with the connection, or with the member falling silent),
// everything held (a cut link), every open connection reset, or the bearer token rewritten.

import net from "node:net";

/** What follows a dropped answer: its connection closes; the member falls silent; or the answer is just never sent. */
export type AfterDrop = "close" | "silent" | "swallow";

export class Proxy {
  readonly #server: net.Server;
  readonly #upstreamPort: number;
  readonly #sockets = new Set<net.Socket>();
  port = 0;
  /** Drop the answer to the next request whose path matches: close its connection, fall silent for good, or just never send it. */
  dropNext: { path: RegExp; after: AfterDrop } | undefined;
  /** Nothing passes either way, and new connections are accepted and never answered. */
  holding = false;
  /** Replaces these bytes in what clients send (same length). */
  rewrite: [Buffer, Buffer] | undefined;
  /** The acquire answers dropped, as the server sent them. */
  readonly dropped: { status: number; body: Record<string, unknown> }[] = [];
  /** The `lease_id` of every acquire that went through, in order. */
  readonly acquireLeaseIds: string[] = [];
  /** The request line's path of every request that went through, in order. */
  readonly paths: string[] = [];
  /** The `holder` of every acquire that went through (`undefined`: none sent), in order. */
  readonly acquireHolders: (string | undefined)[] = [];

  private constructor(upstreamPort: number) {
    this.#upstreamPort = upstreamPort;
    this.#server = net.createServer((c) => this.#connection(c));
  }

  static async start(upstreamPort: number): Promise<Proxy> {
    const p = new Proxy(upstreamPort);
    await new Promise<void>((ok) => p.#server.listen(0, "127.0.0.1", ok));
    p.port = (p.#server.address() as net.AddressInfo).port;
    return p;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    return new Promise((ok) => this.#server.close(() => ok()));
  }

  /** Cuts every open connection (a reset, as a crash would); new ones pass as before. */
  cut(): void {
    for (const s of this.#sockets) s.resetAndDestroy();
  }

  #track(s: net.Socket): net.Socket {
    this.#sockets.add(s);
    s.on("close", () => this.#sockets.delete(s));
    s.on("error", () => {});
    return s;
  }

  #connection(client: net.Socket): void {
    this.#track(client);
    if (this.holding) return; // accepted, never answered
    const upstream = this.#track(net.connect(this.#upstreamPort, "127.0.0.1"));
    // Set when this connection carries the acquire whose answer is to be dropped.
    let dropping: AfterDrop | undefined;
    let answer = Buffer.alloc(0);
    client.on("data", (d: Buffer) => {
      if (this.holding) return;
      if (this.rewrite) d = replaceAll(d, this.rewrite[0], this.rewrite[1]);
      const text = d.toString("latin1");
      for (const m of text.matchAll(/"lease_id":"([0-9a-f]{32})","ttl_ms":\d+,"wait_ms":\d+(,"holder":"(?:[^"\\]|\\.)*")?/g)) {
        this.acquireLeaseIds.push(m[1]!);
        this.acquireHolders.push(m[2] === undefined ? undefined : (JSON.parse(`{${m[2].slice(1)}}`) as { holder: string }).holder);
      }
      const path = /^(?:GET|POST|PUT|DELETE) (\S+) HTTP\/1\.1/m.exec(text)?.[1];
      if (path !== undefined) this.paths.push(path);
      if (path !== undefined && this.dropNext !== undefined && dropping === undefined && this.dropNext.path.test(path)) {
        dropping = this.dropNext.after;
        this.dropNext = undefined;
      }
      upstream.write(d);
    });
    upstream.on("data", (d: Buffer) => {
      if (this.holding) return;
      if (dropping === undefined) {
        client.write(d);
        return;
      }
      answer = Buffer.concat([answer, d]);
      const parsed = wholeAnswer(answer);
      if (parsed === undefined) return;
      this.dropped.push(parsed);
      if (dropping === "close") {
        client.destroy();
        upstream.destroy();
      } else if (dropping === "silent") {
        this.holding = true; // the member falls silent: this connection and every other
      }
    });
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => {
      if (!this.holding) client.destroy();
    });
  }
}

/** An HTTP/1.1 answer with a Content-Length, once it is all there. */
function wholeAnswer(b: Buffer): { status: number; body: Record<string, unknown> } | undefined {
  const end = b.indexOf("\r\n\r\n");
  if (end < 0) return undefined;
  const head = b.subarray(0, end).toString("latin1");
  const length = Number(/content-length: *(\d+)/i.exec(head)?.[1] ?? "0");
  if (b.length < end + 4 + length) return undefined;
  const status = Number(/^HTTP\/1\.1 (\d+)/.exec(head)?.[1] ?? "0");
  const text = b.subarray(end + 4, end + 4 + length).toString("utf8");
  const body = (text === "" ? {} : JSON.parse(text)) as Record<string, unknown>;
  return { status, body };
}

function replaceAll(d: Buffer, from: Buffer, to: Buffer): Buffer {
  let at = d.indexOf(from);
  if (at < 0) return d;
  const out = Buffer.from(d);
  while (at >= 0) {
    to.copy(out, at);
    at = out.indexOf(from, at + from.length);
  }
  return out;
}
