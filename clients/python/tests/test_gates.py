"""The gates, each against the real thing: SQLite always, PostgreSQL (initdb + pg_ctl in a
temp dir), S3 (moto's server), DynamoDB (DynamoDB Local). Each runs the Rust adapters'
three scenarios: a stale token is refused and changes nothing; interleaved holders with
real tokens leave the newer value; the counter workload with a holder paused past its
lease loses no update. Missing components skip, or fail under CI=true."""

from __future__ import annotations

import itertools
import sqlite3
import threading
from typing import Any, Iterator, List

import pytest

import fenced
from fenced import gates
from support import DynamoLocal, Moto, Postgres, Server

_n = itertools.count()


# --- the scenarios ------------------------------------------------------------------------


def stale_token_is_refused_and_changes_nothing(g: Any, key: str) -> None:
    g.write(key, b"five", token=5)
    with pytest.raises(fenced.StaleToken) as e:
        g.write(key, b"three", token=3)
    assert (e.value.token, e.value.highest_seen) == (3, 5)
    with pytest.raises(fenced.StaleToken) as e:
        g.read(key, token=2)
    assert (e.value.token, e.value.highest_seen) == (2, 5)
    assert g.read(key, token=5) == b"five"
    g.write(key, b"five again", token=5)  # equal tokens pass: a holder writes many times
    # A fenced read by a newer holder shuts the older one out before it writes anything.
    assert g.read(key, token=9) == b"five again"
    with pytest.raises(fenced.StaleToken) as e:
        g.write(key, b"zombie", token=5)
    assert (e.value.token, e.value.highest_seen) == (5, 9)
    assert g.read(key, token=9) == b"five again"
    # A fenced read of a key never written leaves the mark behind.
    fresh = key + "-fresh"
    assert g.read(fresh, token=7) is None
    with pytest.raises(fenced.StaleToken):
        g.write(fresh, b"late", token=6)


def interleaved_writers_leave_the_newer_value(c: fenced.Client, g: Any, key: str, lock: str) -> None:
    old = c.try_lock(lock, ttl=5.0)
    g.write(key, b"old 1", token=old.token)
    old.release()
    with c.try_lock(lock, ttl=5.0) as new:
        assert new.token > old.token
        g.write(key, b"new 1", token=new.token)
        with pytest.raises(fenced.StaleToken) as e:
            g.write(key, b"old 2", token=old.token)
        assert (e.value.token, e.value.highest_seen) == (old.token, new.token)
        g.write(key, b"new 2", token=new.token)
        assert g.read(key, token=new.token) == b"new 2"


def counter_workload_loses_no_update(c: fenced.Client, g: Any, key: str, lock: str, rounds: int = 3) -> None:
    """A holder reads v, is paused past its lease, and writes v + 1 when it wakes;
    meanwhile the next holder increments. Every acknowledged increment is in the end."""
    acked = refused = 0

    def read_counter(token: int) -> int:
        v = g.read(key, token=token)
        return int(v) if v else 0

    for _ in range(rounds):
        paused = c.lock(lock, ttl=0.6, wait=10.0)
        seen = read_counter(paused.token)
        paused._pause_keepalive(True)  # the injected pause: no keepalive, no write
        with c.lock(lock, ttl=5.0, wait=10.0) as nxt:
            assert nxt.token > paused.token
            v = read_counter(nxt.token)
            g.write(key, str(v + 1).encode(), token=nxt.token)
            acked += 1
        try:  # the paused holder wakes up and writes what it computed before the pause
            g.write(key, str(seen + 1).encode(), token=paused.token)
            acked += 1
        except fenced.StaleToken:
            refused += 1
        assert paused.lost_reason is not None, "the paused holder's guard knows it lost the lock"
    with c.lock(lock, ttl=5.0, wait=10.0) as last:
        total = read_counter(last.token)
    assert total == acked, "every acknowledged increment is in the final value"
    assert refused == rounds, "each late write was refused"


