"""A retried acquire gets the same grant (the implicit lease's id is the caller's), an
abandoned acquire gives its lease back, and calls move past dead, silent and follower
members."""

from __future__ import annotations

import time
from typing import Optional

import pytest

import fenced
from fenced import _core
from support import DropFirstAnswer, FakeMember, Server, free_port, http_get, silent_member


def test_the_same_implicit_lease_id_gets_the_same_grant(server: Server, name: str) -> None:
    c = fenced.Client(server.url)
    lease = _core.new_lease_id()
    first = c._acquire_on(0, name, lease, 5000, 0, 5.0)
    again = c._acquire_on(0, name, lease, 5000, 0, 5.0)
    assert again["token"] == first["token"] and again["lease_id"] == first["lease_id"] == lease
    with pytest.raises(fenced.LockHeld):
        c._acquire_on(0, name, _core.new_lease_id(), 5000, 0, 5.0)  # another id: another caller
    c.revoke_lease(lease)
    assert c.lock_info(name)["held"] is False


def test_an_acquire_whose_answer_was_lost_is_retried_under_the_same_id(server: Server, name: str) -> None:
    proxy = DropFirstAnswer(server.port)
    try:
        c = fenced.Client(proxy.url, request_timeout=5.0)
        with c.lock(name, ttl=5.0, wait=2.0) as lock:
            dropped = proxy.dropped_json()  # the grant the first attempt got, never delivered
            assert (lock.token, lock.lease_id) == (dropped["token"], dropped["lease_id"]), "one grant, not two"
            sent = b"".join(proxy.requests)
            assert sent.count(b"/acquire HTTP/1.1") == 2, "asked twice"
            assert sent.count(b'"lease_id": "' + lock.lease_id.encode() + b'"') == 2, "under one id"
            info = fenced.Client(server.url).lock_info(name)
            assert info["token"] == lock.token and info["waiters"] == 0
    finally:
        proxy.close()
    assert fenced.Client(server.url).lock_info(name)["held"] is False


def test_a_retried_acquire_sends_the_same_holder_label(server: Server, name: str) -> None:
    proxy = DropFirstAnswer(server.port)
    try:
        c = fenced.Client(proxy.url, request_timeout=5.0)
        with c.lock(name, ttl=5.0, wait=2.0, holder="worker-7@host-b") as lock:
            dropped = proxy.dropped_json()
            assert (lock.token, lock.lease_id) == (dropped["token"], dropped["lease_id"]), "one grant, not two"
            sent = b"".join(proxy.requests)
            assert sent.count(b"/acquire HTTP/1.1") == 2, "asked twice"
            assert sent.count(b'"holder": "worker-7@host-b"') == 2, "with the same label"
            assert fenced.Client(server.url).lock_info(name)["holder"] == "worker-7@host-b"
    finally:
        proxy.close()


def test_an_abandoned_acquire_revokes_its_implicit_lease(server: Server, name: str) -> None:
    proxy = DropFirstAnswer(server.port, every=True)  # every acquire granted, its answer lost
    try:
        c = fenced.Client(proxy.url, request_timeout=1.0)
        with pytest.raises(fenced.Transport):
            c.lock(name, ttl=30.0, wait=0.0)
        assert proxy.dropped is not None, "the server did grant it"
        # Granted on the server, never delivered: given back at once, not after 30 s.
        info = fenced.Client(server.url).lock_info(name)
        assert info["held"] is False, info
        assert b"DELETE /v1/leases/" in b"".join(proxy.requests)
    finally:
        proxy.close()


