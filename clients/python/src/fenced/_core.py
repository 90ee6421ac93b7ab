"""What the sync and the async client share: configuration, the deadline rule, what calls
learn of the members of a cluster, and the check of the server's API.

No network IO happens here; the flows of ``_flow`` use these pieces, and the two clients
each perform the flows' IO their own way (threads and httpx.Client, or tasks and
httpx.AsyncClient), so the rules exist once.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import ssl
import threading
import time
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union
from urllib.parse import quote

import httpx

from .errors import (
    BadRequest,
    ConfigError,
    FencedError,
    Recovering,
    ServerError,
    ShuttingDown,
    TooManyConnections,
    Transport,
    UnsupportedServer,
    from_answer,
)

#: The endpoint used when neither the caller nor ``FENCED_ENDPOINT`` names one.
ENDPOINT_DEFAULT = "http://127.0.0.1:7400"
#: A cluster's default election time-out (300 to 600 ms) plus a margin (docs/client.md).
ATTEMPT_TIMEOUT_DEFAULT = 0.75
#: Half of it bounds a liveness probe, which must leave a live member time to answer.
ATTEMPT_TIMEOUT_MIN = 0.02
#: Between rounds over every member while none takes the call.
ROUND_PAUSE = 0.1
#: Tries of a request whose connection could not be opened, with one endpoint.
CONNECT_ATTEMPTS_MAX = 4
#: The default margin is a tenth of the TTL.
MARGIN_DIVISOR = 10
#: Lock names are UTF-8 of 1 to 256 bytes (the server's default bound).
NAME_BYTES_MAX = 256

Endpoints = Union[str, Sequence[str], None]


def now() -> float:
    """The one clock of every deadline: monotonic, never the wall clock."""
    return time.monotonic()


# --- the deadline (validity.rs) --------------------------------------------------------


def default_margin(ttl: float) -> float:
    return ttl / MARGIN_DIVISOR


def valid_until(sent_at: float, ttl: float, margin: float) -> float:
    """The client-side deadline of a lease whose last successful acquire or keepalive was
    *sent* at ``sent_at``: the server started or renewed the lease after the send, so its
    own expiry is no earlier than ``sent_at + ttl``. A margin of the TTL or more leaves
    nothing, never a deadline before the send."""
    return sent_at + max(0.0, ttl - margin)


def next_keepalive(sent_at: float, ttl: float) -> float:
    """A third of the TTL after the last successful send: two more tries fit before the
    deadline."""
    return sent_at + ttl / 3.0


# --- configuration ---------------------------------------------------------------------


def parse_duration(s: str) -> float:
    """``750ms``, ``2s``, ``5m``, ``1h`` or bare milliseconds, as the Rust client reads
    ``FENCED_ATTEMPT_TIMEOUT``: seconds."""
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h)?\s*", s)
    if not m:
        raise BadRequest(f"'{s}' is not a duration: write it like 750ms, 90s, 10m or 1h", code="invalid_duration")
    scale = {None: 0.001, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]
    return int(m.group(1)) * scale


def endpoints_from(given: Endpoints) -> List[str]:
    """The endpoint URLs: given as one (commas allowed) or a list, else ``FENCED_ENDPOINT``
    (commas allowed), else :data:`ENDPOINT_DEFAULT`. Each must be ``http(s)://host:port``."""
    if given is None:
        given = os.environ.get("FENCED_ENDPOINT") or ENDPOINT_DEFAULT
    parts = [given] if isinstance(given, str) else list(given)
    urls = [u.strip() for p in parts for u in p.split(",") if u.strip()]
    if not urls:
        raise BadRequest("no endpoint given", code="invalid_endpoint")
    out = []
    for u in urls:
        base = u.rstrip("/")
        m = re.fullmatch(r"(https?)://([^/?#]+)", base)
        if not m:
            hint = " (fenced:// is the Rust client's wire protocol; use http://)" if base.startswith("fenced://") else ""
            raise BadRequest(
                f"endpoint '{u}' must be http://HOST:PORT or https://HOST:PORT with no path{hint}",
                code="invalid_endpoint",
            )
        out.append(base)
    return out


