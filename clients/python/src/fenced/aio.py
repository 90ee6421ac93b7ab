"""The asyncio client: ``fenced.AsyncClient``, the same surface as ``fenced.Client`` on
``httpx.AsyncClient``. The guard's keepalive and deadline timer are tasks; ``lost`` is an
:class:`asyncio.Event`; ``cancel_on_loss=True`` cancels the body's task when the lock is
lost (``async with`` then raises :class:`fenced.LockLost`)."""

from __future__ import annotations

import asyncio
import ssl
import sys
import weakref
from types import TracebackType
from typing import Any, AsyncIterator, Awaitable, Dict, List, Optional, Set, Tuple, Type, TypeVar

import httpx

from . import _calls, _core, _flow, _store, _watch
from ._lockstate import GrantView, LockState
from ._store import StoreRead
from ._watch import WatchEvent
from .client import log
from .signing import GrantKeys
from .errors import FencedError, LockLost, LostReason, Transport, from_answer

T = TypeVar("T")


class AsyncClient(_core.ClientBase):
    """``fenced.Client``'s twin for asyncio: the same arguments, rules and errors."""

    def _open(self, headers: Dict[str, str], verify: Any) -> None:
        self._http = httpx.AsyncClient(headers=headers, verify=verify, trust_env=False, limits=_core.HTTP_LIMITS)
        #: Background revokes of abandoned acquires, kept referenced until done.
        self._background: Set["asyncio.Task[Any]"] = set()
        self.store = AsyncStore(self)

    def lock(self, name: str, ttl: float = 10.0, wait: float = 30.0, *, margin: Optional[float] = None,
             cancel_on_loss: bool = False, holder: Optional[str] = None) -> "_Acquire":
        """``async with client.lock(name, ttl, wait) as lock:``, or ``lock = await
        client.lock(...)`` then ``await lock.release()``. With ``cancel_on_loss=True`` the
        task running the ``async with`` body is cancelled when the lock is lost, and the
        block raises :class:`fenced.LockLost`. ``holder`` labels the holder in the lock's
        views and its ``granted`` event, the same on every retry and failover of the call,
        as in :meth:`fenced.Client.lock` (a bad label: :class:`fenced.BadRequest`
        ``invalid_holder``, from the server)."""
        return _Acquire(self, name, ttl, wait, margin, cancel_on_loss, holder)

    def lock_all(self, names: List[str], ttl: float = 10.0, wait: float = 30.0, *, margin: Optional[float] = None,
                 cancel_on_loss: bool = False, holder: Optional[str] = None) -> "_Acquire":
        """Every one of ``names`` together under one implicit lease, or none within
        ``wait``, as :meth:`fenced.Client.lock_all`: ``async with client.lock_all([...]) as
        lock:``; :attr:`AsyncLock.tokens` has a token per name."""
        return _Acquire(self, "", ttl, wait, margin, cancel_on_loss, holder, _core.check_names(names))

    def try_lock(self, name: str, ttl: float = 10.0, *, margin: Optional[float] = None,
                 cancel_on_loss: bool = False, holder: Optional[str] = None) -> "_Acquire":
        return self.lock(name, ttl, 0.0, margin=margin, cancel_on_loss=cancel_on_loss, holder=holder)

    async def check(self, name: str, token: int) -> Tuple[bool, Optional[int]]:
        return await self._run(_calls.check(name, token))

    async def grant_keys(self) -> GrantKeys:
        """``GET /v1/keys``: the keys that verify this service's grant signatures, for a
        :class:`fenced.gates.Verified` gate (fetch once, or configure them). Raises
        :class:`fenced.NotFound` (``not_signing``) when the service does not sign."""
        return await self._run(_calls.grant_keys())

    async def lock_info(self, name: str) -> Dict[str, Any]:
        """``GET /v1/locks/{name}``, as :meth:`fenced.Client.lock_info` (``holder`` included)."""
        return await self._run(_calls.lock_info(name))

    async def locks(self, prefix: Optional[str] = None) -> List[Dict[str, Any]]:
        return await self._run(_calls.locks(prefix))

    async def create_lease(self, ttl: float) -> str:
        return await self._run(_calls.create_lease(ttl))

    async def keepalive(self, lease_id: str) -> float:
        return await self._keepalive(lease_id, self.request_timeout) / 1000.0

    async def revoke_lease(self, lease_id: str) -> None:
        await self._run(_calls.revoke_lease(lease_id))

    async def revoke_lock(self, name: str, token: Optional[int] = None) -> int:
        """An operator's release, as :meth:`fenced.Client.revoke_lock`: the token taken;
        without ``token`` the current holder's is read first and named;
        :class:`fenced.NotHolder` when nobody, or another token, holds it."""
        return await self._drive(_flow.revoke_lock(self, name, token))

    def watch(self, prefix: str = "", since: Optional[int] = None) -> "AsyncWatch":
        """The events of names and keys under ``prefix``, as :meth:`fenced.Client.watch`:
        ``async for event in client.watch("orders/"):``. The stream opens at the first
        event asked for, or at ``await watch.open()``."""
        return AsyncWatch(self, prefix, since)

    async def aclose(self) -> None:
        if self._background:
            await asyncio.wait(set(self._background), timeout=3.0)
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # --- the calls the guard makes ----------------------------------------------------------

    async def _acquire(self, name: str, ttl: float, wait: float, margin: Optional[float],
                       holder: Optional[str] = None, names: Optional[List[str]] = None) -> LockState:
        return await self._drive(_flow.acquire(self, name, ttl, wait, margin, holder, names))

    async def _keepalive(self, lease_id: str, timeout: float) -> int:
        return await self._drive(_flow.keepalive(self, lease_id, timeout))

    async def _release(self, state: LockState) -> None:
        await self._run(_calls.release(state.lease_id))

    async def _run(self, call: _calls.Call[T]) -> T:
        return await self._drive(_flow.run(self, call))

    def _spawn(self, coro: Awaitable[Any], what: str) -> None:
        """Runs ``coro`` in a task of its own, kept referenced until done; failures logged."""
        async def run() -> None:
            try:
                await coro
            except Exception as e:  # noqa: BLE001 - best effort
                log.debug("%s: %s", what, e)

        try:
            task = asyncio.get_running_loop().create_task(run())
        except RuntimeError:
            return
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- the driver: the flows' requests, performed with tasks and httpx.AsyncClient ----------

    async def _drive(self, flow: _flow.Flow[T]) -> T:
        return await _flow.adrive(flow, self._do)

    async def _do(self, op: _flow.Op) -> Any:
        """Performs one request of a flow (:mod:`fenced._flow`)."""
        if isinstance(op, _flow.Send):
            return await self._send_once(*op)
        if isinstance(op, _flow.Sleep):
            return await asyncio.sleep(op.seconds)
        if isinstance(op, _flow.Spawn):
            return asyncio.ensure_future(self._drive(op.flow))
        if isinstance(op, _flow.Wait):
            done, _ = await asyncio.wait(op.tasks, timeout=op.timeout, return_when=asyncio.FIRST_COMPLETED)
            return done
        if isinstance(op, _flow.BestEffort):
            return self._spawn(self._drive(op.flow), op.what)
        return await op.fn(*op.args)

    async def _open_stream(self, i: int, path: str, silence: float) -> httpx.Response:
        """``GET path`` on member ``i`` answered with a stream, as
        :meth:`fenced.Client._open_stream`: the response once its head came (within the
        request time-out), its body unread; at most ``silence`` between two bytes."""
        await self._drive(_flow.check_server(self, i))
        url = self._members.endpoints[i] + path
        t = self._stream_timeouts(silence)
        req = self._http.build_request("GET", url, headers={"accept": "text/event-stream"}, timeout=t)
        try:
            r = await asyncio.wait_for(self._http.send(req, stream=True), self.request_timeout)
        except asyncio.TimeoutError:
            raise Transport(f"{url}: no answer within {int(self.request_timeout * 1000)} ms") from None
        except (httpx.HTTPError, ssl.SSLError) as e:
            raise _core.http_failure(url, silence, e) from e
        if r.status_code == 200:
            return r
        try:
            body = await r.aread()
        except (httpx.HTTPError, ssl.SSLError):
            body = b""
        finally:
            await r.aclose()
        raise from_answer(r.status_code, body)

    async def _send_once(self, i: int, method: str, path: str, body: Optional[bytes], headers: Dict[str, str],
                         timeout: float) -> _core.Reply:
        url = self._members.endpoints[i] + path
        t = self._request_timeouts(timeout)
        try:
            r = await self._http.request(method, url, content=body, headers=headers, timeout=t)
        except (httpx.HTTPError, ssl.SSLError) as e:
            # An SSLError of its own: httpcore's asyncio backend lets one through unwrapped
            # when it arrives on a read (a certificate refused in a TLS 1.3 handshake).
            raise _core.http_failure(url, timeout, e) from e
        return _core.Reply(r.status_code, r.headers, r.content)


