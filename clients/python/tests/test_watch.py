"""The event stream's watch and an operator's revoke, against real servers: a watch under
load misses nothing and repeats nothing while its connection is cut, frozen, moved to
another endpoint and its server killed with ``kill -9``; a position no longer held raises
``Missed``; ``revoke_lock`` makes the guard lost and its late write stale. A scripted
stream covers what a real server does not do on demand (a stream that broke before its
position, ``lagged``, an index repeated)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import pytest

import fenced
from support import CutProxy, Listener, Server, wait_until


def _load(c: fenced.Client, name: str, stop: threading.Event, granted: List[Tuple[str, int]]) -> None:
    """Acquire/release cycles on ``name`` until ``stop``: the grants the service answered."""
    while not stop.is_set():
        try:
            lock = c.lock(name, ttl=5.0, wait=1.0)
        except fenced.FencedError:
            time.sleep(0.05)
            continue
        granted.append((name, lock.token))
        try:
            lock.release()
        except fenced.FencedError:
            pass  # a release lost with a killed server: the lease expires


class Seen:
    """What a watch delivered, checked as it comes: strictly increasing indexes, and
    nothing outside the prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.events: List[fenced.WatchEvent] = []
        self.problems: List[str] = []

    def add(self, e: fenced.WatchEvent) -> None:
        if self.events and e.index <= self.events[-1].index:
            self.problems.append(f"index {e.index} after {self.events[-1].index}: repeated or out of order")
        what = e.name if e.name is not None else e.key
        if what is None or not what.startswith(self.prefix):
            self.problems.append(f"an event outside the prefix {self.prefix!r}: {e}")
        self.events.append(e)

    def grants(self) -> List[Tuple[str, int]]:
        return [(e.name or "", e.token or 0) for e in self.events if e.type == "granted"]

    def gaps(self) -> List[str]:
        """Each lock's events must alternate: granted ``t``, then released or expired ``t``,
        then granted with a higher token (its first may be either: the watch began
        mid-cycle). A lost event breaks the pattern."""
        last: Dict[str, fenced.WatchEvent] = {}
        out = []
        for e in self.events:
            if e.name is None:
                continue
            p = last.get(e.name)
            if p is not None:
                ok = (e.type in ("released", "expired") and p.type == "granted" and e.token == p.token) or \
                     (e.type == "granted" and p.type in ("released", "expired") and (e.token or 0) > (p.token or 0))
                if not ok:
                    out.append(f"{e.name}: {p.type} {p.token} (index {p.index}) then {e.type} {e.token} "
                               f"(index {e.index})")
            last[e.name] = e
        return out

    def missing(self, granted: List[Tuple[str, int]]) -> List[Tuple[str, int]]:
        seen = set(self.grants())
        return [g for g in granted if g not in seen]


def _assert_every_grant_once(seen: Seen, granted: List[Tuple[str, int]]) -> None:
    assert not seen.problems, seen.problems[:5]
    assert not seen.gaps(), f"events lost: {seen.gaps()[:5]}"
    grants = seen.grants()
    for g in granted:
        n = grants.count(g)
        assert n == 1, f"grant {g} seen {n} times"


def _count_opens(c: Any) -> List[Tuple[int, str]]:
    """Wraps the client's stream opener: the (member, path) of every stream opened."""
    opens: List[Tuple[int, str]] = []
    orig = c._open_stream

    def counted(i: int, path: str, silence: float) -> Any:
        r = orig(i, path, silence)
        opens.append((i, path))
        return r

    def counted_async(i: int, path: str, silence: float) -> Any:
        async def run() -> Any:
            r = await orig(i, path, silence)
            opens.append((i, path))
            return r

        return run()

    c._open_stream = counted_async if asyncio.iscoroutinefunction(orig) else counted
    return opens


