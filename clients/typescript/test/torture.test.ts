// The proof that this client is honest, not only that it works: `fenced torture --target
// node` runs the counter workload in worker processes written with this client
// (src/torture-worker.ts) against a real server, and freezes workers with SIGSTOP past
// their lease. With fencing: nothing lost, no zombie write, and every write a frozen
// holder began after someone else's grant found `lock.signal` already aborted. Without
// the token (the control): updates lost. A worker that lies about its signal (the
// negative control) is caught by the same check. Short variants; RELIABILITY.md has the
// long ones.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";

import { FENCED_BIN, PACKAGE_DIR, SKIP, track } from "./support.js";
import { describe, it } from "node:test";

const SHORT = ["--faults", "pause", "--duration", "12s", "--ttl", "1s", "--workers", "3", "--work", "100ms"];

interface Report {
  safe: boolean;
  fencing: boolean;
  acknowledged: number;
  final_value: number;
  lost_updates: number;
  zombie_writes: number;
  stale_writes_rejected: number;
  pauses_injected: number;
  overlapping_holders: number | null;
  duplicate_tokens: number | null;
  late_lost_signals: number | null;
  proofs: string[];
}

/** One run of `fenced torture` on `target`: its exit code and JSON report. */
function torture(target: string, env: Record<string, string> = {}): Promise<{ code: number | null; report: Report; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = track(
      spawn(FENCED_BIN, ["torture", "--json", "--target", target, "--node-client", PACKAGE_DIR, ...SHORT], {
        env: { ...process.env, ...env },
        stdio: ["ignore", "pipe", "pipe"],
      }),
    );
    let stdout = "";
    let stderr = "";
    child.stdout?.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr?.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill("SIGKILL"), 120_000);
    child.on("error", reject);
    child.on("exit", (code) => {
      clearTimeout(timer);
      try {
        resolve({ code, report: JSON.parse(stdout) as Report, stderr });
      } catch {
        reject(new Error(`no report from fenced torture (exit ${code}): ${stderr.slice(-2000)}`));
      }
    });
  });
}

describe("fenced torture with workers written with this client", { skip: SKIP, timeout: 300_000 }, () => {
  it("loses nothing with fencing, and every loss is signalled before the late write", async () => {
    const { code, report: r, stderr } = await torture("node");
    assert.equal(code, 0, stderr);
    assert.equal(r.safe, true, r.proofs.join("\n"));
    assert.ok(r.pauses_injected >= 2, JSON.stringify(r));
    assert.ok(r.acknowledged >= 20, JSON.stringify(r));
    assert.deepEqual([r.lost_updates, r.zombie_writes], [0, 0], r.proofs.join("\n"));
    assert.equal(r.overlapping_holders, 0);
    assert.equal(r.duplicate_tokens, 0);
    // The signal was judged (the workers recorded it), and never came late.
    assert.equal(r.late_lost_signals, 0, r.proofs.join("\n"));
    // A frozen holder's late write reached the store with its old token and was refused.
    assert.ok(r.stale_writes_rejected >= 1, JSON.stringify(r));
    assert.equal(r.final_value, r.acknowledged);
  });

  it("loses updates without the token (the control)", async () => {
    const { code, report: r, stderr } = await torture("node-unfenced");
    // Unsafe without fencing is the control's expected result, not a failure.
    assert.equal(code, 0, stderr);
    assert.equal(r.fencing, false);
    assert.equal(r.safe, false);
    assert.ok(r.pauses_injected >= 2, JSON.stringify(r));
    assert.ok(r.lost_updates + r.zombie_writes >= 1, JSON.stringify(r));
  });

  it("catches a worker whose signal never comes (the negative control)", async () => {
    const { code, report: r } = await torture("node", { FENCED_WORKER_BREAK: "lost-never" });
    assert.equal(code, 1, "fencing on and unsafe must fail the run");
    assert.ok((r.late_lost_signals ?? 0) >= 1, JSON.stringify(r));
    assert.ok(r.proofs.some((p) => p.startsWith("late lost signal")), r.proofs.join("\n"));
    // The store still refused the late writes: the token, not the signal, kept it safe.
    assert.deepEqual([r.lost_updates, r.zombie_writes], [0, 0], r.proofs.join("\n"));
  });
});
