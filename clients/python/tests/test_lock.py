"""The sync client against a real server: acquire and release, try-lock, the FIFO queue,
keepalive, and the lost signal's rules."""

from __future__ import annotations

import threading
import time
from typing import List

import pytest

import fenced
from support import Server, wait_until


def client(server: Server) -> fenced.Client:
    return fenced.Client(server.url, request_timeout=5.0)


def test_acquire_and_release(server: Server, name: str) -> None:
    c = client(server)
    with c.lock(name, ttl=5.0, wait=1.0) as lock:
        assert isinstance(lock.token, int) and lock.token >= 1
        assert len(lock.lease_id) == 32
        info = c.lock_info(name)
        assert info["held"] is True and info["token"] == lock.token
        assert c.check(name, lock.token) == (True, lock.token)
        assert lock.is_valid() and lock.check() == lock.token and not lock.lost.is_set()
        assert time.monotonic() < lock.valid_until <= time.monotonic() + 5.0 * 0.9
        first = lock.token
    assert c.lock_info(name)["held"] is False, "released on exit"
    # The lease went with it: a keepalive of it is refused.
    with pytest.raises(fenced.LeaseNotFound):
        c._keepalive(lock.lease_id, 2.0)
    again = c.try_lock(name, ttl=5.0)
    assert again.token > first, "tokens strictly increase"
    again.release()
    assert c.server_version() == "0.1.0"


def test_try_lock_on_a_held_lock_is_refused_with_lock_held(server: Server, name: str) -> None:
    c = client(server)
    with c.lock(name, ttl=5.0) as holder:
        t0 = time.monotonic()
        with pytest.raises(fenced.LockHeld) as e:
            c.try_lock(name, ttl=5.0)
        assert e.value.holder_token == holder.token and e.value.status == 409
        with pytest.raises(fenced.LockHeld):
            c.lock(name, ttl=5.0, wait=0.3)
        assert time.monotonic() - t0 >= 0.3, "the second one waited its wait"
        assert c.lock_info(name)["token"] == holder.token


def test_waiters_are_granted_first_in_first_out(server: Server, name: str) -> None:
    c = client(server)
    holder = c.lock(name, ttl=10.0)
    order: List[str] = []
    tokens: List[int] = []
    errors: List[BaseException] = []

    def waiter(tag: str) -> None:
        try:
            with fenced.Client(server.url).lock(name, ttl=5.0, wait=15.0) as lock:
                order.append(tag)
                tokens.append(lock.token)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = []
    for k, tag in enumerate("ABCD"):
        t = threading.Thread(target=waiter, args=(tag,))
        t.start()
        threads.append(t)
        # The next waiter joins only once this one is in the queue.
        wait_until(lambda k=k: c.lock_info(name)["waiters"] == k + 1, 10.0, f"waiter {tag} queued")
    holder.release()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert order == list("ABCD"), order
    assert tokens == sorted(tokens) and tokens[0] > holder.token


def test_keepalive_keeps_the_lock_past_its_ttl(server: Server, name: str) -> None:
    c = client(server)
    with c.lock(name, ttl=0.6) as lock:
        first_deadline = lock.valid_until
        time.sleep(2.0)  # more than three TTLs
        assert lock.is_valid() and not lock.lost.is_set(), lock.lost_reason
        assert lock.valid_until > first_deadline + 1.0, "only successful keepalives moved the deadline"
        assert c.store.put(name, b"still mine", token=lock.token) == lock.token
        assert c.lock_info(name)["token"] == lock.token


def test_without_keepalive_the_lock_is_lost_at_its_deadline_and_not_before(server: Server, name: str) -> None:
    c = client(server)
    lock = c.lock(name, ttl=1.0)
    lock._pause_keepalive(True)  # as a long pause of this process would
    deadline = lock.valid_until
    assert lock.lost.wait(timeout=5.0), "the timer set lost"
    noticed = time.monotonic()
    assert noticed >= deadline, "never before the deadline"
    assert lock.valid_until == deadline, "nothing but a keepalive moves the deadline"
    assert lock.lost_reason is fenced.LostReason.EXPIRED
    with pytest.raises(fenced.LockLost) as e:
        lock.check()
    assert e.value.reason is fenced.LostReason.EXPIRED
    lock._pause_keepalive(False)
    time.sleep(0.5)
    assert lock.lost.is_set() and not lock.is_valid(), "lost is final"
    with pytest.raises(fenced.LockLost):
        lock.release()


def test_a_revoked_lease_is_lost_at_the_next_keepalive(server: Server, name: str) -> None:
    c = client(server)
    lock = c.lock(name, ttl=3.0)
    c.revoke_lease(lock.lease_id)  # as an operator, or an expiry the server saw first
    assert lock.lost.wait(timeout=3.0), "lost at the next keepalive (every TTL/3)"
    assert lock.lost_reason is fenced.LostReason.LEASE_NOT_FOUND
    assert time.monotonic() < lock.valid_until, "at once, not at the deadline"
    with pytest.raises(fenced.LockLost):
        with lock:
            pass


