"""A worker process for test_lost_process.py: takes the lock, writes once, says so, then
waits for "go" on stdin (the test freezes it with SIGSTOP meanwhile), then reports what its
guard says and tries its late write under the old token. One JSON object per line."""

from __future__ import annotations

import json
import sys
import threading
import time

import fenced


def say(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def main() -> None:
    url, name, key, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    c = fenced.Client(url, request_timeout=5.0)
    lock = c.lock(name, ttl=ttl, wait=10.0)
    c.store.put(key, b"A1", token=lock.token)

    def watch() -> None:
        # threading.Event.wait: woken only by the guard's own timer (or a refused keepalive).
        threading.Event.wait(lock.lost)
        reason = lock._state.reason
        say(event="lost", reason=reason.value if reason else None,
            after_deadline=time.monotonic() >= lock.valid_until)

    threading.Thread(target=watch, daemon=True).start()
    say(event="held", token=lock.token, valid_until_in=lock.valid_until - time.monotonic())
    sys.stdin.readline()
    report: dict = {"event": "resumed", "lost_before_write": lock.lost.is_set()}
    try:
        lock.check()
        report["check"] = "valid"
    except fenced.LockLost as e:
        report["check"] = e.reason.value
    try:  # the zombie's late write, which the store must refuse
        c.store.put(key, b"A2", token=lock.token)
        report["write"] = "accepted"
    except fenced.StaleToken as e:
        report["write"] = {"refused": True, "token": e.token, "highest_seen": e.highest_seen}
    try:
        lock.release()
        report["release"] = "ok"
    except fenced.LockLost as e:
        report["release"] = e.reason.value
    say(**report)


if __name__ == "__main__":
    main()
