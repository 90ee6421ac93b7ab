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


class Members:
    """Three members on loopback under ``root``, each started with ``start(i)``."""

    def __init__(self, binary, root):
        self.binary, self.root = binary, root
        self.ports = {i: free_port() for i in (1, 2, 3)}
        self.peers = ",".join(f"{i}=http://127.0.0.1:{p}" for i, p in self.ports.items())
        self.procs = {}

    def start(self, i):
        env = dict(os.environ, FENCED_LOG=os.environ.get("FENCED_LOG", "warn"), FENCED_STORE_BYTES_MAX=str(4 << 30))
        args = [self.binary, "server", "--listen", f"127.0.0.1:{self.ports[i]}", "--node-id", str(i),
                "--peers", self.peers, "--insecure-peers", "--data-dir", f"{self.root}/d{i}"]
        self.procs[i] = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                                         stderr=open(f"{self.root}/log{i}", "ab"))

    def kill(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()

    def leader(self, within):
        """The leader's id, once member 1 names one within ``within`` seconds."""
        deadline = time.time() + within
        while time.time() < deadline:
            s = status(self.ports[1])
            if s and s.get("leader_id"):
                return s["leader_id"]
            time.sleep(0.1)
        return None

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def fill(lp, mib):
    """Fills the store through the leader on port ``lp`` with ``mib`` MiB of fenced
    writes; the token they were written under, or ``None`` after a refused write."""
    st, g = call(lp, "POST", "/v1/locks/filler/acquire", b'{"ttl_ms":300000}', {"content-type": "application/json"})
    token = json.loads(g)["token"]
    value = os.urandom(VALUE)
    for k in range(mib * (1 << 20) // VALUE):
        st, body = call(lp, "PUT", f"/v1/store/fill/{k}", value, {"fencing-token": str(token)}, timeout=30)
        if st != 200:
            print(f"write {k}: HTTP {st} {body[:200]!r}", file=sys.stderr)
            return None
    return token


def purge(lp, token):
    """Moves the log on with small writes until the leader has purged it (up to 60 s),
    so that a follower killed before the fill can only catch up from the snapshot."""
    deadline = time.time() + 60
    while time.time() < deadline:
        s = status(lp)
        if s and (s.get("purged_index") or 0) > 0:
            break
        call(lp, "PUT", "/v1/store/tick", b"x", {"fencing-token": str(token)})
        time.sleep(0.05)


def caught_up(fp, target, timeout):
    """Seconds until the member on port ``fp`` applied through ``target``; ``None`` when
    it had not within ``timeout``."""
    started = time.time()
    while time.time() - started < timeout:
        f = status(fp)
        if f and (f.get("last_applied_index") or 0) >= target:
            return time.time() - started
        time.sleep(0.05)
    return None


def figures(a, root, leader, follower, fp, caught, term, target, after):
    """The one JSON line's fields."""
    f = status(fp) or {}
    # The leader's log on disk: its segments (format 5) and raft.redb.
    logdir = f"{root}/d{leader}/log"
    segments = [os.path.join(logdir, n) for n in os.listdir(logdir)] if os.path.isdir(logdir) else []
    log_bytes = os.path.getsize(f"{root}/d{leader}/raft.redb") + sum(os.path.getsize(p) for p in segments)
    counters = metrics(fp)
    return {
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
    members = Members(a.bin, root)
    ok = False
    try:
        for i in members.ports:
            members.start(i)
        leader = members.leader(30)
        if leader is None:
            print("no leader within 30 s", file=sys.stderr)
            return 1
        follower = next(i for i in members.ports if i != leader)
        members.kill(follower)
        lp, fp = members.ports[leader], members.ports[follower]
        token = fill(lp, a.mib)
        if token is None:
            return 1
        purge(lp, token)
        s = status(lp)
        target, term = s["commit_index"], s["term"]
        members.start(follower)
        caught = caught_up(fp, target, a.timeout)
        after = status(lp) or {}
        print(json.dumps(figures(a, root, leader, follower, fp, caught, term, target, after)))
        ok = caught is not None and after.get("term") == term
        return 0 if ok else 1
    finally:
        members.stop()
        if ok or os.environ.get("KEEP") is None:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root} (its logs) for a look: KEEP was set", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
