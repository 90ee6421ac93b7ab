"""A worker of ``fenced torture --target python`` (and ``python-unfenced``): the counter
workload written with this client, one JSON line per operation on standard output, in the
shape of the Rust worker's (``fenced-lab``'s ``Op``). Not an API: run by the torture driver
as ``python -m fenced._torture_worker SPEC`` with its spec as one JSON argument.

The cycle: take the lock, read the counter, work a little, write the counter plus one,
release. Like the Rust worker, it does not consult its lock before writing (a check narrows
the window but cannot close it: the pause can fall between the check and the write); it
records, with each write, what the client promised as the write began (``lock.valid_until``)
and whether ``lock.lost`` was set, so the driver can judge the client's honesty: a write
begun after someone else's grant must find ``lost`` set.

With ``FENCED_WORKER_BREAK=lost-never`` (test only) the worker reports the signal as never
set: the driver's negative control for that check."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any, Dict, Optional

import httpx

from . import Client, FencedError, StaleToken, _core


def now_us() -> int:
    return time.time_ns() // 1000


class Recorder:
    def __init__(self, worker: int) -> None:
        self.worker = worker
        self.cycle = 0
        self.token: Optional[int] = None
        self.on_write: Dict[str, Any] = {}

    def emit(self, kind: str, start_us: int, result: str, value: Optional[int] = None,
             error: Optional[str] = None) -> None:
        op: Dict[str, Any] = {"worker": self.worker, "cycle": self.cycle, "kind": kind,
                              "start_us": start_us, "end_us": now_us(), "result": result}
        if self.token is not None:
            op["token"] = self.token
        if value is not None:
            op["value"] = value
        if error is not None:
            op["error"] = error
        if kind == "write":
            op.update(self.on_write)
        sys.stdout.write(json.dumps(op) + "\n")
        sys.stdout.flush()


def counter(raw: Optional[bytes]) -> int:
    return 0 if raw is None else int(raw.decode().strip())


def run(spec: Dict[str, Any]) -> None:
    fencing = not spec["target"].endswith("-unfenced")
    never_lost = os.environ.get("FENCED_WORKER_BREAK") == "lost-never"
    ttl = spec["ttl_ms"] / 1000.0
    op_timeout = spec["op_timeout_ms"] / 1000.0
    urls = [f"http://{a}" for a in spec["endpoints"]["lock"].split(",")]
    lock_name, key = spec["lock"], spec["counter_key"]
    rng = random.Random(spec["seed"] ^ (spec["worker"] << 32))
    client = Client(urls, request_timeout=op_timeout)
    # The control's writes go to the store blind, as to a resource without fencing.
    plain = httpx.Client(base_url=urls[0], timeout=op_timeout)
    rec = Recorder(spec["worker"])
    while now_us() < spec["until_us"]:
        rec.cycle += 1
        rec.token = None
        remaining = max(0.0, (spec["until_us"] - now_us()) / 1e6)
        start = now_us()
        try:
            lock = client.lock(lock_name, ttl=ttl, wait=min(remaining, ttl * 5))
        except FencedError as e:
            rec.emit("acquire", start, "failed", error=str(e))
            time.sleep(0.01)
            continue
        rec.token = lock.token
        rec.emit("acquire", start, "ok")

        start = now_us()
        value: Optional[int] = None
        try:
            raw = client.store.get(key, token=lock.token) if fencing else client.store.get(key)
            value = counter(raw)
            rec.emit("read", start, "ok", value=value)
        except StaleToken:
            rec.emit("read", start, "rejected")
        except (FencedError, ValueError) as e:
            rec.emit("read", start, "unknown", error=str(e))
        if value is not None:
            time.sleep(rng.randint(0, spec["work_ms"]) / 1000.0)
            start = now_us()
            rec.on_write = {
                "promised_until_us": now_us() + int((lock.valid_until - time.monotonic()) * 1e6),
                "lost_signalled": False if never_lost else lock.lost.is_set(),
            }
            body = str(value + 1).encode()
            try:
                if fencing:
                    client.store.put(key, body, token=lock.token)
                else:
                    r = plain.put(f"/v1/store/{_core.segment(key)}", content=body)
                    r.raise_for_status()
                rec.emit("write", start, "ok", value=value + 1)
            except StaleToken:
                rec.emit("write", start, "rejected", value=value + 1)
            except (FencedError, httpx.HTTPError) as e:
                rec.emit("write", start, "unknown", value=value + 1, error=str(e))
            rec.on_write = {}
        start = now_us()
        try:
            lock.release()
            rec.emit("release", start, "ok")
        except FencedError as e:
            rec.emit("release", start, "unknown", error=str(e))
    client.close()
    plain.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m fenced._torture_worker SPEC (run by fenced torture)")
    run(json.loads(sys.argv[1]))
