"""The gates, each against the real thing: SQLite always, PostgreSQL (initdb + pg_ctl in a
temp dir), S3 (moto's server), DynamoDB (DynamoDB Local). Each runs the Rust adapters'
three scenarios: a stale token is refused and changes nothing; interleaved holders with
real tokens leave the newer value; the counter workload with a holder paused past its
lease loses no update. Missing components skip, or fail under CI=true."""

from __future__ import annotations

import itertools
import sqlite3
import subprocess
import threading
from typing import Any, Iterator, List, Tuple

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


def a_forged_token_is_refused_with_keys_and_taken_without(signer: Tuple[fenced.Client, fenced.GrantKeys],
                                                          g: Any, tag: str) -> None:
    """Signed grants: the gate behind :class:`gates.Verified` refuses another lock's real,
    higher token, a forged number with a real signature and no signature at all, before
    the resource is touched; the same gate without keys takes the other lock's token and
    then shuts the real holder out (the control)."""
    c, keys = signer
    n = next(_n)
    with c.lock(f"signed/{tag}/{n}", ttl=10.0) as real, c.lock(f"other/{tag}/{n}", ttl=10.0) as other:
        assert other.token > real.token and real.signature and other.signature
        kv = gates.Verified(g, keys, lock=real.name)
        key = f"signed-{tag}-{n}"
        for token, sig in [(other.token, other.signature), (2**63 - 1, real.signature), (real.token, None)]:
            with pytest.raises(fenced.BadSignature) as e:
                kv.write(key, b"hijack", token=token, signature=sig)
            assert (e.value.token, e.value.lock) == (token, real.name)
            with pytest.raises(fenced.BadSignature):
                kv.read(key, token=token, signature=sig)
        kv.write(key, b"100", token=real.token, signature=real.signature)
        assert kv.read(key, token=real.token, signature=real.signature) == b"100"
        control = key + "-control"
        g.write(control, b"hijack", token=other.token)
        with pytest.raises(fenced.StaleToken):
            g.write(control, b"100", token=real.token)


@pytest.fixture(scope="module")
def signer(tmp_path_factory: Any) -> Iterator[Tuple[fenced.Client, fenced.GrantKeys]]:
    """A server that signs its grants (a key made as a user would, with openssl), its
    store's keys under ``acct/`` taking signed tokens only; a client and the keys."""
    d = tmp_path_factory.mktemp("signing")
    key = d / "grant.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, capture_output=True)
    (d / "fenced.toml").write_text(f'grant_signing_key = "{key}"\nsigned_key_prefix = "acct/"\n')
    s = Server(["--config", str(d / "fenced.toml")])
    c = fenced.Client(s.url)
    yield c, c.grant_keys()
    c.close()
    s.stop()


def test_signed_grants_and_the_stores_signed_keys(signer: Tuple[fenced.Client, fenced.GrantKeys],
                                                 client: fenced.Client) -> None:
    c, keys = signer
    with c.lock("acct/1", ttl=10.0) as real, c.lock("elsewhere", ttl=10.0) as other:
        assert keys.verifies("acct/1", real.token, real.signature)
        assert not keys.verifies("acct/1", other.token, other.signature), "another lock's signature"
        with pytest.raises(fenced.BadSignature) as e:
            c.store.put("acct/1", b"hijack", token=other.token, signature=other.signature)
        assert (e.value.code, e.value.token, e.value.lock) == ("bad_signature", other.token, "acct/1")
        with pytest.raises(fenced.BadSignature) as e:
            c.store.put("acct/1", b"unsigned", token=real.token)
        assert e.value.code == "signature_required"
        assert c.store.put("acct/1", b"100", token=real.token, signature=real.signature) == real.token
        assert c.store.get("acct/1", token=real.token, signature=real.signature) == b"100"
        assert c.store.put("plain/1", b"x", token=other.token) == other.token, "outside the prefix: fenced as ever"
    with c.lock_all(["set/a", "set/b"], ttl=10.0) as both:
        assert sorted(both.signatures) == ["set/a", "set/b"]
        for n, t in both.tokens.items():
            assert keys.verifies(n, t, both.signatures[n])
    # A server that does not sign: no signature, and no keys to fetch.
    with client.lock("unsigned", ttl=5.0) as plain:
        assert plain.signature is None and plain.signatures == {}
    with pytest.raises(fenced.NotFound):
        client.grant_keys()
    with pytest.raises(fenced.BadRequest):
        fenced.GrantKeys("svc", ["not a key"])


def every_scenario(c: fenced.Client, g: Any, tag: str) -> None:
    k = f"{tag}-{next(_n)}"
    stale_token_is_refused_and_changes_nothing(g, f"{k}/stale")
    interleaved_writers_leave_the_newer_value(c, g, f"{k}/interleaved", f"{tag}/lock/{k}/interleaved")
    counter_workload_loses_no_update(c, g, f"{k}/counter", f"{tag}/lock/{k}/counter")


@pytest.fixture(scope="module")
def client(server: Server) -> fenced.Client:
    return fenced.Client(server.url)


# --- SQLite ---------------------------------------------------------------------------------


def test_sqlite(client: fenced.Client, signer: Any, tmp_path: Any) -> None:
    g = gates.SqliteKv(str(tmp_path / "kv.db"))
    every_scenario(client, g, "sqlite")
    a_forged_token_is_refused_with_keys_and_taken_without(signer, g, "sqlite")
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


def test_postgres(client: fenced.Client, signer: Any, pg: Postgres) -> None:
    g = gates.PgKv(_pg_connect(pg))
    every_scenario(client, g, "pg")
    a_forged_token_is_refused_with_keys_and_taken_without(signer, g, "pg")

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


def test_s3(client: fenced.Client, signer: Any, moto: Moto) -> None:
    g = gates.S3Gate(moto.client(), Moto.BUCKET)
    every_scenario(client, g, "s3")
    a_forged_token_is_refused_with_keys_and_taken_without(signer, g, "s3")
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


def test_dynamodb(client: fenced.Client, signer: Any, dynamo: DynamoLocal) -> None:
    g = gates.DynamoGate(dynamo.client(), f"fenced-{next(_n)}")
    g.create_table()
    g.create_table()  # it exists: nothing to do
    every_scenario(client, g, "ddb")
    a_forged_token_is_refused_with_keys_and_taken_without(signer, g, "ddb")
    race_of_writers_the_highest_token_wins(g, "race")
    assert g.value("race") == b"w16"
    with pytest.raises(fenced.NotFound):
        gates.DynamoGate(dynamo.client(), "no-such-table").write("k", b"v", token=1)


def test_the_async_client_carries_signatures_too(signer: Tuple[fenced.Client, fenced.GrantKeys]) -> None:
    import asyncio

    c, keys = signer
    url = c.endpoints[0]

    async def main() -> None:
        async with fenced.AsyncClient(url) as a:
            assert (await a.grant_keys()).service == keys.service
            async with a.lock("acct/async", ttl=5.0) as lock:
                assert keys.verifies("acct/async", lock.token, lock.signature)
                with pytest.raises(fenced.BadSignature):
                    await a.store.put("acct/async", b"unsigned", token=lock.token)
                assert await a.store.put("acct/async", b"v", token=lock.token, signature=lock.signature) == lock.token
                assert await a.store.get("acct/async", token=lock.token, signature=lock.signature) == b"v"

    asyncio.run(asyncio.wait_for(main(), timeout=60))
