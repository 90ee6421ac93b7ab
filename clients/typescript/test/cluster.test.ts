// Three real members: the client finds the leader past real followers' not_leader, and a
// lock held across a kill -9 of the leader keeps its lease, its token and its deadline.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { after, before, describe, it } from "node:test";

import { Client, LockHeldError } from "../src/index.js";
import { FENCED_BIN, SKIP, Server, eventually, freePort, sleep, unique } from "./support.js";

/** Servers that require peer authentication for a cluster take `--insecure-peers` on loopback. */
const INSECURE_PEERS: string[] = (() => {
  if (SKIP) return [];
  const help = spawnSync(FENCED_BIN, ["server", "--help"], { encoding: "utf8", timeout: 10_000 });
  return help.stdout.includes("--insecure-peers") ? ["--insecure-peers"] : [];
})();

interface ClusterView {
  leader_id: number | null;
}

describe("a cluster of three", { skip: SKIP }, () => {
  const members: Server[] = [];
  let urls: string[] = [];
  before(async () => {
    const ports = [await freePort(), await freePort(), await freePort()];
    const peers = ports.map((p, i) => `${i + 1}=http://127.0.0.1:${p}`).join(",");
    urls = ports.map((p) => `http://127.0.0.1:${p}`);
    // Started together: each waits for a leader before /readyz answers ready.
    const started = await Promise.all(ports.map((p, i) => Server.start(["--node-id", String(i + 1), "--peers", peers, ...INSECURE_PEERS], undefined, p)));
    members.push(...started);
  });
  after(async () => {
    for (const m of members) await m.stop();
  });

  async function leaderIndex(): Promise<number> {
    return eventually("a leader is known", async () => {
      for (const m of members) {
        if (m.child.exitCode !== null || m.child.signalCode !== null) continue;
        const r = await fetch(`${m.url}/v1/cluster`, { signal: AbortSignal.timeout(1000) });
        const id = ((await r.json()) as ClusterView).leader_id;
        if (id !== null && members[id - 1]?.child.exitCode === null && members[id - 1]?.child.signalCode === null) return id; // 1-based: 0 is "none"
      }
      return 0;
    }).then((id) => id - 1);
  }

  it("keeps a lock across a kill -9 of the leader, through a follower that forwards", async () => {
    const leader = await leaderIndex();
    // The leader last, so the client meets a real follower first: it forwards to the
    // leader, so the client stays there (a follower saying not_leader is the fake
    // member's test, failover.test.ts).
    const order = [...urls.filter((_, i) => i !== leader), urls[leader]!];
    const client = new Client({ endpoints: order, requestTimeoutMs: 10_000 });
    const name = unique("cluster");
    const ttlMs = 5000;
    const lock = await client.tryLock(name, { ttlMs });
    assert.equal(client.endpoint, order[0], "a follower that forwards is kept");
    const key = `${name}/k`;
    await client.store.put(key, "before", { token: lock.token });

    members[leader]!.signal("SIGKILL");
    const next = await leaderIndex();
    assert.notEqual(next, leader);
    // Three TTLs later the lock still holds: its keepalives moved to the new leader.
    await sleep(3 * ttlMs);
    assert.equal(lock.isValid(), true, `lost: ${lock.lostReason}`);
    assert.ok(lock.validUntil > performance.now() + ttlMs / 3, "a recent keepalive moved the deadline");
    assert.notEqual(client.endpoint, urls[leader], "calls went on through a live member");
    await client.store.put(key, "after", { token: lock.token });
    const other = new Client({ endpoints: urls });
    await assert.rejects(other.tryLock(name, { ttlMs }), LockHeldError);
    await lock.release();
    const again = await other.tryLock(name, { ttlMs });
    assert.ok(again.token > lock.token, "tokens go on rising after the failover");
    await again.release();
    client.close();
    other.close();
  });
});
