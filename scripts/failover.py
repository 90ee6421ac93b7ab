#!/usr/bin/env python3
"""Failover time of a three-member Fenced cluster on loopback: kill -9 of the leader,
then the time until a grant succeeds on a survivor (clients retry every 10 ms on every
member, as a client with the endpoint list does). TRIALS rounds (default 20); each
round restarts the killed member and waits until it has caught up. Prints each trial
and p50/p99/max.

    cargo build --release -p fenced && scripts/failover.py [TRIALS]
"""
import json, os, shutil, socket, subprocess, sys, tempfile, time, urllib.request

BIN = os.environ.get("FENCED_BIN", "target/release/fenced")
TRIALS = int(sys.argv[1]) if len(sys.argv) > 1 else 20


def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def call(url, method="GET", body=None, timeout=1.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
    except Exception as e:  # refused, reset, timed out
        return None, str(e)


work = tempfile.mkdtemp(prefix="failover.")
ports = [port() for _ in range(3)]
peers = ",".join(f"{i+1}=http://127.0.0.1:{p}" for i, p in enumerate(ports))
procs = [None, None, None]


def start(i):
    procs[i] = subprocess.Popen(
        [BIN, "server", "--listen", f"127.0.0.1:{ports[i]}", "--data-dir", f"{work}/m{i+1}",
         "--node-id", str(i + 1), "--peers", peers, "--insecure-peers"],
        env={**os.environ, "FENCED_LOG": "error"}, stdout=subprocess.DEVNULL)
    for _ in range(400):
        if call(f"http://127.0.0.1:{ports[i]}/livez")[0] == 200:
            return
        time.sleep(0.025)
    raise SystemExit(f"member {i+1} did not start")


def leader():
    for _ in range(400):
        for i, p in enumerate(ports):
            if procs[i] is None:
                continue
            st, v = call(f"http://127.0.0.1:{p}/readyz")
            if st == 200 and v.get("leader"):
                return i
        time.sleep(0.025)
    raise SystemExit("no leader")


try:
    for i in range(3):
        start(i)
    times = []
    for t in range(TRIALS):
        l = leader()
        procs[l].kill(); procs[l].wait(); procs[l] = None
        t0 = time.monotonic()
        while True:
            done = False
            for i, p in enumerate(ports):
                if procs[i] is None:
                    continue
                st, v = call(f"http://127.0.0.1:{p}/v1/locks/failover-{t}/acquire", "POST", {"ttl_ms": 1000}, 0.5)
                if st == 200:
                    done = True
                    break
            if done:
                break
            time.sleep(0.01)
        ms = (time.monotonic() - t0) * 1000
        times.append(ms)
        print(f"trial {t+1}: leader {l+1} killed, a grant {ms:.0f} ms later", flush=True)
        start(l)
        nl = leader()
        target = call(f"http://127.0.0.1:{ports[nl]}/v1/cluster")[1]["commit_index"]
        for _ in range(400):
            s = call(f"http://127.0.0.1:{ports[l]}/v1/cluster")[1]
            if isinstance(s, dict) and (s.get("last_applied_index") or 0) >= target:
                break
            time.sleep(0.025)
    times.sort()
    pct = lambda q: times[min(len(times) - 1, int(q * len(times)))]
    print(json.dumps({"trials": len(times), "failover_ms_p50": round(pct(0.5)),
                      "failover_ms_p99": round(pct(0.99)), "failover_ms_max": round(times[-1])}))
finally:
    for p in procs:
        if p:
            p.kill()
    shutil.rmtree(work, ignore_errors=True)