class AsyncWatch(_watch.WatchBase[AsyncClient]):
    """:class:`fenced.Watch`'s twin: ``async for event in watch:``, :attr:`position`,
    ``await open()``, ``await aclose()`` (also on leaving ``async with watch:``). Iterate
    it from one task at a time; to stop a task blocked in it, cancel the task or call
    ``aclose()`` from another."""

    _resp: Optional[httpx.Response]
    _chunks: Optional[AsyncIterator[bytes]]

    def __init__(self, client: AsyncClient, prefix: str, since: Optional[int]) -> None:
        super().__init__(client, prefix, since)
        self._closed = False

    def __aiter__(self) -> "AsyncWatch":
        return self

    async def __anext__(self) -> WatchEvent:
        event = await self._client._drive(_watch.next_event(self))
        if event is None:
            raise StopAsyncIteration
        return event

    async def open(self) -> Optional[int]:
        """Opens the stream now and reads until the server told its position; returns it."""
        return await self._client._drive(_watch.opening(self))

    async def aclose(self) -> None:
        """Ends the watch (idempotent): the stream is closed, the iteration stops."""
        self._closed = True
        resp = self._resp
        if resp is not None:
            try:
                await resp.aclose()
            except Exception:  # noqa: BLE001 - the reader may be closing it too
                pass

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # --- the IO the watch's flows ask for (:mod:`fenced._watch`) ---------------------------------

    def _is_closed(self) -> bool:
        return self._closed

    async def _open(self) -> None:
        path = self._st.path()
        c = self._client
        await c._drive(_watch.reopen(self, lambda i: _flow.io(c._open_stream, i, path, self._silence)))

    async def _take(self, resp: httpx.Response) -> bool:
        if self._closed:
            await resp.aclose()
            return False
        self._resp = resp
        self._chunks = resp.aiter_bytes()
        return True

    async def _next_chunk(self) -> Optional[bytes]:
        assert self._chunks is not None
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return None

    async def _pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _drop(self) -> None:
        resp, chunks = self._resp, self._chunks
        self._resp, self._chunks = None, None
        if chunks is not None:
            try:
                await chunks.aclose()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - a broken stream may fail to close
                pass
        if resp is not None:
            try:
                await resp.aclose()
            except Exception:  # noqa: BLE001
                pass


