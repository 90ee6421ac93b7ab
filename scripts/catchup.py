#!/usr/bin/env python3
"""How long a follower takes to catch up from a snapshot of a full store (issue 25,
"snapshots that travel").

Starts three members on loopback, kills a follower with SIGKILL, fills the fenced store
with MIB mebibytes (values of 256 KiB, each a fenced write) until the leader has
purged the log past the follower, then starts the follower again and times how long it
takes to apply everything the leader had committed. Prints the figures and whether the
term moved (an election during the catch-up) as one JSON line.

    scripts/catchup.py [--bin target/release/fenced] [--mib 128] [--timeout 180]

With FENCED_FAULT_SNAPSHOT_CUT_AT=N in the environment (a build with the
`fault-injection` feature), the leader's first snapshot transfer is cut after N bytes,
and the line also says how many transfers the follower resumed and how many snapshot
bytes it received.

Exit 0 when the follower caught up within the time-out without an election, 1 when
not, 2 for bad arguments. Talks only to 127.0.0.1 and stops every member it started.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

VALUE = 256 << 10


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def metrics(port):
    """The member's counters from /metrics, by name (empty when it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if not line.startswith("#") and value:
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def call(port, method, path, body=None, headers=None, timeout=10):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def status(port):
    st, body = call(port, "GET", "/v1/cluster", timeout=2)
    return json.loads(body) if st == 200 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/fenced")
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=180)
    a = ap.parse_args()
    if not os.access(a.bin, os.X_OK) or a.mib < 1:
        print(f"{a.bin} is not an executable, or --mib is below 1", file=sys.stderr)
        return 2
    root = tempfile.mkdtemp(prefix="fenced-catchup-")
    ports = {i: free_port() for i in (1, 2, 3)}
    peers = ",".join(f"{i}=http://127.0.0.1:{p}" for i, p in ports.items())
    procs = {}
    ok = False

    def start(i):
        env = dict(os.environ, FENCED_LOG=os.environ.get("FENCED_LOG", "warn"), FENCED_STORE_BYTES_MAX=str(4 << 30))
        args = [a.bin, "server", "--listen", f"127.0.0.1:{ports[i]}", "--node-id", str(i), "--peers", peers,
                "--insecure-peers", "--data-dir", f"{root}/d{i}"]
        procs[i] = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=open(f"{root}/log{i}", "ab"))

    try:
        for i in ports:
            start(i)
        deadline = time.time() + 30
        leader = None
        while time.time() < deadline and leader is None:
            s = status(ports[1])
            leader = s and s.get("leader_id")
            time.sleep(0.1)
        if leader is None:
            print("no leader within 30 s", file=sys.stderr)
            return 1
        follower = next(i for i in ports if i != leader)
        procs[follower].send_signal(signal.SIGKILL)
        procs[follower].wait()
        lp = ports[leader]
        st, g = call(lp, "POST", "/v1/locks/filler/acquire", b'{"ttl_ms":300000}', {"content-type": "application/json"})
        token = json.loads(g)["token"]
        value = os.urandom(VALUE)
        for k in range(a.mib * (1 << 20) // VALUE):
            st, body = call(lp, "PUT", f"/v1/store/fill/{k}", value, {"fencing-token": str(token)}, timeout=30)
            if st != 200:
                print(f"write {k}: HTTP {st} {body[:200]!r}", file=sys.stderr)
                return 1
        # Purged past the follower (it holds nothing past its kill): it can only catch
        # up from the snapshot. Small writes move the log on until the leader purges.
        deadline = time.time() + 60
        while time.time() < deadline:
            s = status(lp)
            if s and (s.get("purged_index") or 0) > 0:
                break
            call(lp, "PUT", "/v1/store/tick", b"x", {"fencing-token": str(token)})
            time.sleep(0.05)
        s = status(lp)
        target, term = s["commit_index"], s["term"]
        started = time.time()
        start(follower)
        fp = ports[follower]
        caught = None
        while time.time() - started < a.timeout:
            f = status(fp)
            if f and (f.get("last_applied_index") or 0) >= target:
                caught = time.time() - started
                break
            time.sleep(0.05)
        after = status(lp) or {}
        f = status(fp) or {}
        # The leader's log on disk: its segments (format 5) and raft.redb.
        logdir = f"{root}/d{leader}/log"
        segments = [os.path.join(logdir, n) for n in os.listdir(logdir)] if os.path.isdir(logdir) else []
        log_bytes = os.path.getsize(f"{root}/d{leader}/raft.redb") + sum(os.path.getsize(p) for p in segments)
        counters = metrics(fp)
        out = {
            "store_mib": a.mib,
            "caught_up_s": None if caught is None else round(caught, 2),
            "timeout_s": a.timeout,
            "term_before": term,
            "term_after": after.get("term"),
            "follower_snapshot_index": f.get("snapshot_index"),
            # The leader keeps the log for a member behind it up to twice its bound
            # (128 MiB): nearer than that, the follower replays the log instead.
            "via": "snapshot" if f.get("snapshot_index") else "log",
            "target_index": target,
            "leader_log_mib": round(log_bytes / (1 << 20), 1),
            "follower_snapshot_mib": round(os.path.getsize(f"{root}/d{follower}/snapshot") / (1 << 20), 1)
            if os.path.exists(f"{root}/d{follower}/snapshot") else None,
            "snapshot_received_mib": round(counters.get("fenced_raft_snapshot_received_bytes_total", 0) / (1 << 20), 1),
            "transfers_resumed": counters.get("fenced_raft_snapshot_transfers_resumed_total"),
        }
        print(json.dumps(out))
        ok = caught is not None and after.get("term") == term
        return 0 if ok else 1
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        if ok or os.environ.get("KEEP") is None:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root} (its logs) for a look: KEEP was set", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
