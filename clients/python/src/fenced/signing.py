"""Verifying signed grants offline.

With ``grant_signing_key`` the service signs every grant: an Ed25519 signature over
``fenced-grant-v1\\0`` + its identity (``grant_service``) + ``\\0`` + the lock's name +
``\\0`` + the token as 8 big-endian bytes. A resource given the verifying keys
(:class:`GrantKeys`, from ``GET /v1/keys`` once, or from configuration) tells a token the
service issued for the lock that guards it from a forged number or another lock's token,
without asking the service. A signature proves the service issued that token for that
lock; it does not prove the holder still holds it: the resource's mark does that, so a
gate checks both (:class:`fenced.gates.Verified`).

Verification uses the ``cryptography`` package: ``pip install 'fenced-client[signing]'``.
"""

from __future__ import annotations

import struct
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .errors import BadRequest, BadSignature


def grant_message(service: str, lock: str, token: int) -> bytes:
    """What the service signs for ``token`` of ``lock``."""
    return b"fenced-grant-v1\0" + service.encode() + b"\0" + lock.encode() + b"\0" + struct.pack(">Q", token)


def signed_headers(signature: Optional[str]) -> Dict[str, str]:
    """The store's ``Fencing-Signature`` header, when a signature is given."""
    if signature is None:
        return {}
    if not isinstance(signature, str):
        raise BadRequest("a signature is a hex string (Lock.signature)", code="invalid_signature")
    return {"fencing-signature": signature}


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as e:
        raise ImportError(f"verifying signed grants needs cryptography: pip install 'fenced-client[signing]' ({e})") from e
    return ed25519


def _public_key(text: Any) -> bytes:
    try:
        raw = bytes.fromhex(text) if isinstance(text, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise BadRequest(f"{text!r} is not an Ed25519 public key (64 hex digits)", code="invalid_key")
    return raw


class GrantKeys:
    """The keys that verify one service's grant signatures. ``keys``: Ed25519 public keys
    as 64 hex digits (``GET /v1/keys``'s ``public_key``)."""

    def __init__(self, service: str, keys: Iterable[str]) -> None:
        self._init(service, [(_public_key(k), None) for k in keys])

    def _init(self, service: str, keys: List[Tuple[bytes, Optional[int]]]) -> None:
        if not isinstance(service, str) or not service or not keys:
            raise BadRequest("grant keys need a service and at least one key", code="invalid_keys")
        ed25519 = _ed25519()
        self.service = service
        self._keys = [(ed25519.Ed25519PublicKey.from_public_bytes(raw), until) for raw, until in keys]

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "GrantKeys":
        """The body of ``GET /v1/keys``; a retired key verifies until its ``valid_until_unix``."""
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
            raise BadRequest(f"not a /v1/keys document: {doc!r}", code="invalid_keys")
        keys: List[Tuple[bytes, Optional[int]]] = []
        for k in doc["keys"]:
            if not isinstance(k, dict) or k.get("algorithm") != "ed25519":
                raise BadRequest(f"a key that is not ed25519: {k!r}", code="invalid_keys")
            until = k.get("valid_until_unix")
            keys.append((_public_key(k.get("public_key")), until if isinstance(until, int) else None))
        self = cls.__new__(cls)
        self._init(doc.get("service"), keys)  # type: ignore[arg-type]
        return self

    def verifies(self, lock: str, token: int, signature: Optional[str]) -> bool:
        """Whether ``signature`` (hex) is the service's for ``token`` of ``lock``, by a key
        that verifies now."""
        try:
            sig = bytes.fromhex(signature) if isinstance(signature, str) else b""
        except ValueError:
            return False
        if len(sig) != 64 or not isinstance(token, int) or not 1 <= token < 2**64:
            return False
        message = grant_message(self.service, lock, token)
        now = time.time()
        for key, until in self._keys:
            if until is not None and until <= now:
                continue
            try:
                key.verify(sig, message)
                return True
            except Exception:  # cryptography's InvalidSignature
                continue
        return False

    def check(self, lock: str, token: int, signature: Optional[str]) -> None:
        """:meth:`verifies` as a refusal: :class:`fenced.BadSignature` (``token``, ``lock``)."""
        if not self.verifies(lock, token, signature):
            raise BadSignature(
                f"token {token} carries no valid signature of service '{self.service}' for lock '{lock}'",
                details={"token": token, "lock": lock},
            )
