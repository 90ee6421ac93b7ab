"""What the sync and the async store share: the request of a fenced write or read, the
reading of its answer, and the flows of both (:mod:`fenced._flow`). No IO:
``client.Store`` and ``aio.AsyncStore`` drive the flows their own way."""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple

from . import _core, _flow
from .errors import BadRequest, NotFound, ServerError, StaleToken, Unavailable
from .signing import signed_headers


class StoreRead(NamedTuple):
    """A value read from the store: ``None`` when the key holds none; the key's mark."""

    value: Optional[bytes]
    highest_seen: Optional[int]


def put_request(key: str, value: bytes, token: int,
                signature: Optional[str]) -> Tuple[str, bytes, Dict[str, str]]:
    """The path, body and headers of ``PUT /v1/store/{key}`` with ``Fencing-Token``, checked."""
    _core.check_name(key, "store key")
    token = _core.check_token(token)
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise BadRequest("a store value is bytes", code="invalid_value")
    headers = {**signed_headers(signature), "fencing-token": str(token), "content-type": "application/octet-stream"}
    return f"/v1/store/{_core.segment(key)}", bytes(value), headers


def put_answer(r: _core.Reply, token: int) -> int:
    """The key's mark after a write under ``token``, from its answer."""
    if not r.ok():
        raise r.error()
    if not r.body:
        return token
    b = r.json()
    if b.get("token") != token:
        raise ServerError("the store echoed another token", code="bad_response")
    return int(b.get("highest_seen", token))


def outcome_unknown(e: StaleToken, token: int) -> Optional[Unavailable]:
    """What a write refused as stale raises instead of ``e`` when it was retried on another
    member after one fell silent: :class:`fenced.Unavailable`, since the first attempt may
    have been applied. ``None`` when ``e`` itself is the answer."""
    if not getattr(e, "uncertain", False):
        return None
    return Unavailable(
        f"the write under token {token} was retried after a member fell silent and the retry was refused "
        f"({e.message}): the first attempt may have been applied",
        code="outcome_unknown",
    )


def put(c: _core.ClientBase, key: str, value: bytes, token: int, signature: Optional[str]) -> _flow.Flow[int]:
    """A fenced write over the members: the key's mark after it (:meth:`fenced.Store.put`)."""
    path, body, headers = put_request(key, value, token, signature)
    try:
        mark, _ = yield from _flow.over(c, lambda i: _flow.ask(c, i, "PUT", path, body, headers,
                                                               lambda r: put_answer(r, token)))
        return mark
    except StaleToken as e:
        unknown = outcome_unknown(e, token)
        if unknown is None:
            raise
        raise unknown from e


def read(c: _core.ClientBase, key: str, token: Optional[int], signature: Optional[str]) -> _flow.Flow[StoreRead]:
    """A read, fenced with ``token``, over the members (:meth:`fenced.Store.read`)."""
    path, headers = read_request(key, token, signature)
    value, _ = yield from _flow.over(c, lambda i: _flow.ask(c, i, "GET", path, None, headers, read_answer))
    return value


def read_request(key: str, token: Optional[int], signature: Optional[str]) -> Tuple[str, Dict[str, str]]:
    """The path and headers of ``GET /v1/store/{key}``: a fenced read with ``token``."""
    _core.check_name(key, "store key")
    headers = {"fencing-token": str(_core.check_token(token))} if token is not None else {}
    headers.update(signed_headers(signature))
    return f"/v1/store/{_core.segment(key)}", headers


def read_answer(r: _core.Reply) -> StoreRead:
    """The value and mark of a read's answer (404 ``not_found``: no value)."""
    mark = _mark(r.headers.get("fencing-highest-seen"))
    if r.status == 200:
        return StoreRead(r.body, mark)
    e = r.error()
    if r.status == 404 and isinstance(e, NotFound) and e.code == "not_found":
        return StoreRead(None, mark if mark is not None else e.highest_seen)
    raise e


def _mark(v: Optional[str]) -> Optional[int]:
    try:
        n = int(v.strip()) if v else 0
    except ValueError:
        return None
    return n if n > 0 else None
