"""The synchronous client: ``fenced.Client``, its lock guard and the built-in store.

Over ``httpx.Client``. The guard's keepalive and its deadline timer run in two daemon
threads of their own; several endpoints use a small thread pool so that a member can be
probed while a request waits on it (failover.rs's rule, see :class:`Client`).
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

from . import _calls, _core, _store, _watch
from ._lockstate import GrantView, LockState, LostEvent, Renewal
from ._store import StoreRead
from ._watch import WatchEvent
from .signing import GrantKeys
from .errors import (
    FencedError,
    LockLost,
    LostReason,
    Missed,
    StaleToken,
    Transport,
    Unavailable,
    from_answer,
)

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
        self._checked_mu = threading.Lock()
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
        state = self._acquire(name, ttl, wait, margin, holder)
        return Lock(self, state)

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
        state = self._acquire(wanted[0], ttl, wait, margin, holder, wanted)
        return Lock(self, state)

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
        _core.check_name(name)
        if token is None:
            token = _calls.held_token(name, self.lock_info(name))
        return self._run(_calls.revoke_lock(name, token))

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

    # --- acquire ---------------------------------------------------------------------------

    def _acquire(self, name: str, ttl: float, wait: float, margin: Optional[float],
                 holder: Optional[str] = None, names: Optional[List[str]] = None) -> LockState:
        ttl_ms, wait_ms = _core.check_acquire(name, ttl, wait, margin, holder)
        run = _core.Acquiring(wait_ms, self.request_timeout, len(self._members.endpoints))

        def attempt(i: int) -> Dict[str, Any]:
            wait_left = run.wait_left()
            return self._acquire_on(i, name, run.lease, ttl_ms, _core.ms(wait_left), self.request_timeout + wait_left,
                                    holder, names)

        try:
            while True:
                sent = _core.now()
                try:
                    grant = self._call(attempt, run.deadline)
                except FencedError as e:
                    pause = run.failed(e, sent)
                    if pause is None:
                        raise
                    time.sleep(pause)
                    continue
                run.granted(sent)
                break
        finally:
            if run.give_back:
                self._revoke_quietly(run.lease)
        assert run.sent_at is not None
        try:
            state = LockState.from_grant(name, grant, ttl_ms, margin, run.sent_at, names)
            if state.renew_first(run.started):
                renewed = _core.now()
                try:
                    state.extend(renewed, self._keepalive(state.lease_id, self.request_timeout) / 1000.0)
                except FencedError as e:
                    state.first_renewal_failed(e)
            return state
        except BaseException:
            self._revoke_quietly(run.lease)  # a grant this call cannot hand out is given back
            raise

    def _acquire_on(self, i: int, name: str, lease_id: str, ttl_ms: int, wait_ms: int,
                    timeout: float, holder: Optional[str] = None, names: Optional[List[str]] = None) -> Dict[str, Any]:
        """One acquire on member ``i`` (:func:`_core.acquire_request`)."""
        path, body = _core.acquire_request(name, lease_id, ttl_ms, wait_ms, holder, names)
        return _calls.acquire_answer(self._send(i, "POST", path, body, _calls.JSON_HEADERS, timeout), name)

    def _revoke_quietly(self, lease_id: str) -> None:
        """Best effort: a grant made for a caller who left is given back at once."""
        try:
            deadline = _core.now() + min(self.request_timeout, _calls.GIVE_BACK_TIMEOUT)
            self._run(_calls.revoke_lease(lease_id), deadline, _calls.GIVE_BACK_TIMEOUT)
        except FencedError as e:
            log.debug("revoking the abandoned implicit lease: %s", e)

    # --- lease and lock calls the guard makes ----------------------------------------------

    def _keepalive(self, lease_id: str, timeout: float) -> int:
        """One keepalive within ``timeout``, failovers included: the lease's TTL in ms."""
        call = _calls.keepalive(lease_id)
        deadline = _core.now() + timeout
        return call.read(self._call(lambda i: self._json(i, call, max(0.001, deadline - _core.now())), deadline))

    def _release(self, state: LockState) -> None:
        """Gives the lock back (:func:`_calls.release`): its implicit lease ended."""
        self._run(_calls.release(state.lease_id))

    # --- the plumbing: members, attempts, one request ---------------------------------------

    def _run(self, call: _calls.Call[T], deadline: Optional[float] = None, timeout: Optional[float] = None) -> T:
        """Makes ``call`` over the members (each attempt within ``timeout``, by default the
        request time-out): what it reads of the answer."""
        try:
            return call.read(self._call(lambda i: self._json(i, call, timeout), deadline))
        except call.done_if:
            return call.read(None)

    def _json(self, i: int, call: _calls.Call[Any], timeout: Optional[float] = None) -> Any:
        """One attempt of ``call`` on member ``i``: the JSON of its answer."""
        data, headers = call.encoded()
        return _calls.answer(self._send(i, call.method, call.path, data, headers, timeout or self.request_timeout))

    def _call(self, fn: Callable[[int], T], deadline: Optional[float] = None) -> T:
        return self._call_tried(fn, deadline)[0]

    def _call_tried(self, fn: Callable[[int], T], deadline: Optional[float] = None) -> Tuple[T, bool]:
        """Runs ``fn(member)`` on the current member and on the next ones while the outcome
        moves on (or the member falls silent), until ``deadline``. Returns the value and
        whether an earlier attempt may have reached a member (then its effect is unknown)."""
        m = self._members
        n = len(m.endpoints)
        if n == 1:
            return fn(0), False
        if deadline is None:
            deadline = _core.now() + self.request_timeout
        walk = _core.Walk(m, deadline)
        for i in walk.members():
            if i is None:
                time.sleep(_core.ROUND_PAUSE)
                continue
            kind, value, exc = self._attempt(i, fn, deadline)
            if walk.attempted(i, kind, exc):
                return value, walk.uncertain  # type: ignore[return-value]
        raise walk.failure()

    @staticmethod
    def _in_thread(fn: Callable[[int], T], i: int) -> "cf.Future[T]":
        """Runs ``fn(i)`` in a daemon thread of its own: a request left on a silent member
        must not hold up the caller, nor the interpreter's exit."""
        fut: "cf.Future[T]" = cf.Future()

        def run() -> None:
            try:
                fut.set_result(fn(i))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                fut.set_exception(e)

        threading.Thread(target=run, name="fenced-call", daemon=True).start()
        return fut

    def _attempt(self, i: int, fn: Callable[[int], T], deadline: float) -> Tuple[str, Optional[T], Optional[FencedError]]:
        """Waits for ``fn(i)`` while member ``i`` shows it is alive (failover.rs)."""
        m = self._members
        half = m.attempt_timeout / 2
        started = _core.now()
        fut = self._in_thread(fn, i)
        while True:
            left = deadline - _core.now()
            try:
                value = fut.result(timeout=max(0.0, min(half, left)))
                return "answered", value, None
            except cf.TimeoutError:
                pass
            except FencedError as e:
                return "answered", None, e
            if _core.now() >= deadline:
                return "timedout", None, None
            if m.found_silent_since(i, started):
                return "silent", None, None
            if m.answered_within(i, half):
                continue
            probe_deadline = _core.now() + half
            alive = self._probe(i, half)
            if fut.done():
                continue  # answered meanwhile: read it at the top
            if not alive:
                m.mark_silent(i)
                return "silent", None, None
            m.mark_answered(i)
            # The probe's own time is part of the wait for the request.
            rest = probe_deadline - _core.now()
            if rest > 0 and not fut.done():
                try:
                    value = fut.result(timeout=min(rest, max(0.0, deadline - _core.now())))
                    return "answered", value, None
                except cf.TimeoutError:
                    pass
                except FencedError as e:
                    return "answered", None, e

    def _probe(self, i: int, within: float) -> bool:
        """Whether member ``i`` answers ``GET /readyz`` with ``leader: true`` within ``within``."""
        try:
            r = self._http.get(self._members.endpoints[i] + "/readyz", timeout=httpx.Timeout(within))
            return r.status_code == 200 and r.json().get("leader") is True
        except Exception:  # noqa: BLE001 - any failure is "not alive"
            return False

    def _send(self, i: int, method: str, path: str, body: Optional[bytes], headers: Dict[str, str],
              timeout: float) -> _core.Reply:
        """One request to member ``i``, after its API check. A connection that could not be
        opened is retried (the request never left) with one endpoint; any other failure is
        :class:`Transport` with ``sent=True``, for the caller to decide."""
        if self._check_server and path.startswith("/v1/") and i not in self._checked:
            self._check(i)
        retry = _core.Reconnect(len(self._members.endpoints))
        while True:
            try:
                return self._send_once(i, method, path, body, headers, timeout)
            except Transport as e:
                pause = retry.pause(e)
                if pause is None:
                    raise
                time.sleep(pause)

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
        if self._check_server and i not in self._checked:
            self._check(i)
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

    def _check(self, i: int) -> None:
        with self._checked_mu:
            if i in self._checked:
                return
        r = self._send_once(i, "GET", "/openapi.json", None, {}, self.request_timeout)
        version = _core.check_api(self._members.endpoints[i], r.status, r.body)
        with self._checked_mu:
            self._checked[i] = version


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
        reason = self._state.lost_by_now()
        self._keeper.stop()
        self._state.released = True
        try:
            self._client._release(self._state)
        except FencedError:
            if reason is None:
                raise
        if reason is not None:
            raise LockLost(reason, self.name)

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
        st = self.state
        ka = Renewal(st)
        while not self.stopped.wait(ka.pause()):
            if st.past_deadline():
                return
            if ka.skipped(self.paused):
                continue
            sent = _core.now()
            try:
                ttl_ms = self.client._keepalive(st.lease_id, ka.timeout(sent, self.client.request_timeout))
            except FencedError as e:
                if ka.failed(e, self.stopped.is_set()):
                    return
                continue
            except Exception as e:  # noqa: BLE001 - a bug must not leave the lock looking valid
                log.error("keepalive of lock '%s' crashed: %r", st.name, e)
                ka.retry_later()
                continue
            if self.stopped.is_set() or ka.too_late():
                return
            if ka.renewed(sent, ttl_ms):
                with self.cond:
                    self.cond.notify_all()


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
        path, body, headers = _store.put_request(key, value, token, signature)
        c = self._client
        try:
            mark, _ = c._call_tried(lambda i: _store.put_answer(c._send(i, "PUT", path, body, headers,
                                                                        c.request_timeout), token))
            return mark
        except StaleToken as e:
            unknown = _store.outcome_unknown(e, token)
            if unknown is None:
                raise
            raise unknown from e

    def get(self, key: str, token: Optional[int] = None, signature: Optional[str] = None) -> Optional[bytes]:
        """The value under ``key`` (``None`` if absent); with ``token`` a fenced read, which
        advances the mark and raises :class:`fenced.StaleToken` below it."""
        return self.read(key, token, signature).value

    def read(self, key: str, token: Optional[int] = None, signature: Optional[str] = None) -> StoreRead:
        """:meth:`get` with the key's mark after the read."""
        path, headers = _store.read_request(key, token, signature)
        c = self._client
        return c._call(lambda i: _store.read_answer(c._send(i, "GET", path, None, headers, c.request_timeout)))


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
        while True:
            event = self._step()
            if event is not None:
                return event

    def open(self) -> Optional[int]:
        """Opens the stream now, if it is not open, and reads until the server told its
        position (the marker it sends first): a watch from now starts here rather than at
        the first ``next``. Returns :attr:`position`."""
        try:
            while not self._st.ready(self._chunks is not None):
                event = self._step(pending=False)  # reads more (the buffer was drained)
                if event is not None:
                    self._st.pending.append(event)
        except StopIteration:
            pass
        return self._st.position

    def _step(self, pending: bool = True) -> Optional[WatchEvent]:
        """One step: an event of the bytes received, else (re)opening the stream or reading
        more of it; ``None`` when there is no event yet."""
        if self._closed.is_set():
            raise StopIteration
        event = self._st.take(pending)
        if event is not None:
            return event
        if self._chunks is None:
            try:
                self._open()
            except Unavailable:
                if self._closed.is_set():
                    raise StopIteration from None
                pause = self._reopening.failed()
                if pause is None:
                    raise  # a new next() tries again
                self._closed.wait(pause)
            return None
        chunk = self._read()
        if chunk is None or not self._st.feed(chunk):
            self._drop()
            self._reopening.broke()
        else:
            self._reopening.flowing()
        return None

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

        resp: Optional[httpx.Response] = None
        try:
            if len(c._members.endpoints) == 1:
                fut = c._in_thread(open_on, 0)
                try:
                    resp = fut.result(timeout=c.request_timeout)
                except cf.TimeoutError:
                    raise Transport(f"{c._members.endpoints[0]}{path}: no answer within "
                                    f"{int(c.request_timeout * 1000)} ms") from None
            else:
                resp = c._call(open_on, _core.now() + c.request_timeout)
        except Missed as e:
            resp = self._open_elsewhere(open_on, e)
        finally:
            with opening.mu:
                opening.done = True
                late = [r for r in opening.responses if r is not resp]
            for r in late:
                r.close()
        assert resp is not None
        with self._mu:
            if self._closed.is_set():
                resp.close()
                return
            self._resp = resp
            self._chunks = resp.iter_bytes()
        self._st.opened()
        log.debug("watch of '%s' opened on %s after position %s", self.prefix, resp.url, self.position)

    def _open_elsewhere(self, open_on: Callable[[int], httpx.Response], missed: Missed) -> httpx.Response:
        """After the member that answered said ``compacted`` (a member restarted from a
        snapshot holds its events only from there on): each other member once, in turn,
        for one that still holds the events after the position. Indexes are the same on
        every member, so the stream resumes exactly where it was. :class:`Missed` only
        when none does, or none could be asked."""
        c = self._client
        for i in c._members.others():
            try:
                resp = c._in_thread(open_on, i).result(timeout=c.request_timeout)
            except Exception as e:  # noqa: BLE001 - any answer but the stream: the next member
                self._not_resumed(c._members.endpoints[i], e)
                continue
            c._members.set_current(i)
            return resp
        raise self._st.refused(missed) from None

    def _read(self) -> Optional[bytes]:
        """The next bytes of the stream; ``None`` when it broke, ended or fell silent."""
        assert self._chunks is not None
        try:
            return next(self._chunks)
        except StopIteration:
            return None
        except (httpx.HTTPError, httpx.StreamError, OSError, ssl.SSLError) as e:
            log.debug("the event stream of watch '%s' broke at position %s: %r", self.prefix, self.position, e)
            return None
        except Exception:  # noqa: BLE001 - a close from another thread can break the read any way
            if self._closed.is_set():
                return None
            raise

    def _drop(self) -> None:
        with self._mu:
            resp, self._resp, self._chunks = self._resp, None, None
        if resp is not None:
            try:
                resp.close()
            except Exception:  # noqa: BLE001 - a broken stream may fail to close
                pass
        self._st.broke()


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

