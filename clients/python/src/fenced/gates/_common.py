"""What the gates share: the refusal, the checks of names and tokens, the driver import."""

from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Optional

from .._core import check_token
from ..errors import BadRequest, StaleToken

#: The fence column's default name (the Rust adapters' too).
FENCE_COLUMN_DEFAULT = "fence_token"


def stale(key: str, token: int, highest_seen: int) -> StaleToken:
    return StaleToken(
        f"token {token} is below the highest token '{key}' has seen, {highest_seen}",
        token=token,
        highest_seen=highest_seen,
    )


def rejected(key: str, token: int, mark: Optional[int]) -> Optional[StaleToken]:
    """The refusal after a conditional statement changed nothing: the mark read back (it
    only rises) is above the token; ``None`` when it is not (no row: nothing refused)."""
    if mark is None or mark <= token:
        return None
    return stale(key, token, mark)


def sql_token(token: int) -> int:
    token = check_token(token)
    if token >= 2**63:
        raise BadRequest(f"token {token} does not fit a SQL bigint", code="invalid_token")
    return token


def ident(name: str) -> str:
    """A table or column name spliced into SQL (identifiers cannot be bound): plain ones only."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", name or ""):
        raise BadRequest(f"'{name}' is not a plain SQL identifier (letters, digits, _)", code="invalid_identifier")
    return name


def need(module: str, extra: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"this gate needs {module}: pip install 'fenced-client[{extra}]' ({e})") from e


def value_bytes(value: object) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise BadRequest("a gate's value is bytes", code="invalid_value")
    return bytes(value)