def test_a_watch_under_load_sees_every_grant_once_while_its_connection_is_broken(server: Server, name: str) -> None:
    prefix = f"w/{name}/"
    a, b = CutProxy(server.port), CutProxy(server.port)
    stop, stop_watch = threading.Event(), threading.Event()
    granted: List[Tuple[str, int]] = []
    other: List[Tuple[str, int]] = []
    loaders: List[threading.Thread] = []
    try:
        wc = fenced.Client([a.url, b.url], request_timeout=3.0, attempt_timeout=0.4)
        opens = _count_opens(wc)
        w = wc.watch(prefix)
        w._silence = 1.0  # no byte for 1 s (not 45): taken for dead, reopened
        assert w.open() is not None, "the stream told its position first"
        seen = Seen(prefix)
        failure: List[BaseException] = []

        def watch() -> None:
            try:
                for e in w:
                    seen.add(e)
                    if stop_watch.is_set():
                        return
            except BaseException as e:  # noqa: BLE001 - reported below
                failure.append(e)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        load = fenced.Client(server.url, request_timeout=3.0)
        for k in range(3):
            loaders.append(threading.Thread(target=_load, args=(load, f"{prefix}{k}", stop, granted), daemon=True))
        loaders.append(threading.Thread(target=_load, args=(load, f"o/{name}/x", stop, other), daemon=True))
        for t in loaders:
            t.start()

        def progress(what: str) -> None:
            n = len(seen.events)
            wait_until(lambda: len(seen.events) >= n + 30 or failure, 15.0, f"events after {what}")
            assert not failure, failure

        progress("the start")
        assert a.cut() >= 1, "the watch's stream was on the first endpoint"  # reset mid-stream
        progress("a reset")
        assert a.freeze() >= 1  # the member falls silent: no byte for the silence bound
        progress("a silence")
        a.down = True  # the first endpoint refuses: the reopen moves on to the second
        a.cut()
        progress("a move to the second endpoint")
        server.crash_and_restart()  # kill -9: the stream on the second endpoint breaks too
        progress("a kill -9 of the server")
        a.down = False
        b.cut()
        progress("another reset")
        stop.set()
        for t in loaders:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in loaders)
        ours = list(granted)
        # Whatever the load did last arrives too.
        wait_until(lambda: not seen.missing(ours) or failure, 15.0, f"every grant seen (missing {seen.missing(ours)})")
        stop_watch.set()
        w.close()
        watcher.join(timeout=5)
        assert not watcher.is_alive(), "close() ended the iteration"
        assert not failure, failure
        assert len(ours) >= 60 and len(other) >= 10, f"too little load: {len(ours)} grants, {len(other)} others"
        _assert_every_grant_once(seen, ours)
        assert {e.type for e in seen.events} >= {"granted", "released"}
        assert len(opens) >= 6, f"the stream was reopened after each break: {opens}"
        assert any(i == 1 for i, _ in opens), "a reopen moved to the other endpoint"
        assert all("since=" in p for _, p in opens[1:]), "every reopen resumed from the position"
        assert w.position is not None and w.position >= seen.events[-1].index
    finally:
        stop.set()
        stop_watch.set()
        a.close()
        b.close()


def test_an_async_watch_resumes_after_its_connection_is_cut(server: Server, name: str) -> None:
    prefix = f"w/{name}/"
    proxy = CutProxy(server.port)

    async def main() -> Tuple[Seen, List[Tuple[str, int]], List[Tuple[int, str]]]:
        seen = Seen(prefix)
        granted: List[Tuple[str, int]] = []
        async with fenced.AsyncClient(proxy.url, request_timeout=3.0) as wc, \
                fenced.AsyncClient(server.url, request_timeout=3.0) as load:
            opens = _count_opens(wc)
            w = wc.watch(prefix)
            await w.open()

            async def cycles(n: int) -> None:
                for _ in range(n):
                    lock = await load.lock(f"{prefix}{len(granted) % 2}", ttl=5.0, wait=1.0)
                    granted.append((lock.name, lock.token))
                    await lock.release()

            async def read_until_seen() -> None:
                async for e in w:
                    seen.add(e)
                    if not seen.missing(granted):
                        return

            for _ in range(3):
                await cycles(8)
                await asyncio.wait_for(read_until_seen(), 10.0)
                assert proxy.cut() >= 1
            await cycles(8)
            await asyncio.wait_for(read_until_seen(), 10.0)
            await w.aclose()
            return seen, granted, opens

    try:
        seen, granted, opens = asyncio.run(asyncio.wait_for(main(), 60.0))
    finally:
        proxy.close()
    _assert_every_grant_once(seen, granted)
    assert len(opens) == 4 and all("since=" in p for _, p in opens[1:]), opens


