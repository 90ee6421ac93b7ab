// A worker of `fenced torture --target node` (and `node-unfenced`): the counter workload
// written with this client, one JSON line per operation on standard output, in the shape of
// the Rust worker's (fenced-lab's `Op`). Not an API: run by the torture driver as
// `node dist/src/torture-worker.js SPEC` with its spec as one JSON argument.
//
// The cycle: take the lock, read the counter, work a little, write the counter plus one,
// release. Like the Rust worker it does not consult its lock before writing (a check narrows
// the window but cannot close it: the pause can fall between the check and the write); it
// records, with each write, what the client promised as the write began (`lock.validUntil`)
// and whether `lock.signal` was aborted, so the driver can judge the client's honesty: a
// write begun after someone else's grant must find the signal aborted.
//
// With FENCED_WORKER_BREAK=lost-never (test only) the worker reports the signal as never
// aborted: the driver's negative control for that check.

import { Client, FencedError, StaleTokenError } from "./index.js";
import type { Lock } from "./lock.js";
import { segment } from "./calls.js";

interface Spec {
  target: string;
  endpoints: { lock: string };
  worker: number;
  seed: number;
  until_us: number;
  ttl_ms: number;
  work_ms: number;
  op_timeout_ms: number;
  lock: string;
  counter_key: string;
}

type Result = "ok" | "rejected" | "failed" | "unknown";

/** Microseconds since the Unix epoch, the clock the driver and every worker share. */
function nowUs(): number {
  return Math.round((performance.timeOrigin + performance.now()) * 1000);
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** A small seeded generator (mulberry32) for the work times. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

class Recorder {
  cycle = 0;
  token: number | undefined;
  onWrite: Record<string, unknown> = {};
  constructor(readonly worker: number) {}

  emit(kind: string, startUs: number, result: Result, value?: number, error?: unknown): void {
    const op: Record<string, unknown> = {
      worker: this.worker,
      cycle: this.cycle,
      kind,
      start_us: startUs,
      end_us: nowUs(),
      result,
    };
    if (this.token !== undefined) op.token = this.token;
    if (value !== undefined) op.value = value;
    if (error !== undefined) op.error = error instanceof Error ? error.message : String(error);
    if (kind === "write") Object.assign(op, this.onWrite);
    // Pipes are synchronous on Linux: the line is out before the next operation.
    process.stdout.write(JSON.stringify(op) + "\n");
  }
}

function counter(raw: Uint8Array | undefined): number {
  if (raw === undefined) return 0;
  const n = Number(Buffer.from(raw).toString("utf8").trim());
  if (!Number.isSafeInteger(n)) throw new Error(`the counter holds ${JSON.stringify(Buffer.from(raw).toString())}, not a number`);
  return n;
}

async function run(spec: Spec): Promise<void> {
  const fencing = !spec.target.endsWith("-unfenced");
  const neverLost = process.env.FENCED_WORKER_BREAK === "lost-never";
  const urls = spec.endpoints.lock.split(",").map((a) => `http://${a}`);
  const client = new Client({ endpoints: urls, requestTimeoutMs: spec.op_timeout_ms });
  const random = rng(spec.seed ^ (spec.worker * 0x9e3779b1));
  const rec = new Recorder(spec.worker);
  const key = spec.counter_key;
  while (nowUs() < spec.until_us) {
    rec.cycle += 1;
    rec.token = undefined;
    const remainingMs = Math.max(0, Math.floor((spec.until_us - nowUs()) / 1000));
    let start = nowUs();
    let lock: Lock;
    try {
      lock = await client.lock(spec.lock, { ttlMs: spec.ttl_ms, waitMs: Math.min(remainingMs, spec.ttl_ms * 5) });
    } catch (e) {
      rec.emit("acquire", start, "failed", undefined, e);
      await sleep(10);
      continue;
    }
    rec.token = lock.token;
    rec.emit("acquire", start, "ok");

    start = nowUs();
    let value: number | undefined;
    try {
      const got = await client.store.get(key, fencing ? { token: lock.token } : {});
      value = counter(got?.value);
      rec.emit("read", start, "ok", value);
    } catch (e) {
      rec.emit("read", start, e instanceof StaleTokenError ? "rejected" : "unknown", undefined, e);
    }
    if (value !== undefined) {
      await sleep(Math.floor(random() * (spec.work_ms + 1)));
      start = nowUs();
      rec.onWrite = {
        promised_until_us: nowUs() + Math.round((lock.validUntil - performance.now()) * 1000),
        lost_signalled: neverLost ? false : lock.signal.aborted,
      };
      const body = String(value + 1);
      try {
        if (fencing) {
          await client.store.put(key, body, { token: lock.token });
        } else {
          // The control writes blind, as to a resource without fencing.
          const r = await fetch(`${urls[0]}/v1/store/${segment(key)}`, {
            method: "PUT",
            body,
            signal: AbortSignal.timeout(spec.op_timeout_ms),
          });
          if (!r.ok) throw new Error(`an unfenced write answered ${r.status}: ${await r.text()}`);
        }
        rec.emit("write", start, "ok", value + 1);
      } catch (e) {
        rec.emit("write", start, e instanceof StaleTokenError ? "rejected" : "unknown", value + 1, e);
      }
      rec.onWrite = {};
    }
    start = nowUs();
    try {
      await lock.release();
      rec.emit("release", start, "ok");
    } catch (e) {
      rec.emit("release", start, "unknown", undefined, e);
    }
  }
}

const arg = process.argv[2];
if (process.argv.length !== 3 || arg === undefined) {
  process.stderr.write("usage: node dist/src/torture-worker.js SPEC (run by fenced torture)\n");
  process.exit(2);
}
run(JSON.parse(arg) as Spec).then(
  () => process.exit(0),
  (e: unknown) => {
    process.stderr.write(`torture worker: ${e instanceof FencedError || e instanceof Error ? e.message : String(e)}\n`);
    process.exit(1);
  },
);
