"""The decision logic of the sync and the asyncio client, written once as sans-IO flows.

A flow is a generator that yields a request for IO (send this HTTP request, sleep this
long, run that flow beside this one, wait for it...) and is sent its result; a failure of
the IO is thrown into it where it yielded, so that each ``try``/``except`` of the rules
stands here once. ``Client`` performs the requests with threads, ``httpx.Client`` and
``time.sleep`` (:func:`drive`); ``AsyncClient`` with tasks, ``httpx.AsyncClient`` and
``asyncio.sleep`` (:func:`adrive`). The clock (:func:`_core.now`) is read directly.
"""

from __future__ import annotations

import logging
from typing import (Any, Awaitable, Callable, Dict, Generator, List, NamedTuple, Optional, Protocol, Tuple,
                    TypeVar, Union, cast)

from . import _calls, _core
from ._core import ClientBase, now
from ._lockstate import LockState, Renewal
from .errors import FencedError, LockLost, Transport

log = logging.getLogger("fenced")
T = TypeVar("T")

# --- the requests a flow yields, and the drivers that perform them ------------------------


class Send(NamedTuple):
    """An HTTP request to a member: its :class:`_core.Reply`, or :class:`Transport` raised."""

    member: int
    method: str
    path: str
    body: Optional[bytes]
    headers: Dict[str, str]
    timeout: float


class Sleep(NamedTuple):
    seconds: float


class Spawn(NamedTuple):
    """Runs ``flow`` beside the caller (in a thread, a task): a future of its value, whose
    ``result()`` and ``cancel()`` (a thread cannot be stopped) the caller calls itself."""

    flow: "Flow[Any]"


class Wait(NamedTuple):
    """Waits up to ``timeout`` for one of the futures ``tasks``: the set of those done."""

    tasks: Tuple[Any, ...]
    timeout: float


class BestEffort(NamedTuple):
    """A flow whose failure only matters to the log: the sync client runs it before going
    on, the asyncio client in a task of its own (its caller may be ending by cancellation)."""

    flow: "Flow[Any]"
    what: str


class Io(NamedTuple):
    """IO of the caller's own objects (a watch's stream, a guard's pause): ``fn(*args)``,
    awaited by the asyncio client."""

    fn: Callable[..., Any]
    args: Tuple[Any, ...]


Op = Union[Send, Sleep, Spawn, Wait, BestEffort, Io]
Flow = Generator[Op, Any, T]


def io(fn: Callable[..., Any], *args: Any) -> Flow[Any]:
    """The flow of one :class:`Io` request: what ``fn(*args)`` returns."""
    return (yield Io(fn, args))


async def adrive(flow: Flow[T], do: Callable[[Op], Awaitable[Any]]) -> T:
    """Runs ``flow`` to its end, awaiting ``do`` to perform each request: its value. A
    failure, a cancellation too, is thrown into the flow (its ``finally`` blocks run)."""
    result: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            op = flow.send(result) if error is None else flow.throw(error)
        except StopIteration as end:
            return cast(T, end.value)
        try:
            result, error = await do(op), None
        except BaseException as e:  # noqa: BLE001 - thrown into the flow, which decides
            result, error = None, e


def drive(flow: Flow[T], do: Callable[[Op], Any]) -> T:
    """:func:`adrive` for the sync client, whose ``do`` returns the result itself: nothing
    in the loop then suspends, so its coroutine ends at the first step, with no event loop."""
    async def at_once(op: Op) -> Any:
        return do(op)

    steps = adrive(flow, at_once)
    try:
        steps.send(None)
    except StopIteration as end:
        return cast(T, end.value)
    steps.close()
    raise AssertionError("a sync driver suspended")


# --- one request, and a call over the members (failover.rs) ----------------------------