def auth_from(given: Optional[str]) -> Optional[str]:
    token = given if given is not None else (os.environ.get("FENCED_AUTH_TOKEN") or None)
    if token is not None and any(c in token for c in "\r\n"):
        raise BadRequest("the auth token has characters a header cannot carry", code="invalid_auth_token")
    return token


def ca_from(given: Optional[str]) -> Optional[str]:
    path = given if given is not None else (os.environ.get("FENCED_CA_FILE") or None)
    if path is not None and not os.path.isfile(path):
        raise ConfigError(f"CA file {path}: no such file", code="invalid_ca_file")
    return path


class ClientCert(NamedTuple):
    """This client's certificate chain and private key, PEM files, and the names they were
    given under (the arguments or the environment variables), for the error messages."""

    cert: str
    key: str
    names: Tuple[str, str]


def client_cert_from(cert: Optional[str], key: Optional[str]) -> Optional[ClientCert]:
    """The client certificate for a server with ``client_ca``, as the Rust client takes it:
    the pair given (``client_cert`` and ``client_key``), else ``FENCED_CLIENT_CERT`` and
    ``FENCED_CLIENT_KEY``, else none. The two go together, never one from each place, and
    one without the other is refused here rather than left for the server to 401."""
    if cert is not None or key is not None:
        names = ("client_cert", "client_key")
        pair = (cert, key)
    else:
        names = ("FENCED_CLIENT_CERT", "FENCED_CLIENT_KEY")
        pair = (os.environ.get(names[0]) or None, os.environ.get(names[1]) or None)
    if pair == (None, None):
        return None
    if pair[0] is None or pair[1] is None:
        given, absent = (names[1], names[0]) if pair[0] is None else names
        raise ConfigError(f"{names[0]} and {names[1]} go together: {given} is set and {absent} is not",
                          code="invalid_client_cert")
    for n, path in zip(names, pair):
        if not os.path.isfile(path):
            raise ConfigError(f"{n} {path}: no such file", code="invalid_client_cert")
    return ClientCert(pair[0], pair[1], names)


def tls_verify(ca: Optional[str], client: Optional[ClientCert]) -> Any:
    """httpx's ``verify``: ``True`` (its certifi roots) when nothing is configured, else an
    SSL context trusting ``ca`` (or certifi's roots) and presenting ``client``'s certificate
    to a server that asks for one. Only ``https://`` endpoints use it: on ``http://`` there
    is no handshake, so a client certificate is read and checked here but never sent (as
    in the Rust client)."""
    if ca is None and client is None:
        return True
    if ca is None:
        import certifi  # httpx's own dependency: the roots verify=True would use

        ca_path, ca_name = certifi.where(), "certifi's roots"
    else:
        ca_path, ca_name = ca, f"CA file {ca}"
    try:
        ctx = ssl.create_default_context(cafile=ca_path)
    except (ssl.SSLError, OSError) as e:
        raise ConfigError(f"{ca_name}: not PEM certificates ({e})", code="invalid_ca_file") from None
    if client is not None:
        where = f"{client.names[0]} {client.cert} and {client.names[1]} {client.key}"
        try:
            ctx.load_cert_chain(certfile=client.cert, keyfile=client.key)
        except ssl.SSLError as e:
            why = "the key is not the certificate's" if e.reason == "KEY_VALUES_MISMATCH" else \
                "not a PEM certificate chain and its unencrypted private key"
            raise ConfigError(f"{where}: {why} ({e})", code="invalid_client_cert") from None
        except OSError as e:
            raise ConfigError(f"{where}: {e}", code="invalid_client_cert") from None
    return ctx


#: Alerts a server sends when it refuses the client's certificate in the handshake.
_CERT_ALERT = re.compile(r"ALERT_(UNKNOWN_CA|BAD_CERTIFICATE|CERTIFICATE_\w+|UNSUPPORTED_CERTIFICATE|ACCESS_DENIED)")