@pytest.fixture(scope="module")
def retaining_four(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cfg = tmp_path_factory.mktemp("events-cfg") / "fenced.toml"
    cfg.write_text("events_retained = 4\n")
    s = Server(["--config", str(cfg)])
    yield s
    s.stop()


def test_a_watch_from_a_position_no_longer_held_raises_missed(retaining_four: Server) -> None:
    c = fenced.Client(retaining_four.url, request_timeout=3.0)
    for _ in range(5):
        c.try_lock("w/x", ttl=5.0).release()
    w = c.watch("w/", since=0)
    t0 = time.monotonic()
    with pytest.raises(fenced.Missed) as e:
        next(w)
    assert time.monotonic() - t0 < 5.0, "refused at once, not retried"
    assert e.value.code == "compacted" and e.value.status == 410
    oldest = e.value.oldest_index
    assert oldest is not None and oldest > 1, e.value
    with pytest.raises(fenced.Missed):
        next(w)  # the watch is over: it does not go on with a gap
    # From the oldest held on (since oldest - 1), it resumes.
    resumed = c.watch("w/", since=oldest - 1)
    first = next(resumed)
    assert first.index == oldest and resumed.position == oldest
    resumed.close()

    async def in_async() -> Optional[int]:
        async with fenced.AsyncClient(retaining_four.url, request_timeout=3.0) as ac:
            aw = ac.watch("w/", since=0)
            with pytest.raises(fenced.Missed) as ae:
                await asyncio.wait_for(aw.__anext__(), 5.0)
            return ae.value.oldest_index

    assert asyncio.run(in_async()) == oldest


def test_a_watch_told_compacted_by_one_member_resumes_on_another_that_holds_the_events(
        retaining_four: Server, server: Server) -> None:
    """A member that restarted from a snapshot holds its events only from there on; the
    others may still hold the position. Here the first member keeps four events and the
    second every one: the watch given the first asks the second before it says Missed,
    and says Missed only when no member holds the events (the control: the first alone)."""
    for s in (retaining_four, server):
        c = fenced.Client(s.url, request_timeout=3.0)
        for _ in range(5):
            c.try_lock("w/elsewhere", ttl=5.0).release()
    held = fenced.Client(server.url, request_timeout=3.0).watch("w/elsewhere", since=0)
    expected = next(held)
    held.close()
    both = fenced.Client([retaining_four.url, server.url], request_timeout=3.0)
    w = both.watch("w/elsewhere", since=0)
    first = next(w)
    assert first == expected and first.type == "granted" and w.position == expected.index, (first, expected)
    w.close()
    alone = fenced.Client(retaining_four.url, request_timeout=3.0)
    with pytest.raises(fenced.Missed):
        next(alone.watch("w/elsewhere", since=0))

    async def in_async() -> fenced.WatchEvent:
        async with fenced.AsyncClient([retaining_four.url, server.url], request_timeout=3.0) as ac:
            aw = ac.watch("w/elsewhere", since=0)
            e = await asyncio.wait_for(aw.__anext__(), 5.0)
            await aw.aclose()
            return e

    assert asyncio.run(in_async()) == expected


def test_revoke_lock_makes_the_guard_lost_and_its_late_write_stale(server: Server, name: str) -> None:
    c = fenced.Client(server.url, request_timeout=3.0)
    w = c.watch(name)
    t0 = time.monotonic()
    assert w.open() is not None
    assert time.monotonic() - t0 < 2.0, "open() returns at the first marker, not at the next keep-alive"
    guard = c.lock(name, ttl=1.5)  # a keepalive every 0.5 s
    old = guard.token
    nxt: List[fenced.Lock] = []
    waiter = threading.Thread(target=lambda: nxt.append(fenced.Client(server.url).lock(name, ttl=5.0, wait=10.0)))
    waiter.start()
    wait_until(lambda: c.lock_info(name)["waiters"] == 1, 5.0, "the next holder queued")
    assert c.revoke_lock(name) == old, "without a token, the current holder's is read and named"
    assert guard.lost.wait(timeout=3.0), "the guard heard at its next keepalive"
    assert guard.lost_reason is fenced.LostReason.LEASE_NOT_FOUND
    waiter.join(timeout=10)
    assert nxt, "the next waiter was granted"
    new = nxt[0]
    assert new.token > old
    key = f"{name}/data"
    assert c.store.put(key, b"new holder", token=new.token) == new.token
    with pytest.raises(fenced.StaleToken) as stale:
        c.store.put(key, b"revoked holder", token=old)
    assert stale.value.highest_seen == new.token
    with pytest.raises(fenced.LockLost):
        guard.release()
    # Naming the old token again takes nothing from the new holder.
    with pytest.raises(fenced.NotHolder) as e:
        c.revoke_lock(name, token=old)
    assert e.value.holder_token == new.token and e.value.status == 409
    with pytest.raises(fenced.BadRequest):
        c.revoke_lock(name, token=0)
    assert c.lock_info(name)["token"] == new.token
    new.release()
    with pytest.raises(fenced.NotHolder):
        c.revoke_lock(name)  # nobody holds it
    # The stream told it: granted, released with reason forced, granted to the next.
    got: List[fenced.WatchEvent] = []
    while not any(e.type == "released" and e.token == new.token for e in got):
        got.append(next(w))
    w.close()
    locks = [(e.type, e.token, e.reason) for e in got if e.name == name]
    assert ("released", old, "forced") in locks and ("granted", new.token, None) in locks, locks
    kinds = [e.type for e in got if e.key == key]
    assert kinds == ["store_accepted", "store_rejected"], kinds


def test_the_async_client_revokes_a_lock(server: Server, name: str) -> None:
    async def main() -> None:
        async with fenced.AsyncClient(server.url, request_timeout=3.0) as c:
            guard = await c.lock(name, ttl=1.5)
            assert await c.revoke_lock(name, token=guard.token) == guard.token
            await asyncio.wait_for(guard.lost.wait(), 3.0)
            assert guard.lost_reason is fenced.LostReason.LEASE_NOT_FOUND
            with pytest.raises(fenced.NotHolder):
                await c.revoke_lock(name)
            with pytest.raises(fenced.LockLost):
                await guard.release()

    asyncio.run(asyncio.wait_for(main(), 20.0))


# --- a scripted stream ------------------------------------------------------------------


class ScriptedStream:
    """An HTTP server on loopback answering ``GET /v1/events`` with the next of
    ``answers`` (bytes of the body after a 200 head; the connection then closes), and
    recording every request's path."""

    def __init__(self, answers: List[bytes]) -> None:
        self.answers = list(answers)
        self.paths: List[str] = []
        self.listener = Listener(self._serve)
        self.url = self.listener.url

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            self.paths.append(head.split(b" ")[1].decode())
            body = self.answers.pop(0) if self.answers else b""
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + body)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.listener.close()