def test_a_dead_first_endpoint_is_passed_over(server: Server, name: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    c = fenced.Client([dead, server.url], request_timeout=5.0, attempt_timeout=0.4)
    with c.lock(name, ttl=5.0) as lock:
        assert c.endpoint == server.url
        assert c.store.put(name, b"v", token=lock.token) == lock.token
    # Given as one string with commas, and through FENCED_ENDPOINT's form, the same.
    c2 = fenced.Client(f"{dead},{server.url}", attempt_timeout=0.4)
    c2.try_lock(name, ttl=5.0).release()


def test_a_silent_member_is_left_within_the_attempt_time_out(server: Server, name: str) -> None:
    silent = silent_member()
    try:
        c = fenced.Client([silent.url, server.url], request_timeout=20.0, attempt_timeout=0.4)
        t0 = time.monotonic()
        lock = c.try_lock(name, ttl=5.0)
        took = time.monotonic() - t0
        assert took < 5.0, f"{took:.1f} s to leave a silent member (request time-out 20 s)"
        assert c.endpoint == server.url
        # A waiter parked on the live leader for several attempt time-outs is not cut.
        other = fenced.Client([silent.url, server.url], request_timeout=20.0, attempt_timeout=0.4)
        import threading

        got = []
        t = threading.Thread(target=lambda: got.append(other.lock(name, ttl=5.0, wait=15.0)))
        t.start()
        time.sleep(2.0)
        assert fenced.Client(server.url).lock_info(name)["waiters"] == 1, "still parked, not cut and re-queued"
        lock.release()
        t.join(timeout=15)
        assert got and got[0].token > lock.token
        got[0].release()
    finally:
        silent.close()


def test_a_follower_answering_not_leader_is_passed_over(server: Server, name: str) -> None:
    doc = http_get(server.url + "/openapi.json")
    assert doc is not None and doc[0] == 200
    follower = FakeMember(doc[1], 503, {"code": "not_leader", "message": "not the leader", "leader_id": 2})
    try:
        c = fenced.Client([follower.url, server.url], attempt_timeout=0.4)
        with c.lock(name, ttl=5.0) as lock:
            assert c.endpoint == server.url
            assert any("/acquire" in h for h in follower.hits), "the follower was asked first"
            assert lock.token >= 1
        # Alone, its refusal is the answer: NotLeader, an Unavailable.
        with pytest.raises(fenced.NotLeader) as e:
            fenced.Client(follower.url).try_lock(name)
        assert e.value.leader_id == 2
    finally:
        follower.close()


def test_no_member_answering_is_unavailable_within_the_request_time_out(name: str) -> None:
    c = fenced.Client([f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"],
                      request_timeout=1.0, attempt_timeout=0.2)
    t0 = time.monotonic()
    with pytest.raises(fenced.Unavailable):
        c.try_lock(name)
    assert time.monotonic() - t0 < 5.0


def test_a_request_left_on_a_silent_member_does_not_hold_up_the_exit(server: Server, name: str) -> None:
    import subprocess
    import sys

    silent = silent_member()
    try:
        script = (
            "import fenced, sys\n"
            f"c = fenced.Client([{silent.url!r}, {server.url!r}], request_timeout=60.0, attempt_timeout=0.4)\n"
            f"c.try_lock({name!r}, ttl=5.0).release()\n"
            "print('done', flush=True)\n"
        )
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "done" in out.stdout, out.stderr
        assert time.monotonic() - t0 < 10.0, "the interpreter waited for the abandoned request"
    finally:
        silent.close()


class ApplyThenFallSilent:
    """A member that forwards everything to the real server until a ``PUT``: it lets that
    reach the server, reads the answer (the write was applied), runs ``meanwhile`` (a newer
    holder writes), and from then on answers nothing on any connection: a leader that
    applied the write and froze before answering."""

    def __init__(self, upstream_port: int, meanwhile) -> None:  # type: ignore[no-untyped-def]
        import socket as _socket
        import threading as _threading

        from support import Listener

        self.silent = _threading.Event()
        self.applied = b""
        self.error: Optional[BaseException] = None

        def serve(conn: _socket.socket) -> None:
            if self.silent.is_set():
                return hold(conn)
            up = _socket.create_connection(("127.0.0.1", upstream_port), timeout=30)
            put_sent = _threading.Event()

            def c2s() -> None:
                try:
                    while True:
                        data = conn.recv(65536)
                        if not data:
                            return
                        if self.silent.is_set():
                            continue
                        if data.startswith(b"PUT "):
                            put_sent.set()
                        up.sendall(data)
                except OSError:
                    return

            _threading.Thread(target=c2s, daemon=True).start()
            try:
                while not self.silent.is_set():
                    data = up.recv(65536)
                    if not data:
                        return
                    if put_sent.is_set():
                        self.applied = data
                        try:
                            meanwhile()
                        except Exception as e:  # noqa: BLE001 - the test reads it
                            self.error = e
                        self.silent.set()
                        return  # the connection stays open, unanswered
                    conn.sendall(data)
            except OSError:
                return

        def hold(conn: _socket.socket) -> None:
            try:
                conn.settimeout(30)
                while conn.recv(65536):
                    pass
            except OSError:
                pass

        self.listener = Listener(serve)
        self.url = self.listener.url

    def close(self) -> None:
        self.listener.close()


def stale_write_retried(server: Server, name: str):  # type: ignore[no-untyped-def]
    """A write under an old token whose first attempt goes to a member that applies it,
    lets a newer holder write, and falls silent: the direct client, the old token, the
    newer lock (release it) and the member (close it)."""
    direct = fenced.Client(server.url)
    old = direct.lock(name, ttl=5.0)
    old_token = old.token
    old.release()
    newer = direct.lock(name, ttl=5.0)
    member = ApplyThenFallSilent(server.port, lambda: direct.store.put(name, b"newer", token=newer.token))
    return direct, old_token, newer, member


def test_a_retried_write_refused_as_stale_is_reported_as_unknown_not_stale(server: Server, name: str) -> None:
    direct, old_token, newer, member = stale_write_retried(server, name)
    try:
        c = fenced.Client([member.url, server.url], request_timeout=10.0, attempt_timeout=0.4)
        c.store.get(name)  # the API check and a first answer, through the member
        with pytest.raises(fenced.Unavailable) as e:
            c.store.put(name, b"old", token=old_token)
        assert member.error is None, member.error
        assert not isinstance(e.value, fenced.StaleToken)
        assert e.value.code == "outcome_unknown" and "may have been applied" in e.value.message
        assert member.error is None, member.error
        assert b"HTTP/1.1 200" in member.applied, "the first attempt was applied"
        # Without that history a refusal is a plain StaleToken.
        with pytest.raises(fenced.StaleToken):
            direct.store.put(name, b"old", token=old_token)
    finally:
        member.close()
        newer.release()