def tls_refusal(e: BaseException) -> Optional[str]:
    """The reason (``TLSV1_ALERT_UNKNOWN_CA``, ...) when ``e`` comes of the server refusing
    this client's certificate. With TLS 1.3 the client's side of the handshake is over
    before the server has judged the certificate, so the refusal surfaces as an error
    reading the answer, yet the server read no request: it was never taken."""
    seen = 0
    x: Optional[BaseException] = e
    while x is not None and seen < 8:
        if isinstance(x, ssl.SSLError) and _CERT_ALERT.search(str(x.reason or x)):
            return str(x.reason or x)
        x = x.__cause__ or x.__context__
        seen += 1
    return None


def attempt_timeout_from(given: Optional[float]) -> float:
    if given is not None:
        t = float(given)
    else:
        env = os.environ.get("FENCED_ATTEMPT_TIMEOUT", "")
        try:
            t = parse_duration(env) if env.strip() else ATTEMPT_TIMEOUT_DEFAULT
        except BadRequest as e:
            raise BadRequest(f"FENCED_ATTEMPT_TIMEOUT: {e.message}", code="invalid_duration") from None
    if t < ATTEMPT_TIMEOUT_MIN:
        raise BadRequest(f"the attempt time-out must be at least {int(ATTEMPT_TIMEOUT_MIN * 1000)} ms",
                         code="invalid_duration")
    return t


def check_name(name: str, what: str = "lock name") -> str:
    if not isinstance(name, str) or not 1 <= len(name.encode("utf-8")) <= NAME_BYTES_MAX:
        raise BadRequest(f"a {what} is UTF-8 of 1 to {NAME_BYTES_MAX} bytes", code="invalid_name")
    return name


def check_holder(holder: Any) -> Optional[str]:
    """A holder label is a string or ``None``; its length and characters are the server's to
    judge (400 ``invalid_holder``), so that the rule lives in one place."""
    if holder is not None and not isinstance(holder, str):
        raise BadRequest(f"a holder label is a string, not {type(holder).__name__}", code="invalid_holder")
    return holder


def check_names(names: Any) -> List[str]:
    """The names of a set (``lock_all``): one or more valid names, sorted, repeats dropped,
    the order the server grants them in."""
    if not isinstance(names, (list, tuple)) or not names:
        raise BadRequest("lock_all needs a list of one or more names", code="invalid_names")
    for n in names:
        check_name(n)
    return sorted(set(names))


def check_acquire(name: str, ttl: float, wait: float, margin: Optional[float],
                  holder: Optional[str]) -> Tuple[int, int]:
    """What an acquire checks before it sends anything: its TTL and wait in ms, or
    :class:`fenced.BadRequest`."""
    check_name(name)
    check_holder(holder)
    ttl_ms, wait_ms = ms(ttl), ms(wait)
    if ttl_ms < 1:
        raise BadRequest("the TTL must be at least 1 ms", code="ttl_out_of_range")
    if wait < 0:
        raise BadRequest("the wait cannot be negative", code="wait_out_of_range")
    if margin is not None and not margin >= 0:
        raise BadRequest("the margin cannot be negative: the deadline would outlive the lease",
                         code="invalid_margin")
    return ttl_ms, wait_ms


def read_set_grant(answer: Dict[str, Any],
                   names: Optional[List[str]]) -> Tuple[Dict[str, Any], Dict[str, int], Dict[str, str]]:
    """``answer`` to one acquire (``names`` is ``None``) as it is; to a set, its first grant
    and every name's token, checked against the names asked for. Last, every lock's
    signature (hex) when the service signs grants (all of them, or none)."""
    if names is None:
        sig = answer.get("signature")
        return answer, {}, ({answer.get("name", ""): sig} if isinstance(sig, str) else {})
    grants = answer.get("grants")
    if not isinstance(grants, list) or [g.get("name") for g in grants if isinstance(g, dict)] != names:
        raise ServerError(f"asked for locks {names}, granted {answer}", code="bad_response")
    if any(g.get("lease_id") != answer.get("lease_id") for g in grants):
        raise ServerError("the locks of one request were granted under different leases", code="bad_response")
    tokens: Dict[str, int] = {}
    for g in grants:
        if not isinstance(g.get("token"), int) or g["token"] < 1:
            raise ServerError(f"a grant without a token: {g}", code="bad_response")
        tokens[g["name"]] = g["token"]
    signatures = {g["name"]: g["signature"] for g in grants if isinstance(g.get("signature"), str)}
    return grants[0], tokens, (signatures if len(signatures) == len(grants) else {})


