"""DynamoDB as a fenced resource through boto3 (resource/dynamodb.rs): the mark is an
attribute of the guarded item (``tok``), and every fenced write or read is ONE
``UpdateItem`` whose condition checks it and whose update advances it::

    UpdateExpression:    SET #tok = :t, #val = :v          (a fenced read: SET #tok = :t)
    ConditionExpression: attribute_not_exists(#tok) OR #tok <= :t
    ReturnValuesOnConditionCheckFailure: ALL_OLD

A ``ConditionalCheckFailedException`` is the refusal; the old item that comes with it
gives ``highest_seen`` (or a strongly consistent ``GetItem`` where a service does not send
it: the mark only rises, so it is above the refused token)."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

from ..errors import BadRequest, CorruptRecord, FencedError, NotFound, ServerError, Unauthorized, Unavailable
from .._core import check_token
from ._common import need, stale, value_bytes

need("boto3", "dynamodb")
from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]  # noqa: E402

#: The item's key attribute (a string: the gate's key).
KEY = "pk"
#: The mark attribute (a number).
MARK = "tok"
#: The value attribute (bytes).
VALUE = "val"
#: The gate's condition: no mark yet, or one no newer than the operation's token.
CONDITION = "attribute_not_exists(#tok) OR #tok <= :t"


class DynamoGate:
    """One table behind the gate: items ``{pk: key, tok: the mark, val: the value}``.
    ``dynamodb`` is a boto3 DynamoDB client (``boto3.client("dynamodb", ...)``)."""

    def __init__(self, dynamodb: Any, table: str) -> None:
        if not table or len(table) > 255:
            raise BadRequest(f"'{table}' is not a DynamoDB table name", code="invalid_table")
        self.db = dynamodb
        self.table = table

    def create_table(self, timeout: float = 60.0) -> None:
        """Creates the table (``pk`` a string hash key, billed per request) unless it
        exists, and waits until it is active (at most ``timeout`` seconds)."""
        try:
            self.db.create_table(
                TableName=self.table,
                AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
                KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}],
                BillingMode="PAY_PER_REQUEST",
            )
        except ClientError as e:
            if _code(e) != "ResourceInUseException":
                raise _error(e) from e
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.db.describe_table(TableName=self.table)["Table"]["TableStatus"] == "ACTIVE":
                    return
            except ClientError as e:
                if _code(e) != "ResourceNotFoundException":
                    raise _error(e) from e
            time.sleep(0.1)
        raise Unavailable(f"table {self.table} did not become active within {timeout:.0f} s", code="timeout")

    def write(self, key: str, value: bytes, token: int) -> None:
        self._fenced(key, check_token(token), value_bytes(value))

    def read(self, key: str, token: int) -> Optional[bytes]:
        """A fenced read: advances the mark (a key never written keeps it, with no value)."""
        return self._fenced(key, check_token(token), None)

    def value(self, key: str) -> Optional[bytes]:
        """The value as it stands, read without a token (nothing moves)."""
        return _value_of(self._get_item(key), key)

    def _get_item(self, key: str) -> Dict[str, Any]:
        try:
            r = self.db.get_item(TableName=self.table, Key={KEY: {"S": key}}, ConsistentRead=True)
        except ClientError as e:
            raise _error(e) from e
        except BotoCoreError as e:
            raise Unavailable(f"DynamoDB {self.table}: {e}", code="unreachable") from e
        return r.get("Item") or {}

    def _fenced(self, key: str, token: int, value: Optional[bytes]) -> Optional[bytes]:
        t = {"N": str(token)}
        args: Dict[str, Any] = {
            "TableName": self.table,
            "Key": {KEY: {"S": key}},
            "ConditionExpression": CONDITION,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if value is not None:
            args.update(UpdateExpression="SET #tok = :t, #val = :v",
                        ExpressionAttributeNames={"#tok": MARK, "#val": VALUE},
                        ExpressionAttributeValues={":t": t, ":v": {"B": value}}, ReturnValues="NONE")
        else:
            # DynamoDB refuses names the expressions do not use: no #val here.
            args.update(UpdateExpression="SET #tok = :t", ExpressionAttributeNames={"#tok": MARK},
                        ExpressionAttributeValues={":t": t}, ReturnValues="ALL_NEW")
        try:
            answer = self.db.update_item(**args)
        except ClientError as e:
            if _code(e) != "ConditionalCheckFailedException":
                raise _error(e) from e
            mark = _mark_of(e.response.get("Item") or {}, key)
            if mark is None:
                mark = _mark_of(self._get_item(key), key)
            if mark is None or mark <= token:
                raise CorruptRecord(f"item '{key}': the condition failed, yet the mark is not above the token") from e
            raise stale(key, token, mark) from None
        except BotoCoreError as e:
            raise Unavailable(f"DynamoDB {self.table}: {e}", code="unreachable") from e
        return None if value is not None else _value_of(answer.get("Attributes") or {}, key)


def _mark_of(item: Dict[str, Any], key: str) -> Optional[int]:
    if MARK not in item:
        return None
    try:
        mark = int(item[MARK]["N"])
    except (KeyError, TypeError, ValueError):
        mark = 0
    if mark < 1:
        raise CorruptRecord(f"item '{key}': its mark is not a positive integer")
    return mark


def _value_of(item: Dict[str, Any], key: str) -> Optional[bytes]:
    if VALUE not in item:
        return None
    v = item[VALUE].get("B") if isinstance(item[VALUE], dict) else None
    if not isinstance(v, (bytes, bytearray)):
        raise CorruptRecord(f"item '{key}': its value is not bytes")
    return bytes(v)


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _error(e: ClientError) -> FencedError:
    code = _code(e)
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    msg = f"DynamoDB: {code}: {e.response.get('Error', {}).get('Message', '')}"
    if code == "ResourceNotFoundException":
        return NotFound(msg, code="resource_not_found", status=status)
    if code in ("ValidationException", "SerializationException"):
        return BadRequest(msg, code="validation", status=status)
    if code in ("UnrecognizedClientException", "AccessDeniedException", "MissingAuthenticationTokenException"):
        return Unauthorized(msg, code="unauthorized", status=status)
    if code in ("ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"):
        return Unavailable(msg, code="throttled", status=status)
    return ServerError(msg, code=code or "dynamodb_error", status=status)
