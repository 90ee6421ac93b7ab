"""No server: the error table against docs/server.md, the answer mapping, configuration,
and the deadline arithmetic."""

from __future__ import annotations

import re

import pytest

import fenced
from fenced import _core, errors
from support import REPO, missing


def documented_codes() -> set:
    """Every error code docs/server.md gives with a status (``409 `stale_token```, lists
    like ``400 `invalid_name`, `invalid_lease_id```), details in parentheses left out."""
    path = REPO / "docs" / "server.md"
    if not path.is_file():
        missing(f"{path} is not there (the tests run from the repository)")
    text = re.sub(r"\([^()]*\)", "", path.read_text())
    codes = set()
    for m in re.finditer(r"\b[1-5]\d\d ((?:`[a-z][a-z0-9_]*`(?:, | and | or |,? )?)+)", text):
        codes.update(re.findall(r"`([a-z][a-z0-9_]*)`", m.group(1)))
    assert len(codes) > 30, f"the doc's table was not read: {sorted(codes)}"
    return codes


def test_every_documented_code_has_its_class() -> None:
    unmapped = sorted(c for c in documented_codes() if c not in fenced.ERROR_CODES)
    assert unmapped == [], f"codes of docs/server.md with no class: {unmapped}"


@pytest.mark.parametrize(
    "status, body, cls, fields",
    [
        (409, b'{"error":{"code":"stale_token","message":"m","token":3,"highest_seen":7}}', fenced.StaleToken,
         {"token": 3, "highest_seen": 7}),
        (409, b'{"error":{"code":"token_not_issued","message":"m","token":99,"highest_issued":9}}',
         fenced.TokenNotIssued, {"token": 99, "highest_issued": 9}),
        (409, b'{"error":{"code":"lock_held","message":"m","holder_token":4}}', fenced.LockHeld, {"holder_token": 4}),
        (503, b'{"error":{"code":"recovering","message":"grace","retry_after_ms":1500}}', fenced.Recovering,
         {"retry_after": 1.5}),
        (503, b'{"error":{"code":"too_busy","message":"m","retry_after_ms":200}}', fenced.TooBusy,
         {"retry_after": 0.2}),
        (503, b'{"error":{"code":"not_leader","message":"m","leader_id":2}}', fenced.NotLeader, {"leader_id": 2}),
        (404, b'{"error":{"code":"lease_not_found","message":"gone"}}', fenced.LeaseNotFound, {}),
        (428, b'{"error":{"code":"token_required","message":"m"}}', fenced.TokenRequired, {}),
        (401, b'{"error":{"code":"unauthorized","message":"m"}}', fenced.Unauthorized, {}),
        (403, b"forbidden", fenced.Forbidden, {}),
        (400, b'{"error":{"code":"ttl_out_of_range","message":"m","ttl_ms_min":100,"ttl_ms_max":300000}}',
         fenced.OutOfRange, {}),
        (413, b'{"error":{"code":"too_large","message":"m","limit_bytes":10}}', fenced.TooLarge, {"limit_bytes": 10}),
        (507, b'{"error":{"code":"insufficient_storage","message":"m"}}', fenced.StorageFull, {}),
        (500, b"boom", fenced.ServerError, {}),
        (429, b'{"error":{"code":"something_new","message":"m"}}', fenced.LimitReached, {}),
    ],
)
def test_answers_map_to_typed_errors(status: int, body: bytes, cls: type, fields: dict) -> None:
    e = errors.from_answer(status, body)
    assert type(e) is cls, (e, cls)
    assert isinstance(e, fenced.FencedError) and e.status == status and e.message
    for k, v in fields.items():
        assert getattr(e, k) == v, k


def test_error_families() -> None:
    assert issubclass(fenced.NotLeader, fenced.Unavailable)
    assert issubclass(fenced.Transport, fenced.Unavailable)
    assert issubclass(fenced.TooManyWaiters, fenced.Unavailable)
    assert issubclass(fenced.Forbidden, fenced.Unauthorized)
    assert issubclass(fenced.OutOfRange, fenced.BadRequest)
    lost = fenced.LockLost(fenced.LostReason.EXPIRED, "x")
    assert lost.code == "lock_lost" and lost.reason is fenced.LostReason.EXPIRED and lost.status is None


def test_endpoints_come_from_the_argument_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FENCED_ENDPOINT", "http://127.0.0.1:1, http://127.0.0.1:2/")
    assert fenced.Client().endpoints == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert fenced.Client(["http://a:1", "https://b:2"]).endpoints == ["http://a:1", "https://b:2"]
    monkeypatch.delenv("FENCED_ENDPOINT")
    assert fenced.Client().endpoints == [_core.ENDPOINT_DEFAULT]
    for bad in ("127.0.0.1:7400", "http://h:1/v1", "fenced://h:1", ""):
        with pytest.raises(fenced.BadRequest):
            fenced.Client(bad)