def acquire_body(lease_id: str, ttl_ms: int, wait_ms: int, holder: Optional[str]) -> Dict[str, Any]:
    """The body of ``POST /v1/locks/{name}/acquire`` under an implicit lease: ``"holder"``
    only when given, the same on every attempt of one call."""
    body: Dict[str, Any] = {"lease_id": lease_id, "ttl_ms": ttl_ms, "wait_ms": wait_ms}
    if holder is not None:
        body["holder"] = holder
    return body


def acquire_request(name: str, lease_id: str, ttl_ms: int, wait_ms: int, holder: Optional[str],
                    names: Optional[List[str]]) -> Tuple[str, bytes]:
    """The path and JSON body of one acquire under the implicit lease ``lease_id`` (the
    caller drew it): ``{"lease_id", "ttl_ms", "wait_ms"}``, and ``"holder"`` when given;
    with ``names``, of every one of them together. Sent twice with the same id, it gets the
    same grant."""
    path = f"/v1/locks/{segment(name)}/acquire" if names is None else "/v1/locks/acquire"
    body = acquire_body(lease_id, ttl_ms, wait_ms, holder)
    if names is not None:
        body["names"] = names
    return path, json.dumps(body).encode()


class Acquiring:
    """One acquire call's rule for asking again (:func:`fenced._flow.acquire` steps it):
    its implicit lease, its deadlines, the send time of the first attempt that may have
    reached a member, and whether the lease must be given back if the call ends now."""

    def __init__(self, wait_ms: int, request_timeout: float, members: int) -> None:
        #: The implicit lease every attempt of this call asks under.
        self.lease = new_lease_id()
        self.started = now()
        #: When the wait in the server's queue is over.
        self.give_up_at = self.started + wait_ms / 1000.0
        #: When the whole call is over, failovers included.
        self.deadline = self.give_up_at + request_timeout
        self._several = members > 1
        #: The send time of the attempt that was granted, or of the first whose answer was
        #: lost (the grant, if any, dates from it).
        self.sent_at: Optional[float] = None
        #: Whether the lease is revoked when the call ends now: something may have been
        #: granted under it that nobody will hold.
        self.give_back = True

    def wait_left(self) -> float:
        """What is left of the wait, for the next attempt to ask the server for."""
        return max(0.0, self.give_up_at - now())

    def granted(self, sent: float) -> None:
        """An attempt sent at ``sent`` was granted."""
        self.give_back = False
        self.sent_at = sent if self.sent_at is None else self.sent_at

    def failed(self, e: FencedError, sent: float) -> Optional[float]:
        """An attempt sent at ``sent`` ended in ``e``: the pause before asking again, or
        ``None`` when the call raises ``e``."""
        if isinstance(e, (Recovering, ShuttingDown, TooManyConnections)):
            # Refused before anything was granted: safe to ask again within the wait.
            if isinstance(e, ShuttingDown) and self._several:
                return None  # every member was tried: the moves-on rule already ran out
            left = self.give_up_at - now()
            if left <= 0:
                self.give_back = self.sent_at is not None  # an earlier attempt's answer may have been lost
                return None
            return min(e.retry_after or 0.2, left)
        if isinstance(e, Transport):
            if not e.sent and not getattr(e, "uncertain", False) and self.sent_at is None:
                self.give_back = False  # no attempt reached a server: nothing to give back
                return None
            # The answer was lost after the request may have reached the server: ask again
            # under the same lease id, which gets the same grant, if there is time (with
            # several members the failover loop already did so).
            self.sent_at = sent if self.sent_at is None else self.sent_at
            if not e.sent or self._several or now() + ROUND_PAUSE >= self.deadline:
                return None
            return ROUND_PAUSE
        self.give_back = moves_on(e)
        return None


def check_token(token: Any) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token < 2**64:
        raise BadRequest(f"a token is an integer from 1 to 2^64-1, not {token!r}", code="invalid_token")
    return token


