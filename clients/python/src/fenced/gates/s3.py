"""S3, and the object stores that speak its protocol, as a fenced resource through boto3
(resource/s3.rs): every write is ONE conditional put on the ETag of the version whose
mark was checked, so the check and the change are one step at the store.

**The mark lives in the object's own bytes**, a first line ``fenced-token:N`` before the
value (copied into the ``x-amz-meta-fenced-token`` metadata for people looking with other
tools; the gate never trusts the copy). Not in the metadata alone: the ETag of an object
written in one part is the MD5 of its bytes, which metadata does not enter, so after a
fenced read rewrote the same bytes under a higher mark, a stale writer's ``If-Match`` on
the old ETag would still match. Not a sidecar object: two objects cannot change in one
step. So readers that bypass the gate must skip the first line, and an object the gate did
not write is refused (:class:`fenced.CorruptRecord`), never taken as "no mark".

The first write is a put with ``If-None-Match: *``, every later one a put with
``If-Match: <ETag>``. A precondition failure means another writer came in between: the
gate reads again and decides again, up to ``retries_max`` times, then raises
:class:`fenced.Unavailable`."""

from __future__ import annotations

import re
from typing import Any, Dict, Optional, Tuple

from ..errors import BadRequest, CorruptRecord, FencedError, Forbidden, NotFound, ServerError, Unavailable
from .._core import check_token
from ._common import need, stale, value_bytes

need("boto3", "s3")
from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]  # noqa: E402

#: The object's first line starts with this, then the mark in decimal.
MARK_PREFIX = b"fenced-token:"
#: Said after the mark when the key has a mark and no value (a fenced read of a key never
#: written leaves its mark behind all the same).
NO_VALUE = b" none"
#: The metadata key of the mark's copy (``x-amz-meta-fenced-token``).
MARK_METADATA = "fenced-token"
#: Conditional puts lost to other writers before one operation gives up.
RETRIES_MAX_DEFAULT = 64

_PRECONDITION = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}


def encode(token: int, value: Optional[bytes]) -> bytes:
    """The object's bytes: the mark line, then the value."""
    line = MARK_PREFIX + str(token).encode() + (NO_VALUE if value is None else b"") + b"\n"
    return line + (value or b"")


def decode(data: bytes) -> Optional[Tuple[int, Optional[bytes]]]:
    """The mark and the value of an object the gate wrote; ``None`` when the bytes do not
    start with an intact mark line."""
    end = data.find(b"\n", 0, 64)
    if end < 0 or not data.startswith(MARK_PREFIX):
        return None
    line = data[len(MARK_PREFIX):end]
    has_value = not line.endswith(NO_VALUE)
    digits = line if has_value else line[: -len(NO_VALUE)]
    if not re.fullmatch(rb"[0-9]{1,20}", digits):
        return None
    mark = int(digits)
    if not 1 <= mark < 2**64:
        return None
    return mark, (data[end + 1:] if has_value else None)


class S3Gate:
    """A bucket behind the gate; keys are object names. ``s3`` is a boto3 S3 client
    (``boto3.client("s3", endpoint_url=...)``), whose store must honour ``If-Match`` and
    ``If-None-Match`` on ``PutObject`` atomically (AWS S3 since 2024, moto's server)."""

    def __init__(self, s3: Any, bucket: str, *, retries_max: int = RETRIES_MAX_DEFAULT) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.retries_max = max(1, int(retries_max))

    def write(self, key: str, value: bytes, token: int) -> None:
        self._fenced(key, check_token(token), value_bytes(value))

    def read(self, key: str, token: int) -> Optional[bytes]:
        """A fenced read: a token above the mark rewrites the object under it (same value);
        the mark's own token writes nothing."""
        return self._fenced(key, check_token(token), None)

    def value(self, key: str) -> Optional[bytes]:
        """The value as it stands, read without a token (nothing moves)."""
        got = self._get(key)
        return None if got is None else got[1][1]

    def _get(self, key: str) -> Optional[Tuple[str, Tuple[int, Optional[bytes]]]]:
        try:
            r = self.s3.get_object(Bucket=self.bucket, Key=key)
            data = r["Body"].read()
        except ClientError as e:
            if _code(e) in ("NoSuchKey", "404"):
                return None
            raise _error(e, key) from e
        except BotoCoreError as e:
            raise Unavailable(f"S3 {self.bucket}/{key}: {e}", code="unreachable") from e
        decoded = decode(data)
        if decoded is None:
            raise CorruptRecord(f"object '{key}' has no intact fenced-token line: the gate refuses to guess its mark")
        return r["ETag"], decoded

    def _fenced(self, key: str, token: int, value: Optional[bytes]) -> Optional[bytes]:
        for _ in range(self.retries_max):
            got = self._get(key)
            cond: Dict[str, str]
            if got is None:
                held: Optional[bytes] = None
                cond = {"IfNoneMatch": "*"}
            else:
                etag, (mark, held) = got
                if token < mark:
                    raise stale(key, token, mark)
                if value is None and token == mark:
                    return held
                cond = {"IfMatch": etag}
            body = encode(token, value if value is not None else held)
            try:
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, Metadata={MARK_METADATA: str(token)},
                                   **cond)
                return None if value is not None else held
            except ClientError as e:
                if _code(e) in _PRECONDITION or _status(e) in (409, 412):
                    continue  # another writer came in between: read again, decide again
                raise _error(e, key) from e
            except BotoCoreError as e:
                raise Unavailable(f"S3 {self.bucket}/{key}: {e}", code="unreachable") from e
        raise Unavailable(f"{key}: {self.retries_max} conditional puts in a row lost to other writers",
                          code="contention")


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: ClientError) -> Optional[int]:
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def _error(e: ClientError, key: str) -> FencedError:
    code, status = _code(e), _status(e)
    msg = f"S3 '{key}': {code}: {e.response.get('Error', {}).get('Message', '')}"
    if code in ("NoSuchBucket",):
        return NotFound(msg, code="no_such_bucket", status=status)
    if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status in (401, 403):
        return Forbidden(msg, code="forbidden", status=status)
    if status is not None and status in (429, 500, 502, 503, 504) or code in ("SlowDown", "ServiceUnavailable"):
        return Unavailable(msg, code="unavailable", status=status)
    if status is not None and 400 <= status < 500:
        return BadRequest(msg, code=code or "bad_request", status=status)
    return ServerError(msg, code=code or "s3_error", status=status)