class _LostAsyncEvent(asyncio.Event):
    """``lock.lost`` for the async client: set by the guard's timer task at the deadline,
    and whose ``is_set()`` reads the clock too."""

    def __init__(self, state: LockState) -> None:
        super().__init__()
        self._state = state

    def is_set(self) -> bool:
        self._state.past_deadline()
        return super().is_set()


class _Acquire:
    """What ``AsyncClient.lock`` returns: awaitable (the lock) and an async context manager."""

    def __init__(self, client: AsyncClient, name: str, ttl: float, wait: float, margin: Optional[float],
                 cancel_on_loss: bool, holder: Optional[str] = None, names: Optional[List[str]] = None) -> None:
        self._args = (client, names[0] if names else name, ttl, wait, margin, cancel_on_loss, holder, names)
        self._lock: Optional[AsyncLock] = None

    async def _get(self) -> "AsyncLock":
        client, name, ttl, wait, margin, cancel_on_loss, holder, names = self._args
        state = await client._acquire(name, ttl, wait, margin, holder, names)
        return AsyncLock(client, state, cancel_on_loss)

    def __await__(self) -> Any:
        return self._get().__await__()

    async def __aenter__(self) -> "AsyncLock":
        self._lock = await self._get()
        self._lock._keeper.body_task = asyncio.current_task()
        return self._lock

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> Optional[bool]:
        lock = self._lock
        assert lock is not None
        keeper = lock._keeper
        keeper.body_task = None
        ours = keeper.cancelled_body  # we cancelled the body: the lock was lost
        task = asyncio.current_task()
        if ours:
            _uncancel(task)
        body_cancelled = exc_type is not None and issubclass(exc_type, asyncio.CancelledError)
        try:
            await lock.release()
        except LockLost as e:
            if exc_type is None or (ours and body_cancelled):
                raise e from None
        except asyncio.CancelledError:
            if not ours:
                raise
            # Our cancellation landed here, after the body had finished: the release was
            # cut short, so it goes on in the background, and the answer is the loss.
            _uncancel(task)
            lock._client._spawn(lock._client._release(lock._state), "releasing a lost lock")
            raise LockLost(lock._state.reason or LostReason.EXPIRED, lock.name) from None
        except FencedError as e:
            log.warning("releasing lock '%s' failed (its lease will expire): %s", lock.name, e)
        if ours and (exc_type is None or body_cancelled):
            raise LockLost(lock._state.reason or LostReason.EXPIRED, lock.name)
        return None