def ms(seconds: float) -> int:
    """Seconds as whole milliseconds (what the API takes)."""
    return max(0, int(round(seconds * 1000)))


def segment(s: str) -> str:
    """One path segment: every byte but RFC 3986's unreserved ones percent-encoded, ``/``
    too, so that ``orders/42`` stays one segment."""
    return quote(s, safe="-._~")


def new_lease_id() -> str:
    """128 random bits from the OS: the id of an implicit acquire's lease."""
    return secrets.token_hex(16)


# --- the members of a cluster (failover.rs) ---------------------------------------------


class Members:
    """The members a client knows and what its calls have learnt of them: the one that
    answered last (calls start there), the last proof of life of each, and which were
    found silent (skipped by every call for one attempt time-out). Thread-safe."""

    def __init__(self, endpoints: List[str], attempt_timeout: float) -> None:
        self.endpoints = endpoints
        self.attempt_timeout = attempt_timeout
        self._lock = threading.Lock()
        self._current = 0
        self._answered_at = [0.0] * len(endpoints)
        self._silent_until = [0.0] * len(endpoints)

    @property
    def current(self) -> int:
        return self._current

    def set_current(self, i: int) -> None:
        self._current = i

    def mark_answered(self, i: int) -> None:
        with self._lock:
            self._answered_at[i] = max(self._answered_at[i], now())
            self._silent_until[i] = 0.0

    def answered_within(self, i: int, d: float) -> bool:
        at = self._answered_at[i]
        return at > 0 and now() - at < d

    def mark_silent(self, i: int) -> None:
        with self._lock:
            self._silent_until[i] = max(self._silent_until[i], now() + self.attempt_timeout)

    def found_silent_since(self, i: int, since: float) -> bool:
        """Found silent by a probe that ended at or after ``since`` (an older verdict does
        not count: this member was tried anyway)."""
        until = self._silent_until[i]
        return until > now() and until - self.attempt_timeout >= since

    def is_silent(self, i: int) -> bool:
        return self._silent_until[i] > now()

    def others(self) -> Iterator[int]:
        """Every member but the current one, once each, in turn after it."""
        n = len(self.endpoints)
        first = self._current
        return ((first + k) % n for k in range(1, n))

    def skip(self, i: int) -> bool:
        """Skipped this round: found silent, unless every member was."""
        return self.is_silent(i) and not all(self.is_silent(j) for j in range(len(self.endpoints)))


class ClientBase:
    """What ``fenced.Client`` and ``fenced.AsyncClient`` share: their settings, read and
    checked once here, and what they know of the members. Each opens its own httpx client
    in :meth:`_open`, with the headers and TLS settings given."""

    def __init__(
        self,
        endpoints: Endpoints = None,
        *,
        auth_token: Optional[str] = None,
        ca_file: Optional[str] = None,
        client_cert: Optional[str] = None,
        client_key: Optional[str] = None,
        request_timeout: float = 10.0,
        connect_timeout: float = 3.0,
        attempt_timeout: Optional[float] = None,
        check_server: bool = True,
    ) -> None:
        urls = endpoints_from(endpoints)
        self._auth = auth_from(auth_token)
        verify = tls_verify(ca_from(ca_file), client_cert_from(client_cert, client_key))
        self._members = Members(urls, attempt_timeout_from(attempt_timeout))
        self.request_timeout = float(request_timeout)
        self.connect_timeout = float(connect_timeout)
        self._check_server = check_server
        #: The server version of each member checked (``check_api``), by index.
        self._checked: Dict[int, str] = {}
        headers = {"user-agent": "fenced-client-python/0.1.0"}
        if self._auth is not None:
            headers["authorization"] = f"Bearer {self._auth}"
        self._open(headers, verify)

    def _open(self, headers: Dict[str, str], verify: Any) -> None:
        raise NotImplementedError

    @property
    def endpoints(self) -> List[str]:
        return list(self._members.endpoints)

    @property
    def endpoint(self) -> str:
        """The member that answered last."""
        return self._members.endpoints[self._members.current]

    def server_version(self) -> Optional[str]:
        """The version (``info.version`` of ``/openapi.json``) of the current member, once
        checked."""
        return self._checked.get(self._members.current)

    def _request_timeouts(self, timeout: float) -> httpx.Timeout:
        """One request's time-outs: ``timeout`` for each phase, the connect within it too."""
        return httpx.Timeout(timeout, connect=min(self.connect_timeout, timeout))

    def _stream_timeouts(self, silence: float) -> httpx.Timeout:
        """An event stream's time-outs: at most ``silence`` between two bytes (httpx's read
        time-out); the connect, the write and the pool within the request time-out."""
        return httpx.Timeout(silence, connect=min(self.connect_timeout, self.request_timeout),
                             write=self.request_timeout, pool=self.request_timeout)


