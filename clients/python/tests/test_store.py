"""The built-in fenced store as the gate: the zombie write refused with StaleToken, fenced
reads, tokens never issued."""

from __future__ import annotations

import pytest

import fenced
from support import Server


def test_a_stale_write_after_a_newer_holder_wrote_is_refused(server: Server, name: str) -> None:
    c = fenced.Client(server.url)
    old = c.lock(name, ttl=5.0)
    assert c.store.put(name, b"old 1", token=old.token) == old.token
    old.release()
    with c.lock(name, ttl=5.0) as new:
        assert new.token > old.token
        assert c.store.put(name, b"new 1", token=new.token) == new.token
        with pytest.raises(fenced.StaleToken) as e:
            c.store.put(name, b"old 2", token=old.token)  # the zombie's late write
        assert (e.value.token, e.value.highest_seen) == (old.token, new.token)
        assert e.value.status == 409 and e.value.code == "stale_token"
        assert c.store.get(name) == b"new 1", "the refusal changed nothing"
        assert c.store.read(name, token=new.token) == fenced.StoreRead(b"new 1", new.token)


def test_a_fenced_read_shuts_the_older_holder_out(server: Server, name: str) -> None:
    c = fenced.Client(server.url)
    old = c.lock(name, ttl=5.0)
    c.store.put(name, b"v", token=old.token)
    old.release()
    with c.lock(name, ttl=5.0) as new:
        assert c.store.get(name, token=new.token) == b"v"  # a read only, and yet:
        with pytest.raises(fenced.StaleToken) as e:
            c.store.put(name, b"zombie", token=old.token)
        assert e.value.highest_seen == new.token
        with pytest.raises(fenced.StaleToken):
            c.store.get(name, token=old.token)
        assert c.store.put(name, b"again", token=new.token) == new.token, "equal tokens pass"


def test_a_token_never_issued_is_refused(server: Server, name: str) -> None:
    c = fenced.Client(server.url)
    with c.lock(name, ttl=5.0) as lock:
        with pytest.raises(fenced.TokenNotIssued) as e:
            c.store.put(name, b"from the future", token=lock.token + 1_000_000)
        assert e.value.token == lock.token + 1_000_000 and e.value.highest_issued is not None
        assert e.value.highest_issued >= lock.token
        assert c.store.get(name) is None, "nothing was written"


def test_absent_keys_and_bad_values(server: Server, name: str) -> None:
    c = fenced.Client(server.url)
    assert c.store.get(name) is None
    assert c.store.read(name) == fenced.StoreRead(None, None)
    with pytest.raises(fenced.BadRequest):
        c.store.put(name, "not bytes", token=1)  # type: ignore[arg-type]
    with pytest.raises(fenced.BadRequest):
        c.store.put(name, b"v", token=0)