def race_of_writers_the_highest_token_wins(g: Any, key: str, n: int = 16) -> None:
    """n writers, tokens 1..n, all at once on one key: the value of token n wins, every
    refusal names a newer mark, writer n is never refused."""
    outcomes: List[Any] = []
    barrier = threading.Barrier(n)

    def writer(token: int) -> None:
        barrier.wait(timeout=30)
        try:
            g.write(key, f"w{token}".encode(), token=token)
            outcomes.append((token, None))
        except Exception as e:  # noqa: BLE001 - asserted below
            outcomes.append((token, e))

    threads = [threading.Thread(target=writer, args=((i * 7) % n + 1,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(outcomes) == n
    for token, e in outcomes:
        if e is not None:
            assert isinstance(e, fenced.StaleToken), e
            assert e.token == token and e.highest_seen > token and token != n
    assert g.read(key, token=n) == f"w{n}".encode()
    with pytest.raises(fenced.StaleToken):
        g.read(key, token=n - 1)


def every_scenario(c: fenced.Client, g: Any, tag: str) -> None:
    k = f"{tag}-{next(_n)}"
    stale_token_is_refused_and_changes_nothing(g, f"{k}/stale")
    interleaved_writers_leave_the_newer_value(c, g, f"{k}/interleaved", f"{tag}/lock/{k}/interleaved")
    counter_workload_loses_no_update(c, g, f"{k}/counter", f"{tag}/lock/{k}/counter")


@pytest.fixture(scope="module")
def client(server: Server) -> fenced.Client:
    return fenced.Client(server.url)


# --- SQLite ---------------------------------------------------------------------------------


def test_sqlite(client: fenced.Client, tmp_path: Any) -> None:
    g = gates.SqliteKv(str(tmp_path / "kv.db"))
    every_scenario(client, g, "sqlite")
    race_of_writers_the_highest_token_wins(g, "race")
    # Another connection to the same file sees the gate's work.
    other = gates.SqliteKv(str(tmp_path / "kv.db"))
    assert other.value("race") == b"w16"


def test_sqlite_gate_on_an_existing_table(tmp_path: Any) -> None:
    db = sqlite3.connect(str(tmp_path / "app.db"), isolation_level=None)
    db.executescript("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);"
                     "INSERT INTO accounts VALUES (1, 100);")
    fence = gates.SqliteFence("accounts", "id")
    fence.add_fence_column(db)
    fence.add_fence_column(db)  # twice is harmless
    assert fence.update(db, 1, 7, "balance = balance + :d", {"d": 10}) == 1
    with pytest.raises(fenced.StaleToken) as e:
        fence.update(db, 1, 6, "balance = balance + :d", {"d": 1000})
    assert (e.value.token, e.value.highest_seen) == (6, 7)
    assert db.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()[0] == 110
    with pytest.raises(fenced.NotFound):
        fence.update(db, 2, 9, "balance = 0")
    with pytest.raises(fenced.BadRequest):
        gates.SqliteFence("accounts; DROP TABLE accounts", "id")


# --- PostgreSQL -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pg() -> Iterator[Postgres]:
    p = Postgres()
    yield p
    p.stop()


def _pg_connect(pg: Postgres) -> Any:
    import psycopg  # the test extra installs it

    return psycopg.connect(pg.conninfo, autocommit=True)


def test_postgres(client: fenced.Client, pg: Postgres) -> None:
    g = gates.PgKv(_pg_connect(pg))
    every_scenario(client, g, "pg")

    # The race, one connection per writer (psycopg connections are not for sharing).
    class PerThread:
        def __init__(self) -> None:
            self.local = threading.local()

        def _g(self) -> Any:
            if not hasattr(self.local, "g"):
                self.local.g = gates.PgKv(_pg_connect(pg))
            return self.local.g

        def write(self, key: str, value: bytes, token: int) -> None:
            self._g().write(key, value, token=token)

        def read(self, key: str, token: int) -> Any:
            return self._g().read(key, token=token)

    race_of_writers_the_highest_token_wins(PerThread(), "race")


def test_postgres_gate_on_an_existing_table(pg: Postgres) -> None:
    db = _pg_connect(pg)
    db.execute("DROP TABLE IF EXISTS accounts")
    db.execute("CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)")
    db.execute("INSERT INTO accounts VALUES (1, 100)")
    fence = gates.PgFence("accounts", "id")
    fence.add_fence_column(db)
    fence.add_fence_column(db)
    assert fence.update(db, 1, 7, "balance = balance + %(d)s", {"d": 10}) == 1
    with pytest.raises(fenced.StaleToken) as e:
        fence.update(db, 1, 6, "balance = balance + %(d)s", {"d": 1000})
    assert (e.value.token, e.value.highest_seen) == (6, 7)
    assert db.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()[0] == 110
    assert fence.read(db, 1, 9, "balance") == (110,)
    with pytest.raises(fenced.StaleToken):
        fence.update(db, 1, 7, "balance = 0")
    with pytest.raises(fenced.NotFound):
        fence.update(db, 2, 9, "balance = 0")
    assert fence.read(db, 2, 9, "balance") is None


# --- S3 -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto() -> Iterator[Moto]:
    m = Moto()
    yield m
    m.stop()


def test_s3(client: fenced.Client, moto: Moto) -> None:
    g = gates.S3Gate(moto.client(), Moto.BUCKET)
    every_scenario(client, g, "s3")
    race_of_writers_the_highest_token_wins(g, "race")
    raw = moto.client().get_object(Bucket=Moto.BUCKET, Key="race")
    assert raw["Body"].read() == b"fenced-token:16\nw16", "the mark is the object's first line"
    assert raw["Metadata"]["fenced-token"] == "16", "and its copy in the metadata"


def test_s3_metadata_alone_cannot_hold_the_mark(moto: Moto) -> None:
    """Why the mark is in the bytes: the ETag of a one-part object is the MD5 of its bytes,
    so the same bytes under another mark in metadata keep the ETag, and a stale writer's
    If-Match on the older version still matches."""
    s3 = moto.client()
    first = s3.put_object(Bucket=Moto.BUCKET, Key="meta", Body=b"same bytes", Metadata={"fenced-token": "5"},
                          IfNoneMatch="*")
    second = s3.put_object(Bucket=Moto.BUCKET, Key="meta", Body=b"same bytes", Metadata={"fenced-token": "9"},
                           IfMatch=first["ETag"])
    assert second["ETag"] == first["ETag"], "the mark moved from 5 to 9 and the ETag did not"
    s3.put_object(Bucket=Moto.BUCKET, Key="meta", Body=b"same bytes", Metadata={"fenced-token": "5"},
                  IfMatch=first["ETag"])  # the stale writer gets through: no exception


def test_s3_an_object_without_a_mark_line_is_refused_not_guessed(moto: Moto) -> None:
    s3 = moto.client()
    s3.put_object(Bucket=Moto.BUCKET, Key="plain", Body=b"written by someone else")
    g = gates.S3Gate(s3, Moto.BUCKET)
    with pytest.raises(fenced.CorruptRecord):
        g.write("plain", b"v", token=3)
    with pytest.raises(fenced.CorruptRecord):
        g.read("plain", token=3)
    assert s3.get_object(Bucket=Moto.BUCKET, Key="plain")["Body"].read() == b"written by someone else"


def test_s3_mark_line_round_trips() -> None:
    from fenced.gates.s3 import decode, encode

    assert decode(encode(7, b"v\nw")) == (7, b"v\nw")
    assert decode(encode(7, b"")) == (7, b"")
    assert decode(encode(2**64 - 1, None)) == (2**64 - 1, None)
    for bad in (b"plain value", b"fenced-token:\n", b"fenced-token:0\nv", b"fenced-token:x\n", b"fenced-token:7"):
        assert decode(bad) is None, bad


# --- DynamoDB -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dynamo() -> Iterator[DynamoLocal]:
    d = DynamoLocal()
    yield d
    d.stop()


def test_dynamodb(client: fenced.Client, dynamo: DynamoLocal) -> None:
    g = gates.DynamoGate(dynamo.client(), f"fenced-{next(_n)}")
    g.create_table()
    g.create_table()  # it exists: nothing to do
    every_scenario(client, g, "ddb")
    race_of_writers_the_highest_token_wins(g, "race")
    assert g.value("race") == b"w16"
    with pytest.raises(fenced.NotFound):
        gates.DynamoGate(dynamo.client(), "no-such-table").write("k", b"v", token=1)
