"""The asyncio client against a real server: the same rules as the sync one."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Coroutine, TypeVar

import pytest

import fenced
from support import DropFirstAnswer, Server, free_port

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def test_acquire_release_and_the_store(server: Server, name: str) -> None:
    async def main() -> None:
        async with fenced.AsyncClient(server.url) as c:
            async with c.lock(name, ttl=5.0) as lock:
                assert lock.token >= 1 and not lock.lost.is_set() and lock.is_valid()
                assert isinstance(lock.lost, asyncio.Event)
                assert await c.store.put(name, b"a", token=lock.token) == lock.token
                with pytest.raises(fenced.LockHeld) as e:
                    await c.try_lock(name)
                assert e.value.holder_token == lock.token
                old = lock.token
            assert (await c.lock_info(name))["held"] is False
            newer = await c.lock(name, ttl=5.0)
            assert newer.token > old
            await c.store.put(name, b"b", token=newer.token)
            with pytest.raises(fenced.StaleToken) as s:
                await c.store.put(name, b"zombie", token=old)
            assert (s.value.token, s.value.highest_seen) == (old, newer.token)
            assert await c.store.get(name) == b"b"
            with pytest.raises(fenced.TokenNotIssued):
                await c.store.put(name, b"x", token=newer.token + 10**6)
            await newer.release()

    run(main())


def test_keepalive_and_the_lost_event(server: Server, name: str) -> None:
    async def main() -> None:
        async with fenced.AsyncClient(server.url) as c:
            async with c.lock(name, ttl=0.6) as lock:
                await asyncio.sleep(1.5)
                assert lock.is_valid(), lock.lost_reason
            lock = await c.lock(name, ttl=1.0)
            lock._pause_keepalive(True)
            deadline = lock.valid_until
            await asyncio.wait_for(asyncio.Event.wait(lock.lost), timeout=5)  # set by the timer task
            assert time.monotonic() >= deadline and lock.lost_reason is fenced.LostReason.EXPIRED
            with pytest.raises(fenced.LockLost):
                lock.check()
            with pytest.raises(fenced.LockLost):
                await lock.release()

    run(main())


def test_cancel_on_loss_cancels_the_body_and_raises_lock_lost(server: Server, name: str) -> None:
    async def main() -> None:
        async with fenced.AsyncClient(server.url) as c:
            reached_end = False
            t0 = time.monotonic()
            with pytest.raises(fenced.LockLost) as e:
                async with c.lock(name, ttl=3.0, cancel_on_loss=True) as lock:
                    await c.revoke_lease(lock.lease_id)  # the server forgets it: lost at the next keepalive
                    await asyncio.sleep(30)
                    reached_end = True
            assert not reached_end and e.value.reason is fenced.LostReason.LEASE_NOT_FOUND
            assert time.monotonic() - t0 < 5.0
            # Without the option the body runs on, and the block still says it was lost.
            with pytest.raises(fenced.LockLost):
                async with c.lock(name, ttl=3.0) as lock:
                    await c.revoke_lease(lock.lease_id)
                    await asyncio.wait_for(asyncio.Event.wait(lock.lost), timeout=5)
                    reached_end = True
            assert reached_end
        # The task itself was not left cancelled.
        task = asyncio.current_task()
        if sys.version_info >= (3, 11):
            assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0.01)

    run(main())


def test_retry_under_the_same_id_and_failover(server: Server, name: str) -> None:
    proxy = DropFirstAnswer(server.port)

    async def main() -> None:
        async with fenced.AsyncClient(proxy.url) as c:
            async with c.lock(name, ttl=5.0) as lock:
                dropped = proxy.dropped_json()
                assert (lock.token, lock.lease_id) == (dropped["token"], dropped["lease_id"])
        dead = f"http://127.0.0.1:{free_port()}"
        async with fenced.AsyncClient([dead, server.url], attempt_timeout=0.4) as c:
            async with c.lock(name, ttl=5.0) as lock:
                assert c.endpoint == server.url and lock.token > dropped["token"]

    try:
        run(main())
    finally:
        proxy.close()


def test_a_grant_after_a_long_wait_is_renewed_at_once(server: Server, name: str) -> None:
    async def main() -> None:
        async with fenced.AsyncClient(server.url) as c:
            holder = await c.lock(name, ttl=5.0)

            async def later() -> None:
                await asyncio.sleep(1.5)
                await holder.release()

            task = asyncio.ensure_future(later())
            async with c.lock(name, ttl=0.6, wait=10.0) as lock:
                assert lock.valid_until > time.monotonic() and lock.is_valid()
            await task

    run(main())


def test_a_cancelled_acquire_gives_its_lease_back(server: Server, name: str) -> None:
    async def main() -> None:
        async with fenced.AsyncClient(server.url) as c:
            holder = await c.lock(name, ttl=5.0)
            waiter = asyncio.ensure_future(_acquire(c, name))
            for _ in range(100):
                if (await c.lock_info(name))["waiters"] == 1:
                    break
                await asyncio.sleep(0.05)
            assert (await c.lock_info(name))["waiters"] == 1
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            for _ in range(100):
                if (await c.lock_info(name))["waiters"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert (await c.lock_info(name))["waiters"] == 0, "the waiter left the queue"
            await holder.release()
            assert (await c.lock_info(name))["held"] is False, "and nobody got it behind our back"

    run(main())


async def _acquire(c: fenced.AsyncClient, name: str) -> fenced.AsyncLock:
    return await c.lock(name, ttl=5.0, wait=20.0)


def test_a_lock_dropped_unreleased_is_released_in_the_background(server: Server, name: str) -> None:
    import gc

    async def main() -> None:
        async with fenced.AsyncClient(server.url) as c:
            lock = await c.lock(name, ttl=30.0)
            del lock
            gc.collect()
            for _ in range(100):
                if (await c.lock_info(name))["held"] is False:
                    break
                await asyncio.sleep(0.05)
            assert (await c.lock_info(name))["held"] is False, "the dropped lock released"

    run(main())


def test_a_frozen_server_makes_the_lock_lost_at_the_deadline(name: str) -> None:
    import signal

    s = Server()

    async def main() -> None:
        async with fenced.AsyncClient(s.url) as c:
            lock = await c.lock(name, ttl=1.0)
            s.proc.send_signal(signal.SIGSTOP)
            deadline = lock.valid_until
            await asyncio.wait_for(asyncio.Event.wait(lock.lost), timeout=4)
            assert time.monotonic() >= deadline and lock.lost_reason is fenced.LostReason.EXPIRED
            s.proc.send_signal(signal.SIGCONT)
            with pytest.raises(fenced.LockLost):
                await lock.release()

    try:
        run(main())
    finally:
        s.proc.send_signal(signal.SIGCONT)
        s.stop()


def test_leases_by_hand_and_the_lock_list(server: Server, name: str) -> None:
    async def main() -> None:
        async with fenced.AsyncClient(server.url) as c:
            lease = await c.create_lease(2.0)
            assert await c.keepalive(lease) == 2.0
            await c.revoke_lease(lease)
            with pytest.raises(fenced.LeaseNotFound):
                await c.keepalive(lease)
            async with c.lock(name, ttl=5.0) as lock:
                assert [x["token"] for x in await c.locks(prefix=name)] == [lock.token]
            assert (await c.check(name, lock.token))[0] is False

    run(main())


def test_a_holder_label_shows_in_the_lock_views_and_a_bad_one_is_refused(server: Server, name: str) -> None:
    proxy = DropFirstAnswer(server.port)

    async def main() -> None:
        async with fenced.AsyncClient(server.url) as c:
            async with c.lock(name, ttl=5.0, wait=1.0, holder="worker-7@host-b") as lock:
                info = await c.lock_info(name)
                assert info["held"] is True and info["token"] == lock.token
                assert info["holder"] == "worker-7@host-b"
                assert [x["holder"] for x in await c.locks(prefix=name)] == ["worker-7@host-b"]
            free = await c.lock_info(name)
            assert free["held"] is False and "holder" in free and free["holder"] is None, free
            lock = await c.lock(name, ttl=5.0)  # no label: null
            info = await c.lock_info(name)
            assert info["token"] == lock.token and "holder" in info and info["holder"] is None, info
            await lock.release()
            async with c.try_lock(name, ttl=5.0, holder="try@host-c"):
                assert (await c.lock_info(name))["holder"] == "try@host-c"
            for bad in ("h" * 300, "worker\n7"):
                with pytest.raises(fenced.BadRequest) as e:
                    await c.lock(name, ttl=5.0, wait=1.0, holder=bad)
                assert e.value.code == "invalid_holder" and e.value.status == 400, e.value
                info = await c.lock_info(name)
                assert info["held"] is False and info["token"] is None and info["waiters"] == 0, info
            with pytest.raises(fenced.BadRequest) as e:
                await c.lock(name, ttl=5.0, holder=7)  # type: ignore[arg-type]
            assert e.value.code == "invalid_holder" and e.value.status is None
        # A retry after a lost answer carries the same label.
        async with fenced.AsyncClient(proxy.url) as c:
            async with c.lock(name, ttl=5.0, holder="worker-7@host-b") as lock:
                dropped = proxy.dropped_json()
                assert (lock.token, lock.lease_id) == (dropped["token"], dropped["lease_id"])
                assert b"".join(proxy.requests).count(b'"holder": "worker-7@host-b"') == 2
                assert (await c.lock_info(name))["holder"] == "worker-7@host-b"

    try:
        run(main())
    finally:
        proxy.close()


def test_a_retried_write_refused_as_stale_is_reported_as_unknown(server: Server, name: str) -> None:
    from test_retry_failover import stale_write_retried

    _, old_token, newer, member = stale_write_retried(server, name)

    async def main() -> None:
        async with fenced.AsyncClient([member.url, server.url], attempt_timeout=0.4) as c:
            await c.store.get(name)
            with pytest.raises(fenced.Unavailable) as e:
                await c.store.put(name, b"old", token=old_token)
            assert not isinstance(e.value, fenced.StaleToken) and e.value.code == "outcome_unknown"

    try:
        run(main())
        assert member.error is None and b"HTTP/1.1 200" in member.applied
    finally:
        member.close()
        newer.release()


def test_deadlines_count_from_the_send(server: Server, name: str) -> None:
    from support import DelayAnswers

    delay = 0.3
    slow_ka = DelayAnswers(server.port, b"/keepalive", delay)
    slow_acq = DelayAnswers(server.port, b"/acquire", delay)

    async def main() -> None:
        async with fenced.AsyncClient(slow_acq.url) as c:
            await c.store.get(name)
            t0 = time.monotonic()
            async with c.lock(name, ttl=3.0) as lock:
                got = time.monotonic()
                implied = lock.valid_until - (lock.ttl - lock.margin)
                assert t0 <= implied <= got - delay + 0.05
        async with fenced.AsyncClient(slow_ka.url) as c:
            async with c.lock(name, ttl=1.5) as lock:
                before = lock.valid_until
                for _ in range(1000):
                    if lock.valid_until != before:
                        break
                    await asyncio.sleep(0.005)
                seen = time.monotonic()
                implied = lock.valid_until - (lock.ttl - lock.margin)
                assert lock.valid_until != before and seen - delay - 0.5 <= implied <= seen - delay + 0.05

    try:
        run(main())
    finally:
        slow_ka.close()
        slow_acq.close()