class Reply(NamedTuple):
    """One answer as both clients read it: status, headers, the whole body."""

    status: int
    headers: httpx.Headers
    body: bytes

    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            raise ServerError(f"could not parse the server's answer: {self.body[:200]!r}", code="bad_response",
                              status=self.status) from None

    def error(self) -> FencedError:
        return from_answer(self.status, self.body)


class Reconnect:
    """A request whose connection could not be opened is tried again (it never left), with
    one endpoint only (with several the call moves on instead): up to
    :data:`CONNECT_ATTEMPTS_MAX` tries, 50 ms apart, doubling."""

    def __init__(self, members: int) -> None:
        self._left = CONNECT_ATTEMPTS_MAX if members == 1 else 1
        self._backoff = 0.05

    def pause(self, e: Transport) -> Optional[float]:
        """The pause before the next try after ``e``, or ``None`` when ``e`` is raised."""
        self._left -= 1
        if e.sent or self._left <= 0 or e.code == "tls_refused":
            return None
        pause, self._backoff = self._backoff, self._backoff * 2
        return pause


#: The connections an httpx client of ``fenced`` keeps.
HTTP_LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=16)


class Walk:
    """One call's walk over the members (failover.rs): which member to try next, what each
    attempt's outcome teaches, and the error once none answered in time
    (:func:`fenced._flow.over` steps it)."""

    def __init__(self, members: Members, deadline: float) -> None:
        self._m = members
        self._deadline = deadline
        self._started = now()
        #: Whether an attempt may have reached a member (then its effect is unknown).
        self.uncertain = False
        self._last: Optional[FencedError] = None

    def members(self) -> Iterator[Optional[int]]:
        """The members to try in turn from the current one, skipping the silent: an index,
        or ``None`` where a round ends (the caller pauses ``ROUND_PAUSE``). Ends when no
        further round fits before the deadline."""
        n = len(self._m.endpoints)
        first = self._m.current
        k = 0
        while True:
            i = (first + k) % n
            if not self._m.skip(i):
                yield i
            k += 1
            if k % n == 0:
                if now() + ROUND_PAUSE > self._deadline:
                    return
                yield None

    def answered(self, i: int, exc: Optional[FencedError]) -> bool:
        """Member ``i`` answered (``exc``: its error). True when that ends the call: its
        value, or an error that does not move on (marked ``uncertain``, for the caller to
        raise); False when the call moves on to the next member."""
        if exc is None or not moves_on(exc):
            if exc is None:
                self._m.mark_answered(i)
            self._m.set_current(i)
            if exc is not None:
                exc.uncertain = self.uncertain  # type: ignore[attr-defined]
            return True
        self.uncertain = self.uncertain or not (isinstance(exc, Transport) and not exc.sent)
        self._last = exc
        return False

    def attempted(self, i: int, kind: str, exc: Optional[FencedError]) -> bool:
        """The outcome of an attempt on member ``i`` (``answered``, with ``exc`` its error,
        ``silent`` or ``timedout``): True when the call returns the attempt's value; raises
        the error that ends the call; False when it moves on to the next member."""
        if kind == "answered":
            if not self.answered(i, exc):
                return False
            if exc is not None:
                raise exc
            return True
        if kind == "silent":
            self.silent(i)
            return False
        raise self.failure()

    def silent(self, i: int) -> None:
        """Member ``i`` said nothing for an attempt time-out: the call moves on."""
        self.uncertain = True
        self._last = Transport(f"{self._m.endpoints[i]}: silent for {int(self._m.attempt_timeout * 1000)} ms; moved on")

    def failure(self) -> FencedError:
        """What the call raises when the walk ended without an answer that ends it."""
        if self._last is not None and now() < self._deadline:
            self._last.uncertain = self.uncertain  # type: ignore[attr-defined]
            return self._last
        err = Transport(
            f"no member answered within {int((self._deadline - self._started) * 1000)} ms "
            f"(tried {', '.join(self._m.endpoints)})"
            + (f"; last: {self._last.message}" if self._last is not None else ""),
            sent=self.uncertain,
        )
        err.uncertain = self.uncertain  # type: ignore[attr-defined]
        return err


