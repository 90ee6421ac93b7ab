"""What the sync and the async client share of their lock and lease calls: what each sends
(its arguments checked first), how its answer is read, and which refusals mean that its
work was already done. No IO: :func:`fenced._flow.run` makes a :class:`Call` over the
members, and each client drives that flow its own way."""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Generic, List, Optional, Tuple, Type, TypeVar

from . import _core
from .errors import FencedError, LeaseNotFound, LockHeld, NotHolder, ServerError
from .signing import GrantKeys

T = TypeVar("T")

#: The headers of a request with a JSON body.
JSON_HEADERS = {"content-type": "application/json"}
#: Giving back the implicit lease of an acquire whose caller left: the time-out of each
#: attempt, and of the whole call at most. Best effort: the lease expires anyway.
GIVE_BACK_TIMEOUT = 3.0


class Call(Generic[T]):
    """One JSON call: ``method path`` with ``body`` (``None``: no body); ``read`` makes of
    the answer's JSON (``None`` for 204 or an empty body) what the caller gets. A refusal
    of a class in ``done_if`` says the work was already done (a lease already gone): it
    reads as an answer with no body."""

    __slots__ = ("method", "path", "body", "read", "done_if")

    def __init__(self, method: str, path: str, body: Optional[Dict[str, Any]], read: Callable[[Any], T],
                 done_if: Tuple[Type[FencedError], ...] = ()) -> None:
        self.method = method
        self.path = path
        self.body = body
        self.read = read
        self.done_if = done_if

    def encoded(self) -> Tuple[Optional[bytes], Dict[str, str]]:
        """The request's body as sent, and its headers."""
        if self.body is None:
            return None, {}
        return json.dumps(self.body).encode(), dict(JSON_HEADERS)


def answer(r: _core.Reply) -> Any:
    """The JSON of one attempt's answer (``None`` for 204 or an empty body); an error
    answer raised as its :class:`fenced.FencedError`."""
    if not r.ok():
        raise r.error()
    return None if r.status == 204 or not r.body else r.json()


def _as_is(a: Any) -> Any:
    return a


def _nothing(a: Any) -> None:
    return None


# --- the calls -------------------------------------------------------------------------


def check(name: str, token: int) -> Call[Tuple[bool, Optional[int]]]:
    """``POST /v1/locks/{name}/check``: whether ``token`` is the current grant, and the
    current holder's token."""
    body = {"token": _core.check_token(token)}
    path = f"/v1/locks/{_core.segment(_core.check_name(name))}/check"
    return Call("POST", path, body, lambda r: (bool(r.get("current")), r.get("token")))


def grant_keys() -> Call[GrantKeys]:
    """``GET /v1/keys``: the keys that verify the service's grant signatures."""
    return Call("GET", "/v1/keys", None, GrantKeys.from_json)


def lock_info(name: str) -> Call[Dict[str, Any]]:
    """``GET /v1/locks/{name}``: the lock's view."""
    return Call("GET", f"/v1/locks/{_core.segment(_core.check_name(name))}", None, _as_is)


def locks(prefix: Optional[str]) -> Call[List[Dict[str, Any]]]:
    """``GET /v1/locks?prefix=P``: the views of the locks whose names start with ``prefix``."""
    path = "/v1/locks" + (f"?prefix={_core.segment(prefix)}" if prefix else "")
    return Call("GET", path, None, lambda r: list(r["locks"]))


def create_lease(ttl: float) -> Call[str]:
    """``POST /v1/leases``: a lease of ``ttl`` seconds, its id."""
    return Call("POST", "/v1/leases", {"ttl_ms": _core.ms(ttl)}, lambda r: str(r["lease_id"]))


def keepalive(lease_id: str) -> Call[int]:
    """``POST /v1/leases/{id}/keepalive``: the lease's TTL in ms, renewed from the send."""
    return Call("POST", f"/v1/leases/{lease_id}/keepalive", None, lambda r: int(r["ttl_ms"]))


def revoke_lease(lease_id: str) -> Call[None]:
    """``DELETE /v1/leases/{id}``, which releases its locks. A lease already gone is done."""
    return Call("DELETE", f"/v1/leases/{lease_id}", None, _nothing, (LeaseNotFound,))


def release(lease_id: str) -> Call[None]:
    """The call that gives a held lock (or a set) back: the end of the implicit lease it
    was acquired with, which releases every lock of it in one command (reported as a
    release). A lease already gone is already released."""
    return revoke_lease(lease_id)


def revoke_lock(name: str, token: int) -> Call[int]:
    """``POST /v1/locks/{name}/revoke`` naming ``token``: an operator's release of the
    holder with that token only; the token taken."""
    body = {"token": _core.check_token(token)}
    path = f"/v1/locks/{_core.segment(_core.check_name(name))}/revoke"
    return Call("POST", path, body, _revoked_token)


def held_token(name: str, view: Dict[str, Any]) -> int:
    """The token of the current holder of ``name``, from its lock view; :class:`NotHolder`
    when it is free."""
    token = view.get("token")
    if not view.get("held") or not isinstance(token, int) or isinstance(token, bool) or token < 1:
        raise NotHolder(f"lock '{name}' is not held: nothing to revoke", code="not_holder")
    return token


def _revoked_token(r: Any) -> int:
    token = r.get("token") if isinstance(r, dict) else None
    if not isinstance(token, int) or isinstance(token, bool) or token < 1:
        raise ServerError(f"a revoke answered without a token: {r}", code="bad_response")
    return token


def acquire_answer(r: _core.Reply, name: str) -> Dict[str, Any]:
    """The grant of one acquire attempt's answer (:func:`_core.acquire_request`); a
    refusal raised, saying which lock."""
    if not r.ok():
        raise _named(r.error(), name)
    grant: Dict[str, Any] = r.json()
    return grant


def _named(e: FencedError, name: str) -> FencedError:
    """A refused acquire's error, saying which lock."""
    if isinstance(e, LockHeld):
        return LockHeld(f"lock '{name}': {e.message}", code=e.code, status=e.status,
                        details={**e.details, "name": name})
    return e