def _event(index: int, name: str = "w/a", token: int = 1) -> bytes:
    return (f'id: {index}\r\nevent: granted\r\ndata: {{"index":{index},"type":"granted","at_ms":5,'
            f'"name":"{name}","token":{token},"ttl_ms":1000}}\r\n\r\n').encode()


def test_a_scripted_stream_resumes_skips_repeats_and_reports_what_it_cannot_resume() -> None:
    stream = ScriptedStream([
        b"id: 4\n: position\n\n" + _event(5) + b": keep-alive\n\n",
        b"id: 5\n: position\n\n" + _event(5) + _event(7, token=2) + b"id: 9\n: position\n\n",
        b"id: 9\n: position\n\nevent: lagged\ndata: {\"missed\":12}\n\n",
    ])
    try:
        w = fenced.Client(stream.url, check_server=False, request_timeout=2.0).watch("w/")
        assert [next(w).index, next(w).index] == [5, 7], "index 5, sent again after the reopen, is skipped"
        with pytest.raises(fenced.Missed) as e:
            next(w)
        assert e.value.code == "lagged" and e.value.details.get("missed") == 12
        assert w.position == 9
        assert stream.paths == ["/v1/events?prefix=w%2F", "/v1/events?prefix=w%2F&since=5",
                                "/v1/events?prefix=w%2F&since=9"], stream.paths
    finally:
        stream.close()
    broke = ScriptedStream([b""])  # opened, then closed before the position marker
    try:
        w = fenced.Client(broke.url, check_server=False, request_timeout=2.0).watch()
        with pytest.raises(fenced.Missed) as e:
            next(w)
        assert e.value.code == "missed" and e.value.oldest_index is None
        assert broke.paths == ["/v1/events"], "no reopen from nowhere"
    finally:
        broke.close()


def test_a_watch_with_no_server_is_unavailable_after_its_retry_time() -> None:
    from support import free_port

    w = fenced.Client(f"http://127.0.0.1:{free_port()}", request_timeout=0.5).watch("w/", since=3)
    w._reopening.retry_for = 1.0
    t0 = time.monotonic()
    with pytest.raises(fenced.Unavailable):
        next(w)
    took = time.monotonic() - t0
    assert 1.0 <= took < 5.0, took
    assert w.position == 3, "the position is kept for a later next()"


def test_close_ends_a_watch_blocked_on_an_idle_stream(server: Server, name: str) -> None:
    w = fenced.Client(server.url, request_timeout=3.0).watch(f"idle/{name}/")
    assert w.open() is not None
    out: List[Any] = []
    t = threading.Thread(target=lambda: out.append(list(w)), daemon=True)
    t.start()
    time.sleep(0.3)  # blocked reading a stream that carries nothing
    t0 = time.monotonic()
    w.close()
    t.join(timeout=3.0)
    assert not t.is_alive() and out == [[]], "the iteration ended"
    assert time.monotonic() - t0 < 2.0

    async def in_async() -> float:
        async with fenced.AsyncClient(server.url, request_timeout=3.0) as c:
            aw = c.watch(f"idle/{name}/")
            await aw.open()
            task = asyncio.ensure_future(_drain(aw))
            await asyncio.sleep(0.3)
            t1 = time.monotonic()
            await aw.aclose()
            assert await asyncio.wait_for(task, 3.0) == []
            return time.monotonic() - t1

    assert asyncio.run(asyncio.wait_for(in_async(), 10.0)) < 2.0


async def _drain(w: fenced.AsyncWatch) -> List[fenced.WatchEvent]:
    return [e async for e in w]