def check_server(c: ClientBase, i: int) -> Flow[None]:
    """Once per member, before its first ``/v1`` call: ``GET /openapi.json`` must be
    Fenced's API v1 (:func:`_core.check_api`); ``check_server=False`` skips it."""
    if not c._check_server or i in c._checked:
        return
    r = yield Send(i, "GET", "/openapi.json", None, {}, c.request_timeout)
    c._checked[i] = _core.check_api(c._members.endpoints[i], r.status, r.body)


def send(c: ClientBase, i: int, method: str, path: str, body: Optional[bytes], headers: Dict[str, str],
         timeout: float) -> Flow[_core.Reply]:
    """One request to member ``i``, after its API check. A connection that could not be
    opened is retried (the request never left) with one endpoint (:class:`_core.Reconnect`);
    any other failure is :class:`Transport` with ``sent=True``, for the caller to decide."""
    if path.startswith("/v1/"):
        yield from check_server(c, i)
    retry = _core.Reconnect(len(c._members.endpoints))
    while True:
        try:
            reply: _core.Reply = yield Send(i, method, path, body, headers, timeout)
            return reply
        except Transport as e:
            pause = retry.pause(e)
            if pause is None:
                raise
            yield Sleep(pause)


def ask(c: ClientBase, i: int, method: str, path: str, body: Optional[bytes], headers: Dict[str, str],
        read: Callable[[_core.Reply], T], timeout: Optional[float] = None) -> Flow[T]:
    """:func:`send` within ``timeout`` (by default the request time-out), then ``read``
    of the answer."""
    return read((yield from send(c, i, method, path, body, headers, timeout or c.request_timeout)))


def over(c: ClientBase, fn: Callable[[int], Flow[T]], deadline: Optional[float] = None) -> Flow[Tuple[T, bool]]:
    """Runs ``fn(member)`` on the current member and on the next ones while the outcome
    moves on (or the member falls silent), until ``deadline``. Returns the value and
    whether an earlier attempt may have reached a member (then its effect is unknown)."""
    m = c._members
    if len(m.endpoints) == 1:
        return (yield from fn(0)), False
    deadline = now() + c.request_timeout if deadline is None else deadline
    walk = _core.Walk(m, deadline)
    for i in walk.members():
        if i is None:
            yield Sleep(_core.ROUND_PAUSE)
            continue
        kind, value, exc = yield from _attempt(c, i, fn, deadline)
        if walk.attempted(i, kind, exc):
            return value, walk.uncertain
    raise walk.failure()


Outcome = Tuple[str, Any, Optional[FencedError]]


def _attempt(c: ClientBase, i: int, fn: Callable[[int], Flow[Any]], deadline: float) -> Flow[Outcome]:
    """Waits for ``fn(i)``, run beside, while member ``i`` shows it is alive: ``answered``
    (the value, or its :class:`FencedError`), ``silent`` or ``timedout`` (failover.rs)."""
    m = c._members
    half = m.attempt_timeout / 2
    started = now()
    task = yield Spawn(fn(i))
    try:
        while True:
            if (yield Wait((task,), max(0.0, min(half, deadline - now())))):
                return _outcome(task)
            if now() >= deadline:
                return "timedout", None, None
            if m.found_silent_since(i, started):
                return "silent", None, None
            if m.answered_within(i, half):
                continue
            alive = yield from _probe_beside(c, i, task, deadline)
            if alive is None:
                return _outcome(task)
            if not alive:
                m.mark_silent(i)
                return "silent", None, None
            m.mark_answered(i)
    finally:
        task.cancel()


def _outcome(task: Any) -> Outcome:
    try:
        return "answered", task.result(), None
    except FencedError as e:
        return "answered", None, e


def _probe_beside(c: ClientBase, i: int, task: Any, deadline: float) -> Flow[Optional[bool]]:
    """Probes member ``i`` for half an attempt time-out while ``task`` waits on it: whether
    it is alive, or ``None`` when the task was done first."""
    half = c._members.attempt_timeout / 2
    probe = yield Spawn(_probe(c, i, half))
    try:
        done = yield Wait((task, probe), max(0.0, min(half, deadline - now())))
        if task in done:
            return None
        return probe in done and bool(probe.result())
    finally:
        probe.cancel()


