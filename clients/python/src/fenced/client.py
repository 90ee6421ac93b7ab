"""The synchronous client: ``fenced.Client``, its lock guard and the built-in store.

Over ``httpx.Client``. The decisions are :mod:`fenced._flow`'s, shared with the asyncio
client; this module performs their IO. The guard's keepalive and its deadline timer run
in two daemon threads of their own; with several endpoints each attempt runs in a daemon
thread of its own, so that its member can be probed while it waits (failover.rs's rule,
see :class:`Client`).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import socket
import ssl
import threading
import time
import weakref
from types import TracebackType
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Type, TypeVar

import httpx

from . import _calls, _core, _flow, _store, _watch
from ._lockstate import GrantView, LockState, LostEvent
from ._store import StoreRead
from ._watch import WatchEvent
from .signing import GrantKeys
from .errors import FencedError, LockLost, LostReason, Transport, from_answer

log = logging.getLogger("fenced")
T = TypeVar("T")


class Client(_core.ClientBase):
    """A handle on one Fenced service: one endpoint, or the members of a cluster.

    ``endpoints``: a URL, a comma-separated string or a list of ``http(s)://host:port``;
    by default ``FENCED_ENDPOINT`` (commas allowed), else ``http://127.0.0.1:7400``.
    ``auth_token`` (default ``FENCED_AUTH_TOKEN``) is sent as ``Authorization: Bearer``;
    ``ca_file`` (default ``FENCED_CA_FILE``) is the PEM file an ``https://`` server must
    chain to. ``client_cert`` and ``client_key`` (PEM files; default ``FENCED_CLIENT_CERT``
    and ``FENCED_CLIENT_KEY``) are this client's certificate and key, presented to an
    ``https://`` server that asks for one (its ``client_ca``): the identity of its subject.
    The two go together (one alone is a :class:`fenced.ConfigError`, a ``ValueError``), are
    loaded here, and are not sent to an ``http://`` endpoint (no handshake there), as in
    the Rust client. ``request_timeout`` bounds a whole call, failovers included (a blocking
    acquire adds its wait). With several endpoints a call goes to the member that answered
    last and moves on when it is unreachable, answers ``not_leader``/``shutting_down``, or
    falls silent: a request unanswered for half of ``attempt_timeout`` (default
    ``FENCED_ATTEMPT_TIMEOUT``, else 750 ms) gets its member probed (``GET /readyz``,
    ``leader: true``), which must answer within the other half; rounds 100 ms apart.

    Before its first ``/v1`` call to an endpoint the client checks, once, that it speaks
    API v1: ``GET /openapi.json`` must be Fenced's document (``info.title``) and list
    every route this client calls; else :class:`fenced.UnsupportedServer`.
    ``check_server=False`` skips it.
    """

    def _open(self, headers: Dict[str, str], verify: Any) -> None:
        self._http = httpx.Client(headers=headers, verify=verify, trust_env=False, limits=_core.HTTP_LIMITS)
        self.store = Store(self)

    # --- public surface ------------------------------------------------------------------

    def lock(self, name: str, ttl: float = 10.0, wait: float = 30.0, *, margin: Optional[float] = None,
             holder: Optional[str] = None) -> "Lock":
        """Acquires ``name`` under an implicit lease of ``ttl`` seconds, waiting up to
        ``wait`` seconds in the server's FIFO queue (0: a try-lock). Raises
        :class:`fenced.LockHeld` when not granted in time. Use as ``with client.lock(..) as
        lock:`` (released on exit) or call :meth:`Lock.release`.

        ``holder`` names the holder (a host, a process, a job: ``"worker-7@host-b"``) in the
        lock's views (``holder`` of :meth:`lock_info` and :meth:`locks`, ``None`` when none
        was given) and in its ``granted`` event: 1 to 256 bytes of UTF-8 without control
        characters, never a secret. The same label is sent on every retry and failover of
        this call. The server judges it: a bad one is :class:`fenced.BadRequest` with code
        ``invalid_holder``, and nothing is granted."""
        return Lock(self, self._drive(_flow.acquire(self, name, ttl, wait, margin, holder)))

    def lock_all(self, names: List[str], ttl: float = 10.0, wait: float = 30.0, *, margin: Optional[float] = None,
                 holder: Optional[str] = None) -> "Lock":
        """Acquires every one of ``names`` together (``POST /v1/locks/acquire``), under one
        implicit lease of ``ttl`` seconds, or none of them within ``wait`` seconds
        (:class:`fenced.LockHeld`). Callers naming the same locks in any order never
        deadlock, and a waiter for several is not overtaken by later waiters for one of
        them. The lock's :attr:`Lock.tokens` has a token per name (sorted); ``name`` and
        ``token`` are the first's; its lost signal is the lease's, and :meth:`Lock.release`
        ends the lease, which releases every one. Retries and failover as :meth:`lock`."""
        wanted = _core.check_names(names)
        return Lock(self, self._drive(_flow.acquire(self, wanted[0], ttl, wait, margin, holder, wanted)))

    def try_lock(self, name: str, ttl: float = 10.0, *, margin: Optional[float] = None,
                 holder: Optional[str] = None) -> "Lock":
        """:meth:`lock` with no wait."""
        return self.lock(name, ttl, 0.0, margin=margin, holder=holder)

    def check(self, name: str, token: int) -> Tuple[bool, Optional[int]]:
        """Whether ``token`` is still the current grant of ``name`` (Chubby's
        CheckSequencer), and the current holder's token."""
        return self._run(_calls.check(name, token))

    def grant_keys(self) -> GrantKeys:
        """``GET /v1/keys``: the keys that verify this service's grant signatures, for a
        :class:`fenced.gates.Verified` gate (fetch once, or configure them). Raises
        :class:`fenced.NotFound` (``not_signing``) when the service does not sign."""
        return self._run(_calls.grant_keys())

    def lock_info(self, name: str) -> Dict[str, Any]:
        """``GET /v1/locks/{name}``: held, token, expires_in_ms, waiters, blocked_for_ms,
        holder (the holder's label, ``None`` when it gave none or the lock is free)."""
        return self._run(_calls.lock_info(name))

    def locks(self, prefix: Optional[str] = None) -> List[Dict[str, Any]]:
        """``GET /v1/locks?prefix=P``: the locks whose names start with ``prefix``."""
        return self._run(_calls.locks(prefix))

    def create_lease(self, ttl: float) -> str:
        """A lease of ``ttl`` seconds for callers that manage leases themselves (a lock makes
        its own): its id. Keep it alive with :meth:`keepalive`."""
        return self._run(_calls.create_lease(ttl))

    def keepalive(self, lease_id: str) -> float:
        """Keeps a lease alive once: its TTL in seconds. :class:`fenced.LeaseNotFound` once
        it is gone."""
        return self._keepalive(lease_id, self.request_timeout) / 1000.0

    def revoke_lease(self, lease_id: str) -> None:
        """Revokes a lease (its locks are released). A lease already gone is done."""
        self._run(_calls.revoke_lease(lease_id))

    def revoke_lock(self, name: str, token: Optional[int] = None) -> int:
        """An operator's release (``POST /v1/locks/{name}/revoke``): takes lock ``name``
        from whoever holds it, with ``token`` only while that token holds it; needs the
        ``admin`` right on the name when the server has identities. The next waiter is
        granted with a higher token; the old holder's guard becomes lost at its next
        keepalive (:attr:`LostReason.LEASE_NOT_FOUND`: its implicit lease ended with the
        lock). Returns the token taken. :class:`fenced.NotHolder` when nobody holds it, or
        another token does (``holder_token``).

        Without ``token`` the current holder's is read first (``GET /v1/locks/{name}``) and
        named, so that a call retried on another member (its first answer lost) can never
        take the lock from the holder granted after the revoke."""
        return self._drive(_flow.revoke_lock(self, name, token))

    def watch(self, prefix: str = "", since: Optional[int] = None) -> "Watch":
        """The events of lock names and store keys that start with ``prefix`` (``""``: all),
        an iterator of :class:`fenced.WatchEvent`: from now (``since`` None; the stream
        opens at the first ``next`` or at :meth:`Watch.open`), or exactly after index
        ``since`` (a :attr:`Watch.position` an earlier watch reached). A broken stream
        (reset, ended, or no byte for 45 s) is reopened on any member from the position,
        so nothing is missed or repeated; after 30 s without a stream ``next`` raises
        :class:`fenced.Unavailable` (calling it again goes on trying). When events after
        the position are no longer held, or the stream fell behind, it raises
        :class:`fenced.Missed`: list the locks again and start a new watch."""
        return Watch(self, prefix, since)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- the calls the guard and the tests make ---------------------------------------------

    def _keepalive(self, lease_id: str, timeout: float) -> int:
        """One keepalive within ``timeout``, failovers included: the lease's TTL in ms."""
        return self._drive(_flow.keepalive(self, lease_id, timeout))

    def _acquire_on(self, i: int, name: str, lease_id: str, ttl_ms: int, wait_ms: int,
                    timeout: float, holder: Optional[str] = None, names: Optional[List[str]] = None) -> Dict[str, Any]:
        """One acquire on member ``i`` (:func:`_flow.acquire_on`)."""
        return self._drive(_flow.acquire_on(self, i, name, lease_id, ttl_ms, wait_ms, timeout, holder, names))

    def _release(self, state: LockState) -> None:
        """Gives the lock back (:func:`_calls.release`): its implicit lease ended."""
        self._run(_calls.release(state.lease_id))

    def _run(self, call: _calls.Call[T]) -> T:
        return self._drive(_flow.run(self, call))

    # --- the driver: the flows' requests, performed with threads and httpx.Client ------------

    def _drive(self, flow: _flow.Flow[T]) -> T:
        return _flow.drive(flow, self._do)

    def _do(self, op: _flow.Op) -> Any:
        """Performs one request of a flow (:mod:`fenced._flow`)."""
        if isinstance(op, _flow.Send):
            return self._send_once(*op)
        if isinstance(op, _flow.Sleep):
            return time.sleep(op.seconds)
        if isinstance(op, _flow.Spawn):
            flow = op.flow
            return self._in_thread(lambda: self._drive(flow))
        if isinstance(op, _flow.Wait):
            return cf.wait(op.tasks, op.timeout, cf.FIRST_COMPLETED).done
        if isinstance(op, _flow.BestEffort):
            return self._drive(op.flow)
        return op.fn(*op.args)

    @staticmethod
    def _in_thread(fn: Callable[[], T]) -> "cf.Future[T]":
        """Runs ``fn()`` in a daemon thread of its own: a request left on a silent member
        must not hold up the caller, nor the interpreter's exit. It cannot be cancelled: its
        request ends by its own time-out."""
        fut: "cf.Future[T]" = cf.Future()
        fut.set_running_or_notify_cancel()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                fut.set_exception(e)

        threading.Thread(target=run, name="fenced-call", daemon=True).start()
        return fut

    def _bounded(self, fn: Callable[[], T], what: str) -> T:
        """``fn()`` in a thread of its own, waited for the request time-out at most."""
        try:
            return self._in_thread(fn).result(timeout=self.request_timeout)
        except cf.TimeoutError:
            raise Transport(f"{what}: no answer within {int(self.request_timeout * 1000)} ms") from None

    def _send_once(self, i: int, method: str, path: str, body: Optional[bytes], headers: Dict[str, str],
                   timeout: float) -> _core.Reply:
        url = self._members.endpoints[i] + path
        t = self._request_timeouts(timeout)
        try:
            r = self._http.request(method, url, content=body, headers=headers, timeout=t)
        except (httpx.HTTPError, ssl.SSLError) as e:
            # ssl.SSLError as in aio.py, where httpcore lets one through unwrapped.
            raise _core.http_failure(url, timeout, e) from e
        return _core.Reply(r.status_code, r.headers, r.content)

    def _open_stream(self, i: int, path: str, silence: float) -> httpx.Response:
        """``GET path`` on member ``i``, after its API check, answered with a stream (the
        event stream): the response once its head came, its body unread. Between two
        bytes of it at most ``silence`` passes (httpx's read time-out). An error answer is
        read whole, and raised."""
        self._drive(_flow.check_server(self, i))
        url = self._members.endpoints[i] + path
        t = self._stream_timeouts(silence)
        req = self._http.build_request("GET", url, headers={"accept": "text/event-stream"}, timeout=t)
        try:
            r = self._http.send(req, stream=True)
        except (httpx.HTTPError, ssl.SSLError) as e:
            raise _core.http_failure(url, silence, e) from e
        if r.status_code == 200:
            return r
        try:
            body = r.read()
        except (httpx.HTTPError, ssl.SSLError):
            body = b""
        finally:
            r.close()
        raise from_answer(r.status_code, body)