def test_a_grant_after_a_long_wait_is_renewed_at_once(server: Server, name: str) -> None:
    c = client(server)
    holder = c.lock(name, ttl=5.0)
    threading.Timer(1.5, holder.release).start()
    t0 = time.monotonic()
    # Counted from its send the deadline would be t0 + 0.54 s, long past at the grant.
    with c.lock(name, ttl=0.6, wait=10.0) as lock:
        granted = time.monotonic()
        assert granted - t0 >= 1.4
        assert lock.valid_until > granted, "renewed once at once: a full deadline"
        assert lock.is_valid(), lock.lost_reason
        assert lock.token > holder.token


def test_an_exception_in_the_body_releases_and_passes_through(server: Server, name: str) -> None:
    c = client(server)
    with pytest.raises(ZeroDivisionError):
        with c.lock(name, ttl=5.0):
            raise ZeroDivisionError("the work failed")
    assert c.lock_info(name)["held"] is False


def test_bad_arguments_are_refused_before_sending(server: Server) -> None:
    c = client(server)
    with pytest.raises(fenced.BadRequest):
        c.lock("", ttl=1.0)
    with pytest.raises(fenced.BadRequest):
        c.lock("x" * 300, ttl=1.0)
    with pytest.raises(fenced.OutOfRange) as e:
        c.lock("ttl/too/long", ttl=10_000.0)  # the server's bound
    assert e.value.status == 400 and e.value.details.get("ttl_ms_max") == 300000


def test_a_holder_label_shows_in_the_lock_views_and_a_bad_one_is_refused(server: Server, name: str) -> None:
    c = client(server)
    with c.lock(name, ttl=5.0, wait=1.0, holder="worker-7@host-b") as lock:
        info = c.lock_info(name)
        assert info["held"] is True and info["token"] == lock.token
        assert info["holder"] == "worker-7@host-b"
        assert [(x["name"], x["holder"]) for x in c.locks(prefix=name)] == [(name, "worker-7@host-b")]
    free = c.lock_info(name)
    assert free["held"] is False and "holder" in free and free["holder"] is None, free
    # Without a label the views show null.
    with c.lock(name, ttl=5.0) as lock:
        info = c.lock_info(name)
        assert info["held"] is True and info["token"] == lock.token
        assert "holder" in info and info["holder"] is None, info
        assert [x["holder"] for x in c.locks(prefix=name)] == [None]
    with c.try_lock(name, ttl=5.0, holder="try@host-c"):
        assert c.lock_info(name)["holder"] == "try@host-c"
    # The server judges a label: too long, or with a control character, is refused and
    # nothing is granted.
    for bad in ("h" * 300, "worker\n7"):
        with pytest.raises(fenced.BadRequest) as e:
            c.lock(name, ttl=5.0, wait=1.0, holder=bad)
        assert e.value.code == "invalid_holder" and e.value.status == 400, e.value
        info = c.lock_info(name)
        assert info["held"] is False and info["token"] is None and info["waiters"] == 0, info
    with pytest.raises(fenced.BadRequest) as e:
        c.try_lock(name, ttl=5.0, holder="h" * 257)
    assert e.value.code == "invalid_holder" and e.value.status == 400
    # Not a string: refused here, before sending.
    with pytest.raises(fenced.BadRequest) as e:
        c.lock(name, ttl=5.0, holder=7)  # type: ignore[arg-type]
    assert e.value.code == "invalid_holder" and e.value.status is None
    assert c.lock_info(name)["held"] is False
    with c.try_lock(name, ttl=5.0) as lock:
        assert lock.token >= 1, "still free to take"


def test_a_lock_dropped_unreleased_is_released_in_the_background(server: Server, name: str) -> None:
    import gc

    c = client(server)
    lock = c.lock(name, ttl=30.0)  # held for 30 s if nobody gave it back
    token = lock.token
    del lock
    gc.collect()
    wait_until(lambda: c.lock_info(name)["held"] is False, 5.0, "the dropped lock released")
    assert c.try_lock(name, ttl=5.0).token > token


def test_a_frozen_server_makes_the_lock_lost_at_the_deadline_without_its_answer(name: str) -> None:
    import signal

    s = Server()
    try:
        c = fenced.Client(s.url, request_timeout=10.0)
        lock = c.lock(name, ttl=1.0)
        s.proc.send_signal(signal.SIGSTOP)  # keepalives hang: no answer, no error
        deadline = lock.valid_until
        assert lock.lost.wait(timeout=4.0), "lost without waiting for the hung keepalive"
        assert time.monotonic() >= deadline and lock.lost_reason is fenced.LostReason.EXPIRED
        assert time.monotonic() - deadline < 2.0
    finally:
        s.proc.send_signal(signal.SIGCONT)
        s.stop()


def test_a_negative_margin_is_refused(server: Server, name: str) -> None:
    with pytest.raises(fenced.BadRequest, match="margin"):
        client(server).lock(name, ttl=1.0, margin=-0.5)


