"""The state of a held lock that both guards share: the grant, the client-side deadline,
the lost signal's one rule (set once, for the first reason, never cleared), and the
keepalive schedule. No IO: the guards' threads or tasks, and the flows of ``_flow``, step it."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, List, Optional

from . import _core
from .errors import BadRequest, FencedError, LeaseNotFound, LockLost, LostReason, ServerError, Unauthorized

log = logging.getLogger("fenced")


class LockState:
    """The grant and its deadline. ``valid_until`` only moves forward, and only by
    :meth:`extend` from a successful acquire or keepalive, counted from its send."""

    def __init__(self, name: str, token: int, lease_id: str, ttl: float, margin: float, sent_at: float) -> None:
        self.name = name
        self.token = token
        self.lease_id = lease_id
        self.ttl = ttl
        self.margin = margin
        self._valid_until = _core.valid_until(sent_at, ttl, margin)
        #: The send time of the last successful acquire or keepalive.
        self.sent_at = sent_at
        #: A set acquired together (:meth:`fenced.Client.lock_all`): every name and its
        #: token, in sorted order; empty for one lock.
        self.tokens: Dict[str, int] = {}
        #: The service's signature (hex) of every lock's token, when it signs grants.
        self.signatures: Dict[str, str] = {}
        self._mu = threading.Lock()
        self.reason: Optional[LostReason] = None
        self.released = False
        #: Called once, with the reason, when the lock is lost (sets the event, wakes...).
        self.on_lost: Callable[[LostReason], None] = lambda r: None

    @classmethod
    def from_grant(cls, name: str, answer: Dict[str, Any], ttl_ms: int, margin: Optional[float], sent_at: float,
                   names: Optional[List[str]] = None) -> "LockState":
        """The state of the grant ``answer`` to an acquire of ``name`` (with ``names``, of
        that set) sent at ``sent_at`` for ``ttl_ms``; :class:`fenced.ServerError` when the
        answer is not a grant of what was asked."""
        grant, tokens, signatures = _core.read_set_grant(answer, names)
        if grant.get("name") != name:
            raise ServerError(f"asked for lock '{name}', granted '{grant.get('name')}'", code="bad_response")
        token, lease_id = grant.get("token"), grant.get("lease_id")
        if not isinstance(token, int) or token < 1 or not isinstance(lease_id, str):
            raise ServerError(f"a grant without a token or lease: {grant}", code="bad_response")
        ttl = min(int(grant.get("ttl_ms", ttl_ms)), ttl_ms) / 1000.0
        m = _core.default_margin(ttl) if margin is None else float(margin)
        state = cls(name, token, lease_id, ttl, m, sent_at)
        state.tokens = tokens
        state.signatures = signatures
        return state

    def renew_first(self, started: float) -> bool:
        """Whether a grant asked for at ``started`` is renewed once before it is handed out:
        one that came after a long wait in the queue may leave little of the deadline
        counted from the send, so the guard starts fresh."""
        return _core.now() - started > self.ttl / 3

    def first_renewal_failed(self, e: FencedError) -> None:
        """The renewal :meth:`renew_first` sent failed with ``e``: when the server no longer
        knows the lease, the acquire raises :class:`fenced.LockLost`; any other failure is
        left to the guard's own keepalive, which retries until the deadline."""
        if isinstance(e, LeaseNotFound):
            raise LockLost(LostReason.LEASE_NOT_FOUND, self.name) from None

    @property
    def valid_until(self) -> float:
        return self._valid_until

    def extend(self, sent_at: float, ttl: float) -> bool:
        """Moves the deadline to ``sent_at + ttl - margin`` if that is later and the lock
        is not lost (lost is final). Returns whether it moved."""
        with self._mu:
            if self.reason is not None:
                return False
            nxt = _core.valid_until(sent_at, min(ttl, self.ttl), self.margin)
            if nxt > self._valid_until:
                self._valid_until = nxt
                self.sent_at = max(self.sent_at, sent_at)
                return True
            return False

    def mark_lost(self, reason: LostReason) -> None:
        with self._mu:
            if self.reason is not None or self.released:
                return
            self.reason = reason
        self.on_lost(reason)

    def past_deadline(self) -> bool:
        """Reads the clock itself: exact even before the timer has run (or after this
        process was frozen past the deadline), and marks the lock lost if so."""
        if self.reason is None and not self.released and _core.now() >= self._valid_until:
            self.mark_lost(LostReason.EXPIRED)
        return self.reason is not None

    def lost_by_now(self) -> Optional[LostReason]:
        """Why the lock was lost by now (reading the clock), if it was: what its release
        raises after giving back what is left."""
        self.past_deadline()
        return self.reason

    def check(self) -> int:
        if self.released:
            raise BadRequest(f"lock '{self.name}' was released", code="released")
        if self.past_deadline():
            assert self.reason is not None
            raise LockLost(self.reason, self.name)
        return self.token

    def describe(self) -> Dict[str, Any]:
        return {"name": self.name, "token": self.token, "ttl": self.ttl, "lost": self.reason}


