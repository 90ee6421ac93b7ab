"""A gate that asks for the service's signature too (signed grants)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from ..signing import GrantKeys


class Verified:
    """Wraps any gate with ``write(key, value, token)`` and ``read(key, token)`` (SqliteKv,
    PgKv, S3Gate, DynamoGate, or your own) behind the signature check: given the service's
    verifying keys and the lock that guards each key, a token without a valid signature
    for that lock raises :class:`fenced.BadSignature` before the resource is touched; a
    signed one goes on to the inner gate, whose mark refuses it if it is stale.

    ``lock``: the lock's name for every key (a string), a function of the key, or
    ``None`` for the lock of the key's own name. So a forged number (a client that sends
    2**63-1 to shut a row for good) and a real token of another lock (higher, since every
    lock draws from one counter) are both refused::

        keys = client.grant_keys()
        kv = gates.Verified(gates.SqliteKv("app.db"), keys, lock="accounts")
        with client.lock("accounts") as lock:
            kv.write("acct/1", b"100", token=lock.token, signature=lock.signature)
    """

    def __init__(self, gate: Any, keys: GrantKeys, lock: Union[None, str, Callable[[str], str]] = None) -> None:
        if not isinstance(keys, GrantKeys):
            raise TypeError("keys is a fenced.GrantKeys (client.grant_keys(), or GrantKeys(service, [hex]))")
        self.gate = gate
        self.keys = keys
        if lock is None:
            self._lock_of: Callable[[str], str] = lambda key: key
        elif isinstance(lock, str):
            self._lock_of = lambda key: lock
        else:
            self._lock_of = lock

    def write(self, key: str, value: bytes, token: int, signature: Optional[str] = None) -> None:
        self.keys.check(self._lock_of(key), token, signature)
        self.gate.write(key, value, token=token)

    def read(self, key: str, token: int, signature: Optional[str] = None) -> Optional[bytes]:
        """A fenced read (it moves the mark), if ``token`` is signed for the key's lock."""
        self.keys.check(self._lock_of(key), token, signature)
        return self.gate.read(key, token=token)