def _probe(c: ClientBase, i: int, within: float) -> Flow[bool]:
    """Whether member ``i`` answers ``GET /readyz`` with ``leader: true`` within ``within``."""
    try:
        r = yield Send(i, "GET", "/readyz", None, {}, within)
        return r.status == 200 and r.json().get("leader") is True
    except Exception:  # noqa: BLE001 - any failure is "not alive"
        return False


# --- lease and lock calls ------------------------------------------------------------------


def _json(c: ClientBase, i: int, call: _calls.Call[Any], timeout: Optional[float] = None) -> Flow[Any]:
    """One attempt of ``call`` on member ``i``: the JSON of its answer."""
    data, headers = call.encoded()
    return (yield from ask(c, i, call.method, call.path, data, headers, _calls.answer, timeout))


def run(c: ClientBase, call: _calls.Call[T], deadline: Optional[float] = None,
        timeout: Optional[float] = None) -> Flow[T]:
    """Makes ``call`` over the members (each attempt within ``timeout``, by default the
    request time-out): what it reads of the answer."""
    try:
        answer, _ = yield from over(c, lambda i: _json(c, i, call, timeout), deadline)
    except call.done_if:
        answer = None
    return call.read(answer)


def keepalive(c: ClientBase, lease_id: str, timeout: float) -> Flow[int]:
    """One keepalive within ``timeout``, failovers included: the lease's TTL in ms."""
    call = _calls.keepalive(lease_id)
    deadline = now() + timeout
    answer, _ = yield from over(c, lambda i: _json(c, i, call, max(0.001, deadline - now())), deadline)
    return call.read(answer)


def revoke_lock(c: ClientBase, name: str, token: Optional[int]) -> Flow[int]:
    """``revoke_lock``: without ``token``, the current holder's is read first and named."""
    _core.check_name(name)
    if token is None:
        token = _calls.held_token(name, (yield from run(c, _calls.lock_info(name))))
    return (yield from run(c, _calls.revoke_lock(name, token)))


def give_back(c: ClientBase, lease_id: str) -> Flow[None]:
    """Revokes the implicit lease of an acquire whose caller left, best effort: a grant
    made for nobody is given back at once rather than after its TTL."""
    try:
        deadline = now() + min(c.request_timeout, _calls.GIVE_BACK_TIMEOUT)
        yield from run(c, _calls.revoke_lease(lease_id), deadline, _calls.GIVE_BACK_TIMEOUT)
    except FencedError as e:
        log.debug("revoking the abandoned implicit lease: %s", e)


def release(c: ClientBase, state: LockState, stop: Callable[[], None]) -> Flow[None]:
    """A guard's release: ``stop`` its keepalive, give the lock back (its implicit lease
    ends), then raise :class:`fenced.LockLost` if it had been lost before (the work done
    under it may not have been exclusive)."""
    reason = state.lost_by_now()
    stop()
    state.released = True
    try:
        yield from run(c, _calls.release(state.lease_id))
    except FencedError:
        if reason is None:
            raise
    if reason is not None:
        raise LockLost(reason, state.name)


# --- acquire -----------------------------------------------------------------------------


def acquire_on(c: ClientBase, i: int, name: str, lease_id: str, ttl_ms: int, wait_ms: int, timeout: float,
               holder: Optional[str] = None, names: Optional[List[str]] = None) -> Flow[Dict[str, Any]]:
    """One acquire on member ``i`` (:func:`_core.acquire_request`): the grant."""
    path, body = _core.acquire_request(name, lease_id, ttl_ms, wait_ms, holder, names)
    return (yield from ask(c, i, "POST", path, body, _calls.JSON_HEADERS, lambda r: _calls.acquire_answer(r, name),
                           timeout))