def test_leases_by_hand_and_the_lock_list(server: Server, name: str) -> None:
    c = client(server)
    lease = c.create_lease(2.0)
    assert len(lease) == 32 and c.keepalive(lease) == 2.0
    c.revoke_lease(lease)
    c.revoke_lease(lease)  # idempotent
    with pytest.raises(fenced.LeaseNotFound):
        c.keepalive(lease)
    with c.lock(name, ttl=5.0) as lock:
        listed = c.locks(prefix=name)
        assert [(x["name"], x["token"]) for x in listed] == [(name, lock.token)]


def test_a_keepalive_counts_from_its_send_not_its_answer(server: Server, name: str) -> None:
    from support import DelayAnswers

    delay = 0.3
    slow = DelayAnswers(server.port, b"/keepalive", delay)
    try:
        c = fenced.Client(slow.url, request_timeout=5.0)
        with c.lock(name, ttl=1.5) as lock:
            before = lock.valid_until
            wait_until(lambda: lock.valid_until != before, 5.0, "a keepalive got through", step=0.005)
            seen = time.monotonic()
            implied_send = lock.valid_until - (lock.ttl - lock.margin)
            # The answer came `delay` after the send; counted from the answer, the implied
            # start would be within a few ms of `seen`.
            assert implied_send <= seen - delay + 0.05, (seen - implied_send)
            assert implied_send >= seen - delay - 0.5, "and not from some older moment"
            assert lock.is_valid()
    finally:
        slow.close()


def test_the_first_deadline_counts_from_the_acquires_send(server: Server, name: str) -> None:
    from support import DelayAnswers

    delay = 0.3
    slow = DelayAnswers(server.port, b"/acquire", delay)
    try:
        c = fenced.Client(slow.url, request_timeout=5.0)
        c.store.get(name)  # the API check, not delayed
        t0 = time.monotonic()
        with c.lock(name, ttl=3.0) as lock:
            got = time.monotonic()
            implied_send = lock.valid_until - (lock.ttl - lock.margin)
            assert t0 <= implied_send <= got - delay + 0.05, (implied_send - t0, got - implied_send)
    finally:
        slow.close()


def test_lock_all_grants_a_set_together_and_release_frees_every_lock(server: Server, name: str) -> None:
    c = client(server)
    a, b, z = f"{name}/a", f"{name}/b", f"{name}/z"
    with c.lock_all([b, a], ttl=5.0, wait=1.0, holder="job-1") as lock:
        assert list(lock.tokens) == [a, b], "sorted"
        ta, tb = lock.tokens[a], lock.tokens[b]
        assert ta < tb and (lock.name, lock.token) == (a, ta)
        assert c.lock_info(b)["token"] == tb and c.lock_info(b)["holder"] == "job-1"
        with pytest.raises(fenced.LockHeld):
            c.lock_all([b, z], ttl=5.0, wait=0.0)
        assert c.lock_info(z)["held"] is False, "nothing of a refused set is taken"
    assert c.lock_info(a)["held"] is False and c.lock_info(b)["held"] is False
    with pytest.raises(fenced.BadRequest) as e:
        c.lock_all([], ttl=5.0)
    assert e.value.code == "invalid_names"


def test_lock_all_callers_with_random_orders_never_deadlock_or_overlap(server: Server, name: str) -> None:
    import random

    names = [f"{name}/{k}" for k in "abcde"]
    held: dict = {}
    mu = threading.Lock()
    failures: List[str] = []
    counts = [0] * 6
    stop_at = time.monotonic() + 4.0

    def caller(i: int) -> None:
        rng = random.Random(i)
        c = client(server)
        while time.monotonic() < stop_at:
            want = rng.sample(names, rng.choice([2, 3]))
            try:
                lock = c.lock_all(want, ttl=10.0, wait=8.0)
            except fenced.LockHeld:
                failures.append(f"caller {i} waited 8 s for {want}: a deadlock")
                return
            with mu:
                for n in want:
                    if n in held:
                        failures.append(f"{n} held by {held[n]} and {i}")
                    held[n] = i
            time.sleep(rng.uniform(0.001, 0.008))
            with mu:
                for n in want:
                    held.pop(n, None)
            lock.release()
            counts[i] += 1

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30.0)
    assert failures == []
    assert all(n >= 3 for n in counts), counts


def test_the_async_client_locks_a_set(server: Server, name: str) -> None:
    import asyncio

    async def main() -> None:
        async with fenced.AsyncClient(server.url, request_timeout=5.0) as ac:
            async with ac.lock_all([f"{name}/y", f"{name}/x"], ttl=5.0, wait=1.0) as lock:
                assert list(lock.tokens) == [f"{name}/x", f"{name}/y"]
                with pytest.raises(fenced.LockHeld):
                    await ac.lock_all([f"{name}/y", f"{name}/z"], ttl=5.0, wait=0.0)
            assert (await ac.lock_info(f"{name}/y"))["held"] is False

    asyncio.run(asyncio.wait_for(main(), 30.0))