def moves_on(e: Optional[BaseException]) -> bool:
    """Whether a call moves on to the next member after this outcome: the member could
    not be reached, is not the leader, or is shutting down (nothing was done)."""
    from .errors import NotLeader, ShuttingDown, Transport

    return isinstance(e, (Transport, NotLeader, ShuttingDown))


# --- the server's API (checked once per endpoint) --------------------------------------

#: The routes of API v1 this client calls, as ``/openapi.json`` spells them.
API_ROUTES = (
    ("post", "/v1/locks/{name}/acquire"),
    ("post", "/v1/leases/{lease_id}/keepalive"),
    ("delete", "/v1/leases/{lease_id}"),
    ("put", "/v1/store/{key}"),
    ("get", "/v1/store/{key}"),
)


def check_api(endpoint: str, status: int, body: bytes) -> str:
    """Checks the answer of ``GET /openapi.json``: a Fenced server (``info.title``) whose
    document lists every route of API v1 this client calls, each with its method. Returns
    the server's version (``info.version``, the crate version); raises
    :class:`UnsupportedServer` with what is missing."""

    def refuse(why: str) -> UnsupportedServer:
        return UnsupportedServer(
            f"{endpoint} does not speak Fenced's API v1, which this client needs: {why}",
            details={"endpoint": endpoint},
        )

    if status == 404:
        raise refuse("it has no /openapi.json (GET answered 404): not a Fenced server, or one older than API v1")
    if status != 200:
        raise refuse(f"GET /openapi.json answered HTTP {status}")
    try:
        doc = json.loads(body)
    except ValueError:
        raise refuse("/openapi.json is not JSON") from None
    info = doc.get("info") if isinstance(doc, dict) else None
    if not isinstance(info, dict) or info.get("title") != "Fenced":
        raise refuse(f"its API document is not Fenced's (info.title {info.get('title') if isinstance(info, dict) else None!r})")
    version = str(info.get("version", ""))
    paths = doc.get("paths") if isinstance(doc.get("paths"), dict) else {}
    missing = [f"{m.upper()} {p}" for m, p in API_ROUTES if not isinstance(paths.get(p), dict) or m not in paths[p]]
    if missing:
        raise refuse(f"server version {version or '?'} lacks {', '.join(missing)}")
    return version


def transport_error(endpoint: str, what: str, exc: BaseException, sent: bool) -> FencedError:
    from .errors import Transport

    return Transport(f"{endpoint}: {what}: {exc.__class__.__name__}: {exc}".rstrip(": "), sent=sent)


def http_failure(url: str, timeout: float, e: BaseException) -> Transport:
    """What a request that failed in httpx (``e``) becomes: :class:`Transport`, with
    ``sent=False`` when it cannot have reached the server (no connection, or the server
    refused this client's certificate: ``tls_refused``, which trying again will not
    change)."""
    refusal = tls_refusal(e)
    if refusal is not None:
        return Transport(f"{url}: the server refused this client's TLS certificate ({refusal})", sent=False,
                         code="tls_refused")
    if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
        return Transport(f"{url}: cannot connect: {e}", sent=False)
    if isinstance(e, httpx.TimeoutException):
        return Transport(f"{url}: no answer within {int(timeout * 1000)} ms", sent=True)
    return Transport(f"{url}: {e.__class__.__name__}: {e}", sent=True)
