"""What the sync and the async watch share: the event, the reading of the event stream
(Server-Sent Events, ``GET /v1/events``) and the position rule, as in the Rust client
(crates/fenced-client/src/watch.rs).

Every event has an ``index``, strictly increasing and the same on every member. A watch
remembers the last position the server told it (an event's index, or a position marker:
an SSE block with ``id:`` and a comment and no data, sent when a stream opens and while
it passes over events of other prefixes) and, when the stream breaks, reopens it with
``since`` that position: the events after it arrive exactly once. When the members no
longer hold every event after it (410 ``compacted``), or a stream fell behind (a
``lagged`` event), the watch raises :class:`fenced.Missed` rather than going on with a
gap.

No network IO happens here: the flows below (:mod:`fenced._flow`) hold the rules of
reading, reopening and resuming once; ``client.Watch`` and ``aio.AsyncWatch`` drive them,
each opening, reading and closing its stream its own way.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Generic, Mapping, NamedTuple, Optional, TypeVar

import httpx

from . import _core
from ._flow import Flow, Io, over
from .errors import BadRequest, Missed, ServerError, Unavailable

#: No byte for this long (the server sends a comment at least every 15 s): the stream is
#: taken for dead and reopened from the position.
SILENCE_MAX = 45.0
#: How long a watch keeps reopening a broken stream before ``next`` raises the last
#: :class:`fenced.Unavailable` (calling it again goes on trying from the same position).
RETRY_FOR = 30.0
#: The pause after a failed reopen, doubled each time up to :data:`BACKOFF_MAX`.
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 2.0
#: The most bytes one SSE block may take (an event is a few hundred): more is a broken
#: stream, reopened.
BLOCK_BYTES_MAX = 64 << 10

_DIGITS = re.compile(r"[0-9]{1,20}")

log = logging.getLogger("fenced")
C = TypeVar("C", bound=_core.ClientBase)


@dataclass(frozen=True)
class WatchEvent:
    """One event, as the server published it.

    ``index`` (its position: strictly increasing, the same on every member), ``type``,
    ``at_ms`` (the lock table's time of the log entry), and the fields of its type, the
    others ``None``:

    - ``granted``: ``name``, ``token``, ``ttl_ms``, ``holder`` (the holder's label, ``None``
      when it gave none)
    - ``released``: ``name``, ``token``, ``reason`` (``released``, ``revoked``: its lease
      was revoked, ``forced``: an operator's :meth:`fenced.Client.revoke_lock`)
    - ``expired``: ``name``, ``token``
    - ``store_accepted``: ``key``, ``token``, ``op`` (``write`` or ``read``)
    - ``store_rejected``: ``key``, ``token``, ``highest_seen``, ``op``

    A type this client does not know (a newer server's) is delivered with its ``type`` as
    sent. ``data`` is the event's whole JSON object, for fields a newer server adds.
    """

    index: int
    type: str
    at_ms: int
    name: Optional[str] = None
    key: Optional[str] = None
    token: Optional[int] = None
    ttl_ms: Optional[int] = None
    holder: Optional[str] = None
    reason: Optional[str] = None
    highest_seen: Optional[int] = None
    op: Optional[str] = None
    data: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, text: str) -> "WatchEvent":
        try:
            d = json.loads(text)
        except ValueError:
            d = None
        if not isinstance(d, dict) or not _is_uint(d.get("index")) or not isinstance(d.get("type"), str):
            raise ServerError(f"an event did not parse: {text[:200]!r}", code="bad_response")

        def s(k: str) -> Optional[str]:
            v = d.get(k)
            return v if isinstance(v, str) else None

        def n(k: str) -> Optional[int]:
            v = d.get(k)
            return v if _is_uint(v) else None

        return cls(index=d["index"], type=d["type"], at_ms=n("at_ms") or 0, name=s("name"), key=s("key"),
                   token=n("token"), ttl_ms=n("ttl_ms"), holder=s("holder"), reason=s("reason"),
                   highest_seen=n("highest_seen"), op=s("op"), data=d)


def _is_uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


class Block(NamedTuple):
    """One SSE block's fields: ``id``, ``event`` and ``data`` (its lines joined), each
    ``None`` when absent. Comment lines (``:`` first) are left out."""

    id: Optional[int]
    event: Optional[str]
    data: Optional[str]


def parse_block(text: str) -> Block:
    """The fields of one SSE block (its lines, ``\\n``-separated, without the blank line
    that ends it), as the SSE standard reads them: ``field: value`` with one optional
    space after the colon, a line without a colon a field with no value."""
    id_: Optional[int] = None
    event: Optional[str] = None
    data = []
    for line in text.split("\n"):
        if not line or line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "id":
            id_ = int(value) if _DIGITS.fullmatch(value) else None
        elif name == "event":
            event = value
        elif name == "data":
            data.append(value)
    return Block(id_, event, "\n".join(data) if data else None)


def check_since(since: Any) -> Optional[int]:
    if since is None:
        return None
    if isinstance(since, bool) or not isinstance(since, int) or not 0 <= since < 2**64:
        raise BadRequest(f"a watch's since is an event index from 0 to 2^64-1, not {since!r}", code="invalid_query")
    return since


def check_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str):
        raise BadRequest(f"a watch's prefix is a string, not {type(prefix).__name__}", code="invalid_query")
    return prefix


class WatchBase(Generic[C]):
    """What ``fenced.Watch`` and ``fenced.AsyncWatch`` hold alike: their client, the
    :class:`WatchState`, the stream (none while broken), the silence that breaks it and
    the reopening schedule."""

    def __init__(self, client: C, prefix: str, since: Optional[int]) -> None:
        self._client = client
        self._st = WatchState(prefix, since)
        self._resp: Any = None
        self._chunks: Any = None
        #: No byte for this long and the stream is reopened (tests shorten it).
        self._silence = SILENCE_MAX
        self._reopening = Reopening()

    @property
    def position(self) -> Optional[int]:
        """The last position the server told this watch (``None`` before the first)."""
        return self._st.position

    @property
    def prefix(self) -> str:
        return self._st.prefix

    def __repr__(self) -> str:
        return f"<fenced.{type(self).__name__} prefix={self.prefix!r} position={self.position}>"

    # The IO of each watch, which the flows below ask for (coroutine functions in AsyncWatch):
    # open the stream from the position (with :func:`reopen`); keep a response as the stream
    # (False when the watch was closed meanwhile: then it closes it); the next bytes of the
    # stream (``None`` at its end; a broken stream raises); close the stream; a pause
    # between two reopens (a close ends it).
    _is_closed: Callable[[], bool]
    _open: Callable[[], Any]
    _take: Callable[[Any], Any]
    _next_chunk: Callable[[], Any]
    _drop: Callable[[], Any]
    _pause: Callable[[float], Any]


def next_event(w: WatchBase[Any]) -> Flow[Optional[WatchEvent]]:
    """The next event of the watch; ``None`` once it is closed."""
    while not w._is_closed():
        event = yield from _step(w)
        if event is not None:
            return event
    return None


def opening(w: WatchBase[Any]) -> Flow[Optional[int]]:
    """``open()``: reads until a stream is open and the server told its position (the
    marker it sends first), keeping the events on the way for ``next``; the position."""
    while not w._is_closed() and not w._st.ready(w._chunks is not None):
        event = yield from _step(w, pending=False)  # reads more (the buffer was drained)
        if event is not None:
            w._st.pending.append(event)
    return w._st.position


def _step(w: WatchBase[Any], pending: bool = True) -> Flow[Optional[WatchEvent]]:
    """One step: an event of the bytes received, else (re)opening the stream or reading
    more of it; ``None`` when there is no event yet."""
    event = w._st.take(pending)
    if event is not None:
        return event
    if w._chunks is None:
        yield from _try_open(w)
        return None
    chunk = yield from _read(w)
    if chunk is None or not w._st.feed(chunk):
        yield Io(w._drop, ())
        w._st.broke()
        w._reopening.broke()
    else:
        w._reopening.flowing()
    return None


def _try_open(w: WatchBase[Any]) -> Flow[None]:
    """One try at (re)opening the stream, and the pause after a failed one
    (:class:`Reopening`); raises the last :class:`fenced.Unavailable` when it has gone on
    too long (a new ``next`` tries again)."""
    try:
        yield Io(w._open, ())
    except Unavailable:
        if w._is_closed():
            return
        pause = w._reopening.failed()
        if pause is None:
            raise
        yield Io(w._pause, (pause,))


def _read(w: WatchBase[Any]) -> Flow[Optional[bytes]]:
    """The next bytes of the stream; ``None`` when it broke, ended or fell silent."""
    try:
        chunk: Optional[bytes] = yield Io(w._next_chunk, ())
        return chunk
    except (httpx.HTTPError, httpx.StreamError, OSError, ssl.SSLError) as e:
        log.debug("the event stream of watch '%s' broke at position %s: %r", w.prefix, w.position, e)
        return None
    except Exception:  # noqa: BLE001 - a close from elsewhere can break the read any way
        if w._is_closed():
            return None
        raise


def reopen(w: WatchBase[Any], open_one: Callable[[int], Flow[Any]]) -> Flow[None]:
    """Opens the stream from the position (``open_one(member)``: its response, within the
    request time-out) on the member a call reaches, else after ``compacted`` on another
    (:func:`_elsewhere`), and keeps it unless the watch was closed meanwhile."""
    c = w._client
    try:
        resp, _ = yield from over(c, open_one, _core.now() + c.request_timeout)
    except Missed as e:
        resp = yield from _elsewhere(w, open_one, e)
    if (yield Io(w._take, (resp,))):
        w._st.opened()
        log.debug("watch of '%s' opened on %s after position %s", w.prefix, resp.url, w.position)


def _elsewhere(w: WatchBase[Any], open_one: Callable[[int], Flow[Any]], missed: Missed) -> Flow[Any]:
    """After the member that answered said ``compacted`` (a member restarted from a
    snapshot holds its events only from there on): each other member once, in turn, for
    one that still holds the events after the position. Indexes are the same on every
    member, so the stream resumes exactly where it was. :class:`Missed` only when none
    does, or none could be asked."""
    m = w._client._members
    for i in m.others():
        try:
            resp = yield from open_one(i)
        except Exception as e:  # noqa: BLE001 - any answer but the stream: the next member
            log.debug("watch of '%s': %s could not resume it either: %r", w.prefix, m.endpoints[i], e)
            continue
        m.set_current(i)
        return resp
    raise w._st.refused(missed) from None


class Reopening:
    """How long a broken watch goes on reopening its stream, and the pause between two
    tries: :data:`BACKOFF_FIRST` doubling up to :data:`BACKOFF_MAX`, for :data:`RETRY_FOR`
    since the stream broke. The flows above step it."""

    def __init__(self) -> None:
        #: Reopening gives up after this long without a stream.
        self.retry_for = RETRY_FOR
        self._broken_since: Optional[float] = None
        self._backoff = BACKOFF_FIRST

    def broke(self) -> None:
        """The stream broke (or was never opened): the time without one counts from now."""
        if self._broken_since is None:
            self._broken_since = _core.now()

    def flowing(self) -> None:
        """The stream gave bytes: a later break starts the count afresh."""
        self._broken_since, self._backoff = None, BACKOFF_FIRST

    def failed(self) -> Optional[float]:
        """A reopen failed: the pause before the next, or ``None`` when it has gone on too
        long (the caller raises; calling ``next`` again starts a new count)."""
        self.broke()
        assert self._broken_since is not None
        left = self._broken_since + self.retry_for - _core.now()
        if left <= 0:
            self.flowing()
            return None
        pause = min(self._backoff, left)
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)
        return pause


class WatchState:
    """What a watch knows, whichever stream it reads: its position, whether a stream was
    ever open, the bytes of a block not yet whole, and the error that ended it."""

    def __init__(self, prefix: str, since: Optional[int]) -> None:
        self.prefix = check_prefix(prefix)
        #: The last position the server told: the next stream starts exactly after it.
        self.position: Optional[int] = check_since(since)
        #: Whether a stream was ever open: from then on, a reopen needs the position.
        self.started = since is not None
        self.buf = bytearray()
        #: Events read ahead (by ``open``) and not yet handed out.
        self.pending: Deque[WatchEvent] = deque()
        #: A :class:`Missed` ends the watch: every later ``next`` raises it again.
        self.failed: Optional[Missed] = None

    def path(self) -> str:
        """The path of the next stream: from the position, or from now before any."""
        if self.failed is not None:
            raise self.failed
        query: Dict[str, str] = {}
        if self.prefix:
            query["prefix"] = _core.segment(self.prefix)
        if self.position is not None:
            query["since"] = str(self.position)
        elif self.started:
            raise self.fail(Missed("the event stream broke before the server told its position: events may have "
                                   "been missed", code="missed"))
        return "/v1/events" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")

    def fail(self, e: Missed) -> Missed:
        self.failed = e
        return e

    def refused(self, e: Missed) -> Missed:
        """The 410 ``compacted`` answer to a reopen, said with the position."""
        oldest = e.oldest_index
        return self.fail(Missed(
            f"events after index {self.position} are no longer held"
            + (f" (the oldest held is {oldest})" if oldest is not None else "") + f": {e.message}",
            code=e.code, status=e.status, details=e.details))

    def opened(self) -> None:
        self.started = True
        self.buf.clear()

    def broke(self) -> None:
        self.buf.clear()

    def feed(self, chunk: bytes) -> bool:
        """Bytes of the stream; ``False`` when a block grew past its bound (the stream is
        taken for broken)."""
        self.buf += chunk.replace(b"\r", b"")
        return len(self.buf) <= BLOCK_BYTES_MAX or b"\n\n" in self.buf

    def ready(self, streaming: bool) -> bool:
        """For ``open``: moves every event already received to the pending ones; True once
        a stream is open (``streaming``) and the server told its position."""
        while True:
            event = self.take(pending=False)
            if event is None:
                return streaming and self.position is not None
            self.pending.append(event)

    def take(self, pending: bool = True) -> Optional[WatchEvent]:
        """The next event: one read ahead (unless ``pending`` is false), else of the whole
        blocks received, handling markers on the way; ``None`` when more bytes are needed.
        Raises :class:`Missed` on ``lagged``."""
        if self.failed is not None:
            raise self.failed
        if pending and self.pending:
            return self.pending.popleft()
        while True:
            end = self.buf.find(b"\n\n")
            if end < 0:
                return None
            block = bytes(self.buf[:end])
            del self.buf[:end + 2]
            event = self.handle(block)
            if event is not None:
                return event

    def handle(self, raw: bytes) -> Optional[WatchEvent]:
        b = parse_block(raw.decode("utf-8", "replace"))
        if b.event == "lagged":
            missed: Optional[int] = None
            if b.data is not None:
                try:
                    v = json.loads(b.data).get("missed")
                    missed = v if _is_uint(v) else None
                except (ValueError, AttributeError):
                    pass
            raise self.fail(Missed(
                f"the event stream fell behind what the server holds after index {self.position}"
                + (f" ({missed} or more positions missed)" if missed is not None else ""),
                code="lagged", details={"missed": missed} if missed is not None else {}))
        event: Optional[WatchEvent] = None
        if b.data is not None:
            event = WatchEvent.from_json(b.data)
            if self.position is not None and event.index <= self.position:
                event = None  # already delivered (cannot happen with a server that resumes exactly)
        told = b.id if b.id is not None else (event.index if event is not None else None)
        if told is not None:
            self.position = told if self.position is None else max(self.position, told)
        return event
