"""The client's typed errors, one class per kind of refusal, and how an answer maps onto them.

Every error the server answers is ``{"error": {"code", "message", ...details}}`` with an HTTP
status (docs/server.md). :func:`from_answer` turns it into the class :data:`ERROR_CODES`
names for its code (falling back on the status), so callers match on classes, never on
strings. Every exception carries ``code``, ``status`` (``None`` when the client itself
refused, before or without an answer), ``message`` and ``details`` (the other fields).
"""

from __future__ import annotations

import enum
import json
from typing import Any, Dict, Mapping, Optional, Type


class FencedError(Exception):
    """The base of every error this library raises."""

    #: The code used when the class is raised without one from the server.
    default_code = "error"

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        details: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.code: str = code or self.default_code
        self.status: Optional[int] = status
        self.message: str = message
        self.details: Dict[str, Any] = dict(details or {})

    def __str__(self) -> str:
        where = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{self.code}{where}: {self.message}"

    def _int(self, key: str) -> Optional[int]:
        v = self.details.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None


# --- the lock service's refusals -------------------------------------------------------


class LockHeld(FencedError):
    """Not granted within the wait (a try-lock found it held, or the wait ran out)."""

    default_code = "lock_held"

    @property
    def holder_token(self) -> Optional[int]:
        """The holder's token, when the lock is held (``None`` during a lock-delay)."""
        return self._int("holder_token")


class NotHolder(FencedError):
    """The lease does not hold the lock (a release by someone else)."""

    default_code = "not_holder"

    @property
    def holder_token(self) -> Optional[int]:
        return self._int("holder_token")


class LeaseNotFound(FencedError):
    """No live lease with this id: it expired, was revoked, or never existed."""

    default_code = "lease_not_found"


class LeaseExists(FencedError):
    """An implicit lease's id names a live lease that is not this request's earlier attempt."""

    default_code = "lease_exists"


class StaleToken(FencedError):
    """The gate refused a token below the resource's mark: a newer holder got there."""

    default_code = "stale_token"

    def __init__(self, message: str, *, token: Optional[int] = None, highest_seen: Optional[int] = None,
                 **kw: Any) -> None:
        details = dict(kw.pop("details", None) or {})
        if token is not None:
            details.setdefault("token", token)
        if highest_seen is not None:
            details.setdefault("highest_seen", highest_seen)
        super().__init__(message, details=details, **kw)

    @property
    def token(self) -> Optional[int]:
        """The token the refused operation carried."""
        return self._int("token")

    @property
    def highest_seen(self) -> Optional[int]:
        """The resource's mark, higher than :attr:`token`."""
        return self._int("highest_seen")


class BadSignature(FencedError):
    """A gate given the service's verifying keys refused a token without a valid signature
    for the lock that guards the resource (a forged number, another lock's token, another
    service's): the server's store for a key under ``signed_key_prefix``
    (``bad_signature``, ``signature_required``), or :class:`fenced.gates.Verified`.
    Nothing was done."""

    default_code = "bad_signature"

    @property
    def token(self) -> Optional[int]:
        return self._int("token")

    @property
    def lock(self) -> Optional[str]:
        """The lock whose signature the gate asked for."""
        v = self.details.get("lock")
        return v if isinstance(v, str) else None


class TokenNotIssued(FencedError):
    """The store refused a token above every token the service ever issued."""

    default_code = "token_not_issued"

    @property
    def token(self) -> Optional[int]:
        return self._int("token")

    @property
    def highest_issued(self) -> Optional[int]:
        """The highest token issued so far (``None``: none yet)."""
        return self._int("highest_issued")


class TokenRequired(FencedError):
    """A write to a fenced key without a token (428)."""

    default_code = "token_required"


class NotFound(FencedError):
    """The thing asked about does not exist (404)."""

    default_code = "not_found"

    @property
    def highest_seen(self) -> Optional[int]:
        return self._int("highest_seen")


class Missed(FencedError):
    """A watch cannot go on without a gap: the events after its position are no longer held
    (``compacted``, HTTP 410; :attr:`oldest_index` is the oldest one held), its stream fell
    behind what the member holds (``lagged``), or it broke before the server told its
    position (``missed``). Read the state again (``locks``) and start a new watch."""

    default_code = "missed"

    @property
    def oldest_index(self) -> Optional[int]:
        """The oldest event index the member still holds, when it said (``compacted``): a
        watch ``since`` ``oldest_index - 1`` or later resumes."""
        return self._int("oldest_index")


class MembershipChangeFailed(FencedError):
    """A cluster membership change did not complete (409)."""

    default_code = "membership_change_failed"


# --- the service cannot serve now (nothing was done) -----------------------------------


