// The lost-lock signal on real processes: a holder frozen with SIGSTOP past its TTL
// sees its signal aborted when it resumes, before it writes, and its late write is
// refused; a holder whose keepalives cannot get through is lost by its own clock before
// the server's expiry; a lock never holds its process open.

import assert from "node:assert/strict";
import { ChildProcess, spawn } from "node:child_process";
import { once } from "node:events";
import { after, describe, it } from "node:test";
import { fileURLToPath } from "node:url";

import { Client, LockHeldError, LockLostError } from "../src/index.js";
import { Proxy } from "./proxy.js";
import { PATIENCE_MS, SKIP, Server, eventually, track, unique, within, withServer } from "./support.js";

const WORKER = fileURLToPath(new URL("./children/worker.js", import.meta.url));

/** A worker process and the lines it printed. */
class Worker {
  readonly child: ChildProcess;
  readonly lines: string[] = [];
  #stderr = "";
  exited: Promise<unknown>;

  constructor(mode: string, endpoint: string, name: string, key: string, ttlMs: number) {
    this.child = track(spawn(process.execPath, [WORKER, mode, endpoint, name, key, String(ttlMs)], { stdio: ["ignore", "pipe", "pipe"] }));
    this.exited = once(this.child, "exit");
    let partial = "";
    this.child.stdout?.on("data", (d: Buffer) => {
      partial += d.toString();
      const parts = partial.split("\n");
      partial = parts.pop() ?? "";
      this.lines.push(...parts);
    });
    this.child.stderr?.on("data", (d: Buffer) => (this.#stderr += d.toString()));
  }

  /** The first line matching `re`, waiting up to `withinMs`. */
  async line(re: RegExp, withinMs = PATIENCE_MS): Promise<RegExpMatchArray> {
    return eventually(`a line ${re} from the worker (it printed ${JSON.stringify(this.lines)}; stderr: ${this.#stderr})`, () => {
      for (const l of this.lines) {
        const m = re.exec(l);
        if (m) return m;
      }
      return undefined;
    }, withinMs, 10);
  }

  kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) {
      this.child.kill("SIGCONT");
      this.child.kill("SIGKILL");
    }
  }
}

describe("the lost signal", { skip: SKIP }, () => {
  let server: Server;
  let client: Client;
  const workers: Worker[] = [];
  const worker = (...args: ConstructorParameters<typeof Worker>): Worker => {
    const w = new Worker(...args);
    workers.push(w);
    return w;
  };
  after(() => {
    for (const w of workers) w.kill();
  });
  withServer((s, c) => ((server = s), (client = c)));

  it("aborts a holder frozen past its TTL before it writes, and the store refuses its write", async () => {
    const name = unique("frozen");
    const key = `${name}/counter`;
    const ttlMs = 1500;
    const holder = worker("holder", server.url, name, key, ttlMs);
    const held = Number((await holder.line(/^acquired (\d+)$/))[1]);
    holder.child.kill("SIGSTOP");
    const frozenAt = performance.now();
    let took = 0;
    try {
      // Another process takes the lock once the frozen holder's lease ran out, and writes.
      const taker = worker("taker", server.url, name, key, ttlMs);
      took = Number((await taker.line(/^wrote (\d+)$/))[1]);
      assert.ok(took > held, `the taker's token ${took} is above the frozen holder's ${held}`);
      assert.ok(performance.now() - frozenAt >= ttlMs / 2, "the taker waited for the lease to run out");
      await taker.line(/^released$/);
      await within(10_000, "the taker exits", taker.exited);
    } finally {
      holder.child.kill("SIGCONT");
    }
    // When it resumes, the signal is already aborted: before the write, not after it.
    const resumed = await holder.line(/^resumed /);
    assert.equal(resumed.input, "resumed aborted=true reason=expired check=LockLostError");
    const refused = await holder.line(/^write /);
    assert.equal(refused.input, `write refused StaleTokenError token=${held} highest_seen=${took}`);
    await holder.line(/^release LockLostError expired$/);
    const value = await client.store.get(key);
    assert.equal(Buffer.from(value?.value ?? []).toString(), "fresh", "the zombie's write changed nothing");
    await within(10_000, "the holder exits", holder.exited);
  });

  it("loses a lock whose keepalives cannot get through by its own clock, before the server's expiry", async () => {
    const p = await Proxy.start(server.port);
    try {
      const name = unique("cut");
      const c = new Client({ endpoints: p.url, requestTimeoutMs: 5000 });
      const ttlMs = 2000;
      const sent = performance.now();
      const lock = await c.tryLock(name, { ttlMs, marginMs: 500 });
      const deadline = lock.validUntil;
      p.holding = true; // a cut link: keepalives go nowhere
      const signal = lock.signal;
      const lostAt = await within(PATIENCE_MS, "the signal aborts", new Promise<number>((r) => signal.addEventListener("abort", () => r(performance.now()), { once: true })));
      assert.equal(lock.lostReason, "expired");
      assert.equal(lock.validUntil, deadline, "no keepalive got through, so the deadline never moved");
      assert.ok(lostAt >= deadline, "not before the deadline");
      // The server's lease started after `sent`: nobody else could be granted while this said valid.
      assert.ok(lostAt < sent + ttlMs, `lost ${Math.round(lostAt - sent - ttlMs)} ms after the server-side expiry`);
      assert.throws(() => lock.check(), LockLostError);
      // The server frees it once the lease runs out there; the next grant is newer.
      const next = await client.lock(name, { ttlMs, waitMs: 10_000 });
      assert.ok(next.token > lock.token);
      p.holding = false; // the link is back: the release is still sent, and still says lost
      await assert.rejects(within(5000, "the release", lock.release()), LockLostError);
      await next.release();
      c.close();
    } finally {
      await p.close();
    }
  });

  it("does not hold its process open: after release, nor with a lock never released", async () => {
    const name = unique("exit");
    const releasing = worker("release", server.url, name, `${name}/k`, 10_000);
    await releasing.line(/^released$/);
    const releasedAt = performance.now();
    await within(3000, "the process exits after its release", releasing.exited);
    assert.equal(releasing.child.exitCode, 0);
    assert.ok(performance.now() - releasedAt < 3000);
    const forgetting = worker("forget", server.url, name, `${name}/k`, 10_000);
    await forgetting.line(/^acquired \d+$/);
    await within(3000, "the process exits with its lock held (the lease expires on the server)", forgetting.exited);
    assert.equal(forgetting.child.exitCode, 0);
    await assert.rejects(client.tryLock(name), LockHeldError);
  });
});