def _uncancel(task: Optional["asyncio.Task[Any]"]) -> None:
    """Takes back the one cancellation the guard asked for (Python 3.11+ counts them)."""
    if task is not None and sys.version_info >= (3, 11) and task.cancelling() > 0:
        task.uncancel()


class AsyncLock(GrantView):
    """``fenced.Lock``'s twin: ``token``, ``lease_id``, ``valid_until``, ``lost`` (an
    :class:`asyncio.Event`), ``check()``, ``await release()``. Dropped unreleased, it stops
    its tasks and is released in the background, best effort."""

    def __init__(self, client: AsyncClient, state: LockState, cancel_on_loss: bool) -> None:
        self._client = client
        self._state = state
        self.lost: asyncio.Event = _LostAsyncEvent(state)
        self._keeper = _AsyncKeeper(client, state, self.lost, cancel_on_loss)
        self._finalizer = weakref.finalize(self, self._keeper.abandon)

    async def release(self) -> None:
        if self._state.released:
            return
        self._finalizer.detach()
        await self._client._drive(_flow.release(self._client, self._state, self._keeper.stop))

    def __repr__(self) -> str:
        return f"<fenced.AsyncLock {self.name!r} token={self.token} lost={self._state.reason}>"

    def _pause_keepalive(self, paused: bool) -> None:
        self._keeper.paused = paused


class _AsyncKeeper:
    """The two tasks of a held lock: keepalive every TTL/3, and the timer that sets ``lost``
    at ``valid_until`` unless a keepalive moved it. Holds no reference to the lock."""

    def __init__(self, client: AsyncClient, state: LockState, lost: asyncio.Event, cancel_on_loss: bool) -> None:
        self.client = client
        self.state = state
        self.lost = lost
        self.cancel_on_loss = cancel_on_loss
        self.paused = False
        #: The task running the ``async with`` body, while it runs.
        self.body_task: Optional["asyncio.Task[Any]"] = None
        self.cancelled_body = False
        self.moved = asyncio.Event()
        state.on_lost = self._on_lost
        self.loop = asyncio.get_running_loop()
        self.tasks = [self.loop.create_task(self._timer()),
                      self.loop.create_task(client._drive(_flow.renewing(client, self)))]

    def stop(self) -> None:
        for t in self.tasks:
            t.cancel()

    def abandon(self) -> None:
        if self.state.released:
            return
        self.state.released = True

        def later() -> None:
            self.stop()
            self.client._spawn(self.client._release(self.state), "releasing a dropped lock")

        try:
            if not self.loop.is_closed():
                self.loop.call_soon_threadsafe(later)
        except RuntimeError:
            pass  # the loop is gone: the lease expires

    def _on_lost(self, reason: LostReason) -> None:
        asyncio.Event.set(self.lost)
        self.moved.set()
        task = self.body_task
        if self.cancel_on_loss and task is not None and not task.done():
            self.cancelled_body = True
            task.cancel()

    async def _timer(self) -> None:
        st = self.state
        while st.reason is None:
            left = st.valid_until - _core.now()
            if left <= 0:
                break
            self.moved.clear()
            try:
                await asyncio.wait_for(self.moved.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass
        st.past_deadline()

    # What the keepalive loop (:func:`_flow.renewing`) asks of its keeper; stop() cancels it.

    async def rest(self, seconds: float) -> bool:
        await asyncio.sleep(seconds)
        return False

    def is_stopped(self) -> bool:
        return False

    def wake(self) -> None:
        self.moved.set()


class AsyncStore:
    """``client.store`` of the async client."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def put(self, key: str, value: bytes, token: int, signature: Optional[str] = None) -> int:
        return await self._client._drive(_store.put(self._client, key, value, token, signature))

    async def get(self, key: str, token: Optional[int] = None, signature: Optional[str] = None) -> Optional[bytes]:
        return (await self.read(key, token, signature)).value

    async def read(self, key: str, token: Optional[int] = None, signature: Optional[str] = None) -> StoreRead:
        return await self._client._drive(_store.read(self._client, key, token, signature))
