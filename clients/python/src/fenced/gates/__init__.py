"""Fence gates for the resources Python programs write to: the design's rule, an operation
carrying token ``t`` is accepted iff ``t >= highest_seen``, and then ``highest_seen := t``,
in the same step as the data. A refusal raises :class:`fenced.StaleToken` (``token``,
``highest_seen``) and changes nothing. Fenced reads (``read(key, token=...)``) advance the
mark too, so a new holder's first read already shuts every older holder out.

Every gate has ``write(key, value, token=...)`` and ``read(key, token=...)`` (``None`` when
the key holds no value). The drivers are imported only when a gate is used:

- :class:`SqliteKv`, :class:`SqliteFence`: the standard library's ``sqlite3``;
- :class:`PgKv`, :class:`PgFence`: psycopg 3 (``pip install 'fenced-client[postgres]'``);
- :class:`S3Gate`: boto3 (``fenced-client[s3]``), a conditional put on the ETag;
- :class:`DynamoGate`: boto3 (``fenced-client[dynamodb]``), a condition expression.

:class:`Verified` wraps any of them behind the check of the service's signature (signed
grants, ``fenced-client[signing]``): a token without a valid signature for the key's lock
raises :class:`fenced.BadSignature` before the resource is touched.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._common import FENCE_COLUMN_DEFAULT

_WHERE = {
    "SqliteKv": "sqlite",
    "SqliteFence": "sqlite",
    "PgKv": "postgres",
    "PgFence": "postgres",
    "S3Gate": "s3",
    "DynamoGate": "dynamodb",
    "Verified": "verified",
}

__all__ = ["FENCE_COLUMN_DEFAULT", *_WHERE]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'fenced.gates' has no attribute '{name}'")
    return getattr(importlib.import_module(f".{module}", __name__), name)