def acquire(c: ClientBase, name: str, ttl: float, wait: float, margin: Optional[float],
            holder: Optional[str] = None, names: Optional[List[str]] = None) -> Flow[LockState]:
    """``lock``/``lock_all``: asks under one implicit lease until granted or refused
    (:class:`_core.Acquiring`), then renews the grant once if the wait was long. Whatever
    may have been granted and is not handed out is given back."""
    ttl_ms, wait_ms = _core.check_acquire(name, ttl, wait, margin, holder)
    acq = _core.Acquiring(wait_ms, c.request_timeout, len(c._members.endpoints))

    def attempt(i: int) -> Flow[Dict[str, Any]]:
        wait_left = acq.wait_left()
        return acquire_on(c, i, name, acq.lease, ttl_ms, _core.ms(wait_left), c.request_timeout + wait_left,
                          holder, names)

    try:
        grant = yield from _granted(c, acq, attempt)
    finally:
        if acq.give_back:
            yield BestEffort(give_back(c, acq.lease), "revoking an abandoned implicit lease")
    assert acq.sent_at is not None
    try:
        state = LockState.from_grant(name, grant, ttl_ms, margin, acq.sent_at, names)
        yield from _first_renewal(c, state, acq.started)
        return state
    except BaseException:
        # A grant this call cannot hand out is given back.
        yield BestEffort(give_back(c, acq.lease), "revoking an abandoned implicit lease")
        raise


def _granted(c: ClientBase, acq: _core.Acquiring,
             attempt: Callable[[int], Flow[Dict[str, Any]]]) -> Flow[Dict[str, Any]]:
    """The attempts of one acquire, each over the members, and the pauses between them."""
    while True:
        sent = now()
        try:
            grant, _ = yield from over(c, attempt, acq.deadline)
        except FencedError as e:
            pause = acq.failed(e, sent)
            if pause is None:
                raise
            yield Sleep(pause)
            continue
        acq.granted(sent)
        return grant


def _first_renewal(c: ClientBase, state: LockState, started: float) -> Flow[None]:
    """A grant that came after a long wait in the queue is renewed once before it is handed
    out (:meth:`LockState.renew_first`)."""
    if not state.renew_first(started):
        return
    renewed = now()
    try:
        ttl_ms = yield from keepalive(c, state.lease_id, c.request_timeout)
    except FencedError as e:
        state.first_renewal_failed(e)
        return
    state.extend(renewed, ttl_ms / 1000.0)


# --- the guard's keepalive -----------------------------------------------------------------


class Keeper(Protocol):
    """What the keepalive loop asks of a guard's keeper (its thread's, its task's): its
    state, the test hook ``paused`` (no keepalive is sent while set), a pause (awaitable
    for the asyncio keeper: True when the keeper was stopped meanwhile), whether it was
    stopped, and ``wake()`` when the deadline moved (the timer waits for the new one)."""

    state: LockState
    paused: bool

    def rest(self, seconds: float) -> Any: ...

    def is_stopped(self) -> bool: ...

    def wake(self) -> None: ...


def renewing(c: ClientBase, keeper: Keeper) -> Flow[None]:
    """The keepalive loop of a held lock, on :class:`Renewal`'s schedule, until the lock is
    lost, past its deadline, or the keeper stopped."""
    st = keeper.state
    ka = Renewal(st)
    while not (yield Io(keeper.rest, (ka.pause(),))):
        if st.past_deadline():
            return
        if ka.skipped(keeper.paused):
            continue
        sent = now()
        try:
            ttl_ms = yield from keepalive(c, st.lease_id, ka.timeout(sent, c.request_timeout))
        except FencedError as e:
            if ka.failed(e, keeper.is_stopped()):
                return
            continue
        except Exception as e:  # noqa: BLE001 - a bug must not leave the lock looking valid
            log.error("keepalive of lock '%s' crashed: %r", st.name, e)
            ka.retry_later()
            continue
        if keeper.is_stopped() or ka.too_late():
            return
        if ka.renewed(sent, ttl_ms):
            keeper.wake()
