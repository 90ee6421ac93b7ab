"""SQLite as a fenced resource (resource/sqlite.rs): the mark lives in a column of the
guarded row; the conditional upsert (or update) and the read-back of the mark run in one
``BEGIN IMMEDIATE`` transaction, so no other writer can come between the check and the
change."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any, Mapping, Optional, Union

from ..errors import NotFound
from ._common import FENCE_COLUMN_DEFAULT, ident, rejected, sql_token, value_bytes


class SqliteKv:
    """A key-value table ``(key TEXT PRIMARY KEY, value BLOB, fence_token INTEGER NOT NULL)``
    behind the gate. ``db`` is a path (opened here, autocommit, 5 s busy time-out) or an
    open :class:`sqlite3.Connection` not inside a transaction."""

    def __init__(self, db: Union[str, "sqlite3.Connection"], table: str = "fenced_kv") -> None:
        if isinstance(db, sqlite3.Connection):
            self._db = db
        else:
            self._db = sqlite3.connect(db, timeout=5.0, isolation_level=None, check_same_thread=False)
        self.table = ident(table)
        self._mu = threading.Lock()
        with self._mu:
            self._db.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} "
                f"(key TEXT PRIMARY KEY, value BLOB, {FENCE_COLUMN_DEFAULT} INTEGER NOT NULL)"
            )
            if self._db.in_transaction:
                self._db.commit()

    @property
    def db(self) -> "sqlite3.Connection":
        return self._db

    def write(self, key: str, value: bytes, token: int) -> None:
        """Writes ``value`` iff ``token`` is at least the key's mark; raises StaleToken."""
        self._fenced(key, token, value_bytes(value), write=True)

    def read(self, key: str, token: int) -> Optional[bytes]:
        """A fenced read: advances the mark (a key never written keeps it too)."""
        return self._fenced(key, token, None, write=False)

    def value(self, key: str) -> Optional[bytes]:
        """The value as it stands, without a token (nothing moves)."""
        with self._mu:
            row = self._db.execute(f"SELECT value FROM {self.table} WHERE key = ?", (key,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def _fenced(self, key: str, token: int, value: Optional[bytes], write: bool) -> Optional[bytes]:
        t = sql_token(token)
        fc = FENCE_COLUMN_DEFAULT
        set_value = "value = excluded.value, " if write else ""
        sql = (
            f"INSERT INTO {self.table} (key, value, {fc}) VALUES (?, ?, ?) "
            f"ON CONFLICT (key) DO UPDATE SET {set_value}{fc} = excluded.{fc} WHERE {fc} <= excluded.{fc}"
        )
        with self._mu:
            _begin_immediate(self._db)
            try:
                changed = self._db.execute(sql, (key, value, t)).rowcount
                row = self._db.execute(f"SELECT value, {fc} FROM {self.table} WHERE key = ?", (key,)).fetchone()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        if changed == 1:
            return None if write or row[0] is None else bytes(row[0])
        refusal = rejected(key, t, row[1] if row else None)
        assert refusal is not None, "inside the transaction the mark that refused is still there"
        raise refusal


class SqliteFence:
    """The gate on the rows of an existing table (like ``PgFence``): the mark in an integer
    column (``fence_token``), one conditional ``UPDATE`` in an immediate transaction."""

    def __init__(self, table: str, key_column: str, fence_column: str = FENCE_COLUMN_DEFAULT) -> None:
        self.table = ident(table)
        self.key_column = ident(key_column)
        self.fence_column = ident(fence_column)

    def add_fence_column(self, db: "sqlite3.Connection") -> None:
        """Adds the fence column if the table lacks it (existing rows start at 0)."""
        cols = [r[1] for r in db.execute(f"PRAGMA table_info({self.table})")]
        if self.fence_column not in cols:
            db.execute(f"ALTER TABLE {self.table} ADD COLUMN {self.fence_column} INTEGER NOT NULL DEFAULT 0")
            if db.in_transaction:
                db.commit()

    def update(self, db: "sqlite3.Connection", key: Any, token: int, set_sql: str,
               params: Optional[Mapping[str, Any]] = None) -> int:
        """``UPDATE table SET <set_sql>, fence = :fenced_token WHERE key = :fenced_key AND
        fence <= :fenced_token``; ``set_sql`` names its own parameters (``:name``). Returns
        the rows changed; raises StaleToken, or NotFound when no row has that key."""
        t = sql_token(token)
        table, kc, fc = self.table, self.key_column, self.fence_column
        args = dict(params or {})
        args.update(fenced_key=key, fenced_token=t)
        _begin_immediate(db)
        try:
            changed = db.execute(
                f"UPDATE {table} SET {set_sql}, {fc} = :fenced_token WHERE {kc} = :fenced_key AND {fc} <= :fenced_token",
                args,
            ).rowcount
            row = None if changed else db.execute(f"SELECT {fc} FROM {table} WHERE {kc} = ?", (key,)).fetchone()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if changed:
            return changed
        refusal = rejected(str(key), t, row[0] if row else None)
        if refusal is None:
            raise NotFound(f"no row of {table} with that {kc}")
        raise refusal


def _begin_immediate(db: "sqlite3.Connection") -> None:
    if db.in_transaction:
        raise RuntimeError("the gate runs its own BEGIN IMMEDIATE transaction: commit or roll back first")
    db.execute("BEGIN IMMEDIATE")
