// Test harness: real `fenced server` processes on free loopback ports, temp dirs, and
// bounded waits. Every process started here is killed when the test file ends.

import { ChildProcess, spawn } from "node:child_process";
import https from "node:https";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";

import { Client } from "../src/index.js";

/** The package's directory (tests run from dist/test/). */
export const PACKAGE_DIR = fileURLToPath(new URL("../../", import.meta.url));

/** The server binary: FENCED_BIN, else the release build of this repository. */
export const FENCED_BIN = process.env.FENCED_BIN ?? resolve(PACKAGE_DIR, "../../target/release/fenced");

/**
 * Why the server tests cannot run, or `false`. Under CI=true a missing binary is a
 * failure, not a skip.
 */
export const SKIP: string | false = (() => {
  if (existsSync(FENCED_BIN)) return false;
  const why = `no fenced binary at ${FENCED_BIN}: build it (cargo build --release -p fenced) or set FENCED_BIN`;
  if (process.env.CI === "true") throw new Error(`CI=true and ${why}`);
  console.log(`# skipping the server tests: ${why}`);
  return why;
})();

/**
 * A real server for the tests of the enclosing `describe`, and a client of it (5 s
 * request timeout): started before them and handed to `use`, closed and stopped after
 * them (after the hooks registered before this call).
 */
export function withServer(use: (server: Server, client: Client) => void): void {
  let server: Server | undefined;
  let client: Client | undefined;
  before(async () => {
    server = await Server.start();
    client = new Client({ endpoints: server.url, requestTimeoutMs: 5000 });
    use(server, client);
  });
  after(async () => {
    client?.close();
    await server?.stop();
  });
}

/** Bound on anything a test awaits, so a bug hangs nothing. */
export const PATIENCE_MS = 20_000;

const started = new Set<ChildProcess>();
const dirs = new Set<string>();

/** Kills `child` (continued first, if stopped) when this test file ends, however it ends. */
export function track(child: ChildProcess): ChildProcess {
  started.add(child);
  child.once("exit", () => started.delete(child));
  return child;
}

function killAll(): void {
  for (const c of started) {
    try {
      c.kill("SIGCONT");
      c.kill("SIGKILL");
    } catch {
      // already gone
    }
  }
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
}
process.on("exit", killAll);
// A runner that cancels a file sends a signal, which skips "exit" handlers: kill them then too.
for (const sig of ["SIGTERM", "SIGINT", "SIGHUP"] as const) {
  process.once(sig, () => {
    killAll();
    process.exit(128 + (sig === "SIGTERM" ? 15 : sig === "SIGINT" ? 2 : 1));
  });
}

export function tempDir(tag: string): string {
  const d = mkdtempSync(join(tmpdir(), `fenced-ts-${tag}-`));
  dirs.add(d);
  return d;
}

export function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const s = net.createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => ok(port));
    });
  });
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Polls `f` every `stepMs` until it answers a truthy value, for at most `withinMs`; throws saying `what`. */
export async function eventually<T>(what: string, f: () => Promise<T> | T, withinMs = PATIENCE_MS, stepMs = 20): Promise<NonNullable<T>> {
  const until = performance.now() + withinMs;
  let last: unknown;
  while (performance.now() < until) {
    try {
      const v = await f();
      if (v) return v as NonNullable<T>;
    } catch (e) {
      last = e;
    }
    await sleep(stepMs);
  }
  throw new Error(`not within ${withinMs} ms: ${what}${last ? ` (last error: ${String(last)})` : ""}`);
}

/** Rejects if `p` has not settled within `ms`. */
export function within<T>(ms: number, what: string, p: Promise<T>): Promise<T> {
  let t: NodeJS.Timeout;
  const timeout = new Promise<never>((_, reject) => {
    t = setTimeout(() => reject(new Error(`not within ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(t));
}

/** A running `fenced server`. */
export class Server {
  readonly port: number;
  readonly url: string;
  readonly child: ChildProcess;
  readonly dataDir: string;
  #log = "";
  #args: string[] = [];
  #ca: Buffer | undefined;

  private constructor(port: number, child: ChildProcess, dataDir: string, tls: boolean) {
    this.port = port;
    this.url = `${tls ? "https" : "http"}://127.0.0.1:${port}`;
    this.child = child;
    this.dataDir = dataDir;
    child.stderr?.on("data", (d: Buffer) => {
      this.#log = (this.#log + d.toString()).slice(-4000);
    });
  }

  /**
   * Starts `fenced server --listen 127.0.0.1:PORT --data-dir TMPDIR [args]` and waits for
   * GET /readyz; `ca`: the server runs TLS with a certificate from this CA (PEM).
   */
  static async start(args: string[] = [], ca?: Buffer, port?: number): Promise<Server> {
    port ??= await freePort();
    return Server.#spawn(port, tempDir("server"), args, ca);
  }

  static async #spawn(port: number, dataDir: string, args: string[], ca: Buffer | undefined): Promise<Server> {
    const child = spawn(FENCED_BIN, ["server", "--listen", `127.0.0.1:${port}`, "--data-dir", join(dataDir, "data"), ...args], {
      stdio: ["ignore", "ignore", "pipe"],
      env: { ...process.env, FENCED_LOG: "warn" },
    });
    started.add(child);
    const s = new Server(port, child, dataDir, ca !== undefined);
    s.#args = args;
    s.#ca = ca;
    let exited = false;
    child.once("exit", () => (exited = true));
    await eventually(
      `fenced server on ${port} answers /readyz (log: ${s.#log})`,
      async () => {
        if (exited) throw new Error(`the server exited: ${s.#log}`);
        if (ca !== undefined) return (await httpsJson(`${s.url}/readyz`, ca)).status === "ready";
        const r = await fetch(`${s.url}/readyz`, { signal: AbortSignal.timeout(1000) });
        return r.status === 200 && ((await r.json()) as { status?: string }).status === "ready";
      },
      15_000,
      50,
    );
    return s;
  }

  /** A `kill -9`, then the same server again: the same port, data directory and flags. Answers the new process. */
  async crashAndRestart(): Promise<Server> {
    await this.stop();
    return Server.#spawn(this.port, this.dataDir, this.#args, this.#ca);
  }

  signal(sig: NodeJS.Signals): void {
    this.child.kill(sig);
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const gone = new Promise((r) => this.child.once("exit", r));
    this.child.kill("SIGCONT");
    this.child.kill("SIGKILL");
    await within(10_000, "the server exits", gone);
    started.delete(this.child);
  }

  /** `GET /v1/locks/{name}` straight from the server. */
  async lockInfo(name: string): Promise<{ held: boolean; token: number | null; waiters: number; holder?: string | null }> {
    const r = await fetch(`${this.url}/v1/locks/${encodeURIComponent(name)}`, { signal: AbortSignal.timeout(5000) });
    return (await r.json()) as { held: boolean; token: number | null; waiters: number; holder?: string | null };
  }
}

/** GET `url` over https trusting `ca`, as JSON, within a second. */
function httpsJson(url: string, ca: Buffer): Promise<{ status?: string }> {
  return new Promise((ok, fail) => {
    const req = https.get(url, { ca, timeout: 1000 }, (res) => {
      let body = "";
      res.on("data", (d: Buffer) => (body += d.toString()));
      res.on("end", () => {
        try {
          ok(JSON.parse(body) as { status?: string });
        } catch (e) {
          fail(e);
        }
      });
    });
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", fail);
  });
}

/** A unique name per call, so tests sharing a server never share a lock or key. */
let n = 0;
export function unique(tag: string): string {
  n += 1;
  return `ts/${tag}/${process.pid}-${n}`;
}
