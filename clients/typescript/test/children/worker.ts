// A worker process for the tests: reports what it sees as lines on stdout.
//   holder ENDPOINT NAME KEY TTL_MS: takes the lock, sleeps a TTL (the test freezes it
//     there with SIGSTOP), then reports whether its signal was aborted, and writes anyway.
//   taker ENDPOINT NAME KEY TTL_MS: waits for the lock, writes, releases.
//   release ENDPOINT NAME KEY TTL_MS: takes the lock, releases it, and ends its script.
//   forget ENDPOINT NAME KEY TTL_MS: takes the lock and ends its script without releasing.

import { Client, FencedError, StaleTokenError } from "../../src/index.js";

const [mode, endpoint, name, key, ttl] = process.argv.slice(2) as [string, string, string, string, string];
const ttlMs = Number(ttl);
const out = (line: string): void => {
  process.stdout.write(`${line}\n`);
};

const client = new Client({ endpoints: endpoint, requestTimeoutMs: 5000 });
if (mode === "holder") {
  const lock = await client.lock(name, { ttlMs, waitMs: 0 });
  const signal = lock.signal;
  out(`acquired ${lock.token}`);
  await new Promise((r) => setTimeout(r, ttlMs));
  // The first thing that runs after the pause: what the lost signal says now.
  out(`resumed aborted=${signal.aborted} reason=${lock.lostReason} check=${(() => {
    try {
      lock.check();
      return "valid";
    } catch (e) {
      return (e as Error).name;
    }
  })()}`);
  try {
    await client.store.put(key, "zombie", { token: lock.token });
    out("write accepted");
  } catch (e) {
    if (e instanceof StaleTokenError) out(`write refused ${e.name} token=${e.token} highest_seen=${e.highestSeen}`);
    else out(`write failed ${(e as Error).name}: ${(e as Error).message}`);
  }
  await lock.release().then(
    () => out("released"),
    (e: FencedError) => out(`release ${e.name} ${String(e.details.reason)}`),
  );
} else if (mode === "taker") {
  const lock = await client.lock(name, { ttlMs, waitMs: 20_000 });
  await client.store.put(key, "fresh", { token: lock.token });
  out(`wrote ${lock.token}`);
  await lock.release();
  out("released");
} else if (mode === "release") {
  const lock = await client.lock(name, { ttlMs, waitMs: 0 });
  await lock.release();
  out("released");
} else if (mode === "forget") {
  const lock = await client.lock(name, { ttlMs, waitMs: 0 });
  out(`acquired ${lock.token}`);
} else {
  throw new Error(`unknown mode ${mode}`);
}