def test_attempt_timeout_is_the_arguments_else_the_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    two = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    monkeypatch.setenv("FENCED_ATTEMPT_TIMEOUT", "2s")
    assert fenced.Client(two)._members.attempt_timeout == 2.0
    assert fenced.Client(two, attempt_timeout=0.04)._members.attempt_timeout == 0.04
    monkeypatch.setenv("FENCED_ATTEMPT_TIMEOUT", "soon")
    with pytest.raises(fenced.BadRequest, match="FENCED_ATTEMPT_TIMEOUT"):
        fenced.Client(two)
    monkeypatch.setenv("FENCED_ATTEMPT_TIMEOUT", "5ms")
    with pytest.raises(fenced.BadRequest, match="at least 20 ms"):
        fenced.Client(two)
    assert _core.parse_duration("750ms") == 0.75 and _core.parse_duration("5m") == 300.0
    assert _core.parse_duration("250") == 0.25


def test_auth_token_and_ca_file_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("FENCED_AUTH_TOKEN", "s3cret")
    assert fenced.Client("http://127.0.0.1:1")._http.headers["authorization"] == "Bearer s3cret"
    monkeypatch.setenv("FENCED_CA_FILE", str(tmp_path / "absent.pem"))
    with pytest.raises(fenced.BadRequest, match="CA file"):
        fenced.Client("https://127.0.0.1:1")


def test_the_deadline_counts_from_the_send() -> None:
    t0, ttl = 100.0, 10.0
    assert _core.valid_until(t0, ttl, _core.default_margin(ttl)) == 109.0
    assert _core.valid_until(t0, ttl, 0.0) == 110.0
    assert _core.valid_until(t0, ttl, 60.0) == t0  # a margin past the TTL leaves nothing
    assert _core.next_keepalive(t0, 9.0) == 103.0
    # Two keepalive periods still leave the margin's worth before the deadline.
    assert _core.next_keepalive(t0, ttl) + ttl / 3 < _core.valid_until(t0, ttl, _core.default_margin(ttl))


def test_lease_ids_are_128_random_bits() -> None:
    ids = {_core.new_lease_id() for _ in range(100)}
    assert len(ids) == 100 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_names_stay_one_segment() -> None:
    assert _core.segment("orders/42") == "orders%2F42"
    assert _core.segment("a b?c#d%") == "a%20b%3Fc%23d%25"
    assert _core.segment("é") == "%C3%A9"
    with pytest.raises(fenced.BadRequest):
        _core.check_name("x" * 257)
    with pytest.raises(fenced.BadRequest):
        _core.check_token(0)


def test_the_event_stream_is_read_block_by_block() -> None:
    from fenced import _watch

    assert _watch.parse_block("id: 7\n: position") == (7, None, None)
    assert _watch.parse_block("id:8\nevent: granted\ndata: {\"a\":1}\ndata:2") == (8, "granted", '{"a":1}\n2')
    assert _watch.parse_block(": keep-alive").id is None
    assert _watch.parse_block("id: ٣").id is None, "only ASCII digits are an id"
    st = _watch.WatchState("w/", None)
    assert st.path() == "/v1/events?prefix=w%2F"
    grant = b'id: 5\r\nevent: granted\r\ndata: {"index":5,"type":"granted","at_ms":9,"name":"w/a","token":3,' \
            b'"ttl_ms":1000,"holder":"h"}\r\n\r\n'
    assert st.feed(b"id: 4\n: position\n\n" + grant[:30])
    assert st.take() is None and st.position == 4, "a marker moves the position and delivers nothing"
    st.feed(grant[30:] + b": keep-alive\n\n")
    e = st.take()
    assert e == fenced.WatchEvent(index=5, type="granted", at_ms=9, name="w/a", token=3, ttl_ms=1000, holder="h")
    assert e.data["holder"] == "h" and st.position == 5 and st.take() is None
    st.feed(grant)  # a repeat of what was delivered: skipped
    assert st.take() is None and st.position == 5
    assert st.path() == "/v1/events?prefix=w%2F&since=5"
    st.feed(b'id: 9\ndata: {"index":9,"type":"elected","at_ms":1,"x":2}\n\n')
    assert st.take().type == "elected", "a newer server's type is delivered as it came"
    st.feed(b'event: lagged\ndata: {"missed":40}\n\n')
    with pytest.raises(fenced.Missed) as missed:
        st.take()
    assert missed.value.code == "lagged" and missed.value.details == {"missed": 40}
    with pytest.raises(fenced.Missed):
        st.path()  # over: no reopen with a gap
    with pytest.raises(fenced.ServerError):
        _watch.WatchState("", 0).handle(b"id: 1\ndata: not json")
    broke = _watch.WatchState("", None)
    assert broke.path() == "/v1/events"
    broke.opened()
    with pytest.raises(fenced.Missed) as missed:
        broke.path()  # opened, broken before the server told where it started
    assert missed.value.code == "missed"
    assert not _watch.WatchState("", None).feed(b"x" * (_watch.BLOCK_BYTES_MAX + 1)), "an endless block breaks"
    for bad in (-1, "3", True, 2**64):
        with pytest.raises(fenced.BadRequest):
            _watch.WatchState("", bad)


def test_compacted_is_missed_with_the_oldest_index() -> None:
    e = errors.from_answer(410, b'{"error":{"code":"compacted","message":"gone","oldest_index":42}}')
    assert type(e) is fenced.Missed and e.oldest_index == 42 and e.status == 410
    assert type(errors.from_answer(410, b"gone")) is fenced.Missed