class Unavailable(FencedError):
    """The service could not be reached, timed out, or said it cannot serve now."""

    default_code = "unavailable"

    @property
    def retry_after(self) -> Optional[float]:
        """The server's hint, in seconds, for when to try again (``retry_after_ms``)."""
        ms = self._int("retry_after_ms")
        return ms / 1000.0 if ms is not None else None


class Transport(Unavailable):
    """The request failed on the way: no connection, a reset, or no answer in time.
    ``sent`` tells whether it may have reached the server (then its effect is unknown)."""

    default_code = "unreachable"

    def __init__(self, message: str, *, sent: bool = True, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.sent = sent


class NotLeader(Unavailable):
    """This member of a cluster is not the leader (the client moves on to the next)."""

    default_code = "not_leader"

    @property
    def leader_id(self) -> Optional[int]:
        return self._int("leader_id")


class NoLeader(Unavailable):
    default_code = "no_leader"


class Recovering(Unavailable):
    """The one grace after migrating a data directory: nothing is granted yet."""

    default_code = "recovering"


class ShuttingDown(Unavailable):
    default_code = "shutting_down"


class TooBusy(Unavailable):
    """Request bodies in flight are at their bound; retry after ``retry_after``."""

    default_code = "too_busy"


class TooManyConnections(Unavailable):
    default_code = "too_many_connections"


class LimitReached(Unavailable):
    """A server-wide limit (leases, locks, waiters) is reached (429)."""

    default_code = "limit_reached"

    @property
    def limit(self) -> Optional[int]:
        return self._int("limit")


class TooManyLeases(LimitReached):
    default_code = "too_many_leases"


class TooManyLocks(LimitReached):
    default_code = "too_many_locks"


class TooManyWaiters(LimitReached):
    default_code = "too_many_waiters"


class Busy(Unavailable):
    """The laboratory's simulations are at their bound (``sim_busy``, ``sim_timeout``)."""

    default_code = "sim_busy"


# --- credentials -----------------------------------------------------------------------


class Unauthorized(FencedError):
    """The bearer token was missing or refused (401)."""

    default_code = "unauthorized"


class Forbidden(Unauthorized):
    """The credentials are known but lack the permission (403)."""

    default_code = "forbidden"


# --- bad input -------------------------------------------------------------------------


class BadRequest(FencedError):
    """The request was malformed or out of limits (400, 413, 414, 422, 431), or refused here
    before it was sent (then ``status`` is ``None``)."""

    default_code = "bad_request"


class ConfigError(BadRequest, ValueError):
    """The client's own configuration, refused when the client is made (``status`` is
    ``None``): a TLS file that is missing or is not PEM, a client certificate without its
    key. Also a ``ValueError``."""

    default_code = "invalid_config"


class OutOfRange(BadRequest):
    """A TTL, wait or lock-delay outside the server's bounds (which ``details`` names)."""

    default_code = "out_of_range"


class TooLarge(BadRequest):
    default_code = "too_large"

    @property
    def limit_bytes(self) -> Optional[int]:
        return self._int("limit_bytes")


class UnfencedKey(BadRequest):
    """A token sent for a key under the server's ``unfenced_prefix``: it would protect nothing."""

    default_code = "unfenced_key"


# --- the server's own failures ---------------------------------------------------------


class ServerError(FencedError):
    """An answer none of the classes above names (5xx, an unknown code, a bad answer)."""

    default_code = "server_error"


class StorageFull(ServerError):
    """The fenced store is at a quota, or the disk below its reserve (507): locks go on."""

    default_code = "store_full"


class CorruptRecord(ServerError):
    """A gate found a mark it cannot read back intact: an error, never "no mark"."""

    default_code = "corrupt_record"


class UnsupportedServer(FencedError):
    """The endpoint is not a Fenced server speaking API v1 (see ``Client`` for the check)."""

    default_code = "unsupported_server"


# --- the lock guard --------------------------------------------------------------------


class LostReason(str, enum.Enum):
    """Why a lock stopped being trustworthy."""

    #: No keepalive succeeded before the client-side deadline (``valid_until``).
    EXPIRED = "expired"
    #: A keepalive answered after the client-side deadline had passed.
    KEEPALIVE_TOO_LATE = "keepalive_too_late"
    #: The server no longer knows the lease: it expired there or was revoked.
    LEASE_NOT_FOUND = "lease_not_found"
    #: The server refused the keepalive's credentials (401/403).
    UNAUTHORIZED = "unauthorized"

    def describe(self) -> str:
        return {
            LostReason.EXPIRED: "no keepalive succeeded before the lease's client-side deadline",
            LostReason.KEEPALIVE_TOO_LATE: "a keepalive came back after the client-side deadline",
            LostReason.LEASE_NOT_FOUND: "the server no longer knows the lease (expired or revoked)",
            LostReason.UNAUTHORIZED: "the server refused the keepalive's credentials",
        }[self]


class LockLost(FencedError):
    """The lock was lost, or can no longer be trusted: stop working under its token."""

    default_code = "lock_lost"

    def __init__(self, reason: LostReason, name: str = "") -> None:
        what = f"lock '{name}' lost: " if name else "lock lost: "
        super().__init__(what + reason.describe(), details={"reason": reason.value})
        self.reason = reason


#: Every code the server answers (docs/server.md), and the class it is raised as.
ERROR_CODES: Dict[str, Type[FencedError]] = {
    # locks and leases
    "lock_held": LockHeld,
    "not_holder": NotHolder,
    "lease_not_found": LeaseNotFound,
    "lease_exists": LeaseExists,
    "ttl_out_of_range": OutOfRange,
    "wait_out_of_range": OutOfRange,
    "lock_delay_out_of_range": OutOfRange,
    "too_many_leases": TooManyLeases,
    "too_many_locks": TooManyLocks,
    "too_many_waiters": TooManyWaiters,
    "recovering": Recovering,
    "shutting_down": ShuttingDown,
    "not_leader": NotLeader,
    "no_leader": NoLeader,
    "membership_change_failed": MembershipChangeFailed,
    # the fenced store
    "stale_token": StaleToken,
    "token_not_issued": TokenNotIssued,
    "bad_signature": BadSignature,
    "signature_required": BadSignature,
    "token_required": TokenRequired,
    "not_found": NotFound,
    "not_signing": NotFound,
    "unfenced_key": UnfencedKey,
    "store_full": StorageFull,
    "insufficient_storage": StorageFull,
    "corrupt_record": CorruptRecord,
    # the event stream
    "compacted": Missed,
    # the edge: input
    "invalid_json": BadRequest,
    "invalid_field": BadRequest,
    "invalid_name": BadRequest,
    "invalid_holder": BadRequest,
    "invalid_names": BadRequest,
    "invalid_key": BadRequest,
    "invalid_lease_id": BadRequest,
    "invalid_token": BadRequest,
    "invalid_query": BadRequest,
    "invalid_request": BadRequest,
    "invalid_body": BadRequest,
    "invalid_frame": BadRequest,
    "invalid_upgrade": BadRequest,
    "unknown_op": BadRequest,
    "bad_preamble": BadRequest,
    "bad_parameter": BadRequest,
    "malformed_request": BadRequest,
    "missing_host": BadRequest,
    "method_not_allowed": BadRequest,
    "unsupported_media_type": BadRequest,
    "too_large": TooLarge,
    "trace_too_large": TooLarge,
    "headers_too_large": TooLarge,
    "uri_too_long": TooLarge,
    "body_timeout": BadRequest,
    # the edge: load
    "too_busy": TooBusy,
    "too_many_connections": TooManyConnections,
    "sim_busy": Busy,
    "sim_timeout": Busy,
    # credentials
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    # the peer routes, refused to a client: typed all the same
    "not_a_cluster": Forbidden,
    "invalid_snapshot": BadRequest,
    "snapshot_not_resumable": BadRequest,
    # the server itself
    "internal": ServerError,
    "snapshot_failed": ServerError,
}


def _by_status(status: Optional[int]) -> Type[FencedError]:
    if status is None:
        return ServerError
    if status == 401:
        return Unauthorized
    if status == 403:
        return Forbidden
    if status == 404:
        return NotFound
    if status == 410:
        return Missed
    if status == 413:
        return TooLarge
    if status in (400, 408, 414, 422, 431):
        return BadRequest
    if status == 428:
        return TokenRequired
    if status == 429:
        return LimitReached
    if status in (502, 503, 504):
        return Unavailable
    if status == 507:
        return StorageFull
    return ServerError


def from_answer(status: Optional[int], body: bytes) -> FencedError:
    """The typed error for an error answer: its code's class, else its status's."""
    code: Optional[str] = None
    message = ""
    details: Dict[str, Any] = {}
    try:
        parsed = json.loads(body.decode("utf-8")) if body else None
    except (UnicodeDecodeError, ValueError):
        parsed = None
    err = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        code = err["code"]
        message = str(err.get("message") or "")
        details = {k: v for k, v in err.items() if k not in ("code", "message")}
    else:
        message = body[:200].decode("utf-8", "replace")
        code = f"http_{status}" if status is not None else "bad_answer"
    cls = ERROR_CODES.get(code) or _by_status(status)
    return cls(message or code, code=code, status=status, details=details)