class Lock(GrantView):
    """A held lock: the grant, a background keepalive every TTL/3, and an honest lost signal.

    ``valid_until`` (on :func:`time.monotonic`) is the send time of the last successful
    acquire or keepalive + TTL - margin. ``lost`` is a :class:`threading.Event` set no later
    than that deadline when nothing succeeded, at once when the server refuses a keepalive
    (404 ``lease_not_found``, 401/403), and never cleared. ``check()`` raises
    :class:`fenced.LockLost` once the lock can no longer be trusted. The guard tells you when
    to stop; it cannot stop a write already on the wire: pass :attr:`token` to the resource.

    A lock dropped without :meth:`release` (its last reference gone) stops its keepalive and
    is released in the background, best effort, as the Rust guard's ``Drop`` does.
    """

    def __init__(self, client: Client, state: LockState) -> None:
        self._client = client
        self._state = state
        self.lost: threading.Event = LostEvent(state)
        self._keeper = _Keeper(client, state, self.lost)
        # The keeper's threads hold the state, never this object: when it is dropped
        # unreleased, the finalizer stops them and gives the lock back.
        self._finalizer = weakref.finalize(self, self._keeper.abandon)

    # --- the grant is GrantView's; giving it back ---------------------------------------------

    def release(self) -> None:
        """Stops the keepalive, releases the lock and deletes its lease. Raises
        :class:`fenced.LockLost` if the lock had been lost before (the work done under it
        may not have been exclusive), after releasing what is left."""
        if self._state.released:
            return
        self._finalizer.detach()
        self._client._drive(_flow.release(self._client, self._state, self._keeper.stop))

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        try:
            self.release()
        except LockLost:
            if exc_type is None:
                raise
        except FencedError as e:
            # The work finished under a valid lock; a failed release only delays the next
            # holder until the lease expires.
            log.warning("releasing lock '%s' failed (its lease will expire): %s", self.name, e)

    def __repr__(self) -> str:
        return f"<fenced.Lock {self.name!r} token={self.token} lost={self._state.reason}>"

    def _pause_keepalive(self, paused: bool) -> None:
        """Test hook: stops (or resumes) sending keepalives, as a long pause of this process
        would. The deadline timer keeps running, which is the point."""
        self._keeper.paused = paused


