"""The seeds' story with real processes: a child Python process holding the lock is
frozen with SIGSTOP past its TTL; another process takes the lock and writes; on SIGCONT
the frozen holder's guard sets ``lost`` (its own timer, before it writes anything), and its
late write under the old token is refused with StaleToken."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict

import fenced
from support import Server

CHILD = Path(__file__).resolve().parent / "holder_child.py"


class Child:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(CHILD), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def next(self, timeout: float) -> Dict[str, Any]:
        try:
            return json.loads(self.lines.get(timeout=timeout))
        except queue.Empty:
            err = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
            raise AssertionError(f"the child said nothing within {timeout} s (exit {self.proc.poll()}): {err}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)


def test_a_frozen_holder_learns_it_lost_the_lock_and_its_late_write_is_refused(server: Server, name: str) -> None:
    ttl = 1.0
    child = Child(server.url, name, name, str(ttl))
    try:
        held = child.next(timeout=20)
        assert held["event"] == "held"
        old = held["token"]

        os.kill(child.proc.pid, signal.SIGSTOP)  # a GC pause, a VM migration, a throttled container
        frozen_at = time.monotonic()
        c = fenced.Client(server.url)
        with c.lock(name, ttl=5.0, wait=10.0) as new:  # granted once the frozen lease expired
            assert new.token > old
            assert c.store.put(name, b"B1", token=new.token) == new.token
            time.sleep(max(0.0, frozen_at + 1.5 * ttl - time.monotonic()))  # well past the child's TTL
            assert child.lines.empty(), "a frozen process says nothing"

            os.kill(child.proc.pid, signal.SIGCONT)
            lost = child.next(timeout=5)  # its guard's timer, with nobody asking it
            assert lost["event"] == "lost", lost
            assert lost["reason"] in ("expired", "lease_not_found"), lost
            assert lost["after_deadline"] or lost["reason"] == "lease_not_found"

            assert child.proc.stdin is not None
            child.proc.stdin.write("go\n")
            child.proc.stdin.flush()
            report = child.next(timeout=10)
            assert report["event"] == "resumed"
            assert report["lost_before_write"] is True
            assert report["check"] in ("expired", "lease_not_found")
            assert report["write"] == {"refused": True, "token": old, "highest_seen": new.token}, report
            assert report["release"] in ("expired", "lease_not_found"), "release tells it was lost"
            assert c.store.get(name) == b"B1", "the newer holder's value stands"
            assert c.lock_info(name)["token"] == new.token, "the zombie's release took nothing from the holder"
        child.proc.wait(timeout=10)
        assert child.proc.returncode == 0
    finally:
        child.kill()
