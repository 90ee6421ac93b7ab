"""Fenced's Python client: locks whose every grant carries a strictly increasing fencing
token, an honest lost-lock signal, the built-in fenced store, and gates for PostgreSQL,
SQLite, S3 and DynamoDB (``fenced.gates``).

    import fenced
    client = fenced.Client("http://127.0.0.1:7400")
    with client.lock("orders/42", ttl=10.0, wait=30.0) as lock:
        client.store.put("orders/42/state", b"paid", token=lock.token)
    for event in client.watch("orders/"):     # fenced.WatchEvent, resumed across reconnects
        print(event.index, event.type, event.name, event.token)
"""

from .client import Client, Lock, Store, Watch
from ._store import StoreRead
from .aio import AsyncClient, AsyncLock, AsyncStore, AsyncWatch
from ._watch import WatchEvent
from .signing import GrantKeys
from .errors import (
    ERROR_CODES,
    BadRequest,
    BadSignature,
    Busy,
    ConfigError,
    CorruptRecord,
    FencedError,
    Forbidden,
    LeaseExists,
    LeaseNotFound,
    LimitReached,
    LockHeld,
    LockLost,
    LostReason,
    MembershipChangeFailed,
    Missed,
    NoLeader,
    NotFound,
    NotHolder,
    NotLeader,
    OutOfRange,
    Recovering,
    ServerError,
    ShuttingDown,
    StaleToken,
    StorageFull,
    TokenNotIssued,
    TokenRequired,
    TooBusy,
    TooLarge,
    TooManyConnections,
    TooManyLeases,
    TooManyLocks,
    TooManyWaiters,
    Transport,
    Unauthorized,
    Unavailable,
    UnfencedKey,
    UnsupportedServer,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient", "AsyncLock", "AsyncStore", "AsyncWatch", "Client", "Lock", "Store", "StoreRead", "Watch",
    "WatchEvent", "ERROR_CODES",
    "BadRequest", "Busy", "ConfigError", "CorruptRecord", "FencedError", "Forbidden", "LeaseExists",
    "LeaseNotFound", "LimitReached", "LockHeld", "LockLost", "LostReason", "MembershipChangeFailed", "Missed",
    "NoLeader", "NotFound", "NotHolder", "NotLeader", "OutOfRange", "Recovering", "ServerError",
    "ShuttingDown", "StaleToken", "StorageFull", "TokenNotIssued", "TokenRequired", "TooBusy", "TooLarge",
    "TooManyConnections", "TooManyLeases", "TooManyLocks", "TooManyWaiters", "Transport", "Unauthorized",
    "Unavailable", "UnfencedKey", "UnsupportedServer", "__version__",
]