class Renewal:
    """The keepalive schedule of a held lock: every TTL/3 after the last successful send,
    a tenth of the TTL after a failed or skipped one, and each round sent against the
    deadline it started under. :func:`fenced._flow.renewing` steps it."""

    def __init__(self, state: LockState) -> None:
        self.state = state
        self._retry_step = max(state.ttl / 10, 0.01)
        self._next_at = _core.next_keepalive(state.sent_at, state.ttl)
        #: The deadline of this round: a keepalive answered after it came too late.
        self.deadline = state.valid_until

    def pause(self) -> float:
        """The sleep before the next round, which starts under the deadline as it is now."""
        self.deadline = self.state.valid_until
        return max(0.0, min(self._next_at, self.deadline) - _core.now())

    def timeout(self, sent: float, request_timeout: float) -> float:
        """The time-out of a keepalive sent at ``sent``: its answer is no use past the deadline."""
        return min(request_timeout, self.deadline - sent)

    def skipped(self, paused: bool) -> bool:
        """Whether this round sends nothing (the test hook paused keepalives, as a long
        pause of the process would; the deadline timer keeps running)."""
        if paused:
            self.retry_later()
        return paused

    def retry_later(self) -> None:
        """This round sent nothing, or its keepalive failed: the next round comes soon."""
        self._next_at = _core.now() + self._retry_step

    def failed(self, e: FencedError, stopped: bool = False) -> bool:
        """The keepalive failed with ``e``: True when the loop ends (the server refused the
        lease, which marks the lock lost; the guard was stopped; the deadline passed),
        False when it tries again soon."""
        st = self.state
        if isinstance(e, LeaseNotFound):
            st.mark_lost(LostReason.LEASE_NOT_FOUND)
            return True
        if isinstance(e, Unauthorized):
            st.mark_lost(LostReason.UNAUTHORIZED)
            return True
        if stopped or st.past_deadline():
            return True
        log.debug("keepalive of lock '%s' failed, retrying: %s", st.name, e)
        self.retry_later()
        return False

    def too_late(self) -> bool:
        """A keepalive answered after this round's deadline: the lock is lost (the loop ends)."""
        if _core.now() >= self.deadline:
            self.state.mark_lost(LostReason.KEEPALIVE_TOO_LATE)
            return True
        return False

    def renewed(self, sent: float, ttl_ms: int) -> bool:
        """The keepalive sent at ``sent`` renewed the lease for ``ttl_ms``: whether the
        deadline moved (the timer is woken to wait for the new one)."""
        moved = self.state.extend(sent, ttl_ms / 1000.0)
        self._next_at = _core.next_keepalive(sent, self.state.ttl)
        return moved


class LostEvent(threading.Event):
    """``lock.lost`` for the sync client: a :class:`threading.Event` set by the guard's
    timer at the deadline (or at once on a refused keepalive), and whose ``is_set()`` also
    reads the clock, so it is exact at every moment."""

    def __init__(self, state: LockState) -> None:
        super().__init__()
        self._state = state

    def is_set(self) -> bool:  # noqa: D102 - same meaning as Event's
        self._state.past_deadline()
        return super().is_set()


class GrantView:
    """What a held lock shows of its grant, the same for :class:`fenced.Lock` and
    :class:`fenced.AsyncLock` (each keeps its :class:`LockState` as ``_state``)."""

    _state: LockState

    @property
    def name(self) -> str:
        return self._state.name

    @property
    def token(self) -> int:
        """The fencing token of this grant: pass it with every operation on the resource."""
        return self._state.token

    @property
    def tokens(self) -> Dict[str, int]:
        """Every lock held with its token: the set of ``lock_all`` (sorted by name), or this
        one lock. Fence each resource with its own lock's token."""
        return dict(self._state.tokens) or {self._state.name: self._state.token}

    @property
    def signature(self) -> Optional[str]:
        """The service's signature of :attr:`token` for this lock (hex), when it signs
        grants (``grant_signing_key``); ``None`` otherwise. What a gate given the keys asks
        for (:class:`fenced.gates.Verified`, a key under the server's ``signed_key_prefix``)."""
        return self._state.signatures.get(self._state.name)

    @property
    def signatures(self) -> Dict[str, str]:
        """Every lock's signature (hex), as :attr:`tokens`; empty when the service does not sign."""
        return dict(self._state.signatures)

    @property
    def lease_id(self) -> str:
        return self._state.lease_id

    @property
    def ttl(self) -> float:
        """The lease's TTL as granted, in seconds."""
        return self._state.ttl

    @property
    def margin(self) -> float:
        return self._state.margin

    @property
    def valid_until(self) -> float:
        """The client-side deadline, on :func:`time.monotonic`."""
        return self._state.valid_until

    @property
    def lost_reason(self) -> Optional[LostReason]:
        self._state.past_deadline()
        return self._state.reason

    def is_valid(self) -> bool:
        """Not lost and before ``valid_until``, reading the clock itself."""
        return not self._state.released and not self._state.past_deadline()

    def check(self) -> int:
        """The token if the lock can still be trusted now; :class:`fenced.LockLost` otherwise."""
        return self._state.check()