class _Keeper:
    """The two threads of a held lock: the keepalive every TTL/3, and the timer that sets
    ``lost`` at ``valid_until`` unless a keepalive moved it (a keepalive can hang; the timer
    cannot)."""

    def __init__(self, client: Client, state: LockState, lost: threading.Event) -> None:
        self.client = client
        self.state = state
        self.lost = lost
        self.paused = False
        self.cond = threading.Condition()
        self.stopped = threading.Event()
        state.on_lost = self._on_lost
        self.threads = [
            threading.Thread(target=self._timer, name=f"fenced-timer:{state.name}", daemon=True),
            threading.Thread(target=self._keepalive_loop, name=f"fenced-keepalive:{state.name}", daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _on_lost(self, reason: LostReason) -> None:
        threading.Event.set(self.lost)
        with self.cond:
            self.cond.notify_all()

    def stop(self) -> None:
        self.stopped.set()
        with self.cond:
            self.cond.notify_all()
        me = threading.current_thread()
        for t in self.threads:
            if t is not me:
                t.join(timeout=0.2)  # a keepalive in flight ends by its own time-out

    def abandon(self) -> None:
        """The lock was dropped unreleased: stop, and release in the background."""
        if self.state.released:
            return
        self.stopped.set()
        with self.cond:
            self.cond.notify_all()
        self.state.released = True

        def release() -> None:
            try:
                self.client._release(self.state)
            except Exception as e:  # noqa: BLE001 - best effort: the lease expires anyway
                log.debug("releasing the dropped lock '%s': %s", self.state.name, e)

        threading.Thread(target=release, name=f"fenced-release:{self.state.name}", daemon=True).start()

    # What the keepalive loop (:func:`_flow.renewing`) asks of its keeper.

    def rest(self, seconds: float) -> bool:
        return self.stopped.wait(seconds)

    def is_stopped(self) -> bool:
        return self.stopped.is_set()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def _timer(self) -> None:
        st = self.state
        with self.cond:
            while not self.stopped.is_set() and st.reason is None:
                left = st.valid_until - _core.now()
                if left <= 0:
                    break
                self.cond.wait(left)
        if not self.stopped.is_set():
            st.past_deadline()

    def _keepalive_loop(self) -> None:
        self.client._drive(_flow.renewing(self.client, self))


class Store:
    """The server's built-in fenced key-value store (``/v1/store``): ``client.store``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def put(self, key: str, value: bytes, token: int, signature: Optional[str] = None) -> int:
        """A fenced write: ``PUT /v1/store/{key}`` with ``Fencing-Token``. Returns the key's
        mark after it. Raises :class:`fenced.StaleToken` (``token``, ``highest_seen``) when a
        newer holder got there, :class:`fenced.TokenNotIssued` for a token never issued.

        Retried on another member after one fell silent, a write refused as stale is
        raised as :class:`fenced.Unavailable`: the first attempt may have been applied."""
        return self._client._drive(_store.put(self._client, key, value, token, signature))

    def get(self, key: str, token: Optional[int] = None, signature: Optional[str] = None) -> Optional[bytes]:
        """The value under ``key`` (``None`` if absent); with ``token`` a fenced read, which
        advances the mark and raises :class:`fenced.StaleToken` below it."""
        return self.read(key, token, signature).value

    def read(self, key: str, token: Optional[int] = None, signature: Optional[str] = None) -> StoreRead:
        """:meth:`get` with the key's mark after the read."""
        return self._client._drive(_store.read(self._client, key, token, signature))


class Watch(_watch.WatchBase[Client]):
    """A watch of the event stream (:meth:`Client.watch`): ``for event in watch:``.

    Each item is a :class:`fenced.WatchEvent`. :attr:`position` is the last position the
    server told (an event's index, or a position marker's): a new watch ``since`` it
    misses nothing and repeats nothing. ``close()`` (also on leaving ``with watch:``) ends
    the iteration, from any thread: a ``next`` blocked reading stops at once. Iterate it
    from one thread at a time."""

    _resp: Optional[httpx.Response]
    _chunks: Optional[Iterator[bytes]]

    def __init__(self, client: Client, prefix: str, since: Optional[int]) -> None:
        super().__init__(client, prefix, since)
        self._mu = threading.Lock()
        self._closed = threading.Event()

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> WatchEvent:
        event = self._client._drive(_watch.next_event(self))
        if event is None:
            raise StopIteration
        return event

    def open(self) -> Optional[int]:
        """Opens the stream now, if it is not open, and reads until the server told its
        position (the marker it sends first): a watch from now starts here rather than at
        the first ``next``. Returns :attr:`position`."""
        return self._client._drive(_watch.opening(self))

    def close(self) -> None:
        """Ends the watch (idempotent): the stream is closed, ``next`` stops iterating."""
        self._closed.set()
        with self._mu:
            resp = self._resp
        if resp is not None:
            _shut(resp)
            try:
                resp.close()
            except Exception:  # noqa: BLE001 - the reader may be closing it too
                pass

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- the IO the watch's flows ask for (:mod:`fenced._watch`) ---------------------------------

    def _is_closed(self) -> bool:
        return self._closed.is_set()

    def _open(self) -> None:
        path = self._st.path()
        c = self._client
        opening = _Opening()

        def open_on(i: int) -> httpx.Response:
            r = c._open_stream(i, path, self._silence)
            with opening.mu:
                if opening.done:  # the caller gave up on this member meanwhile
                    r.close()
                    raise Transport(f"{c._members.endpoints[i]}{path}: answered after the watch moved on")
                opening.responses.append(r)
            return r

        def open_one(i: int) -> _flow.Flow[httpx.Response]:
            return _flow.io(c._bounded, lambda: open_on(i), f"{c._members.endpoints[i]}{path}")

        try:
            c._drive(_watch.reopen(self, open_one))
        finally:
            with opening.mu:
                opening.done = True
                late = [r for r in opening.responses if r is not self._resp]
            for r in late:
                r.close()

    def _take(self, resp: httpx.Response) -> bool:
        with self._mu:
            if self._closed.is_set():
                resp.close()
                return False
            self._resp = resp
            self._chunks = resp.iter_bytes()
        return True

    def _next_chunk(self) -> Optional[bytes]:
        assert self._chunks is not None
        return next(self._chunks, None)

    def _pause(self, seconds: float) -> None:
        self._closed.wait(seconds)

    def _drop(self) -> None:
        with self._mu:
            resp, self._resp, self._chunks = self._resp, None, None
        if resp is not None:
            try:
                resp.close()
            except Exception:  # noqa: BLE001 - a broken stream may fail to close
                pass


class _Opening:
    """The responses of one reopen's attempts: those the call did not take, and those that
    come after it gave up on their member, are closed."""

    def __init__(self) -> None:
        self.mu = threading.Lock()
        self.done = False
        self.responses: List[httpx.Response] = []


def _shut(resp: httpx.Response) -> None:
    """Shuts the response's socket down, so that a read blocked on it in another thread
    returns (closing a socket does not wake its reader)."""
    try:
        stream = resp.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except Exception:  # noqa: BLE001 - best effort: closed already, or not a socket
        pass

