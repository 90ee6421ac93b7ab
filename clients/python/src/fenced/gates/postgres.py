"""PostgreSQL as a fenced resource through psycopg 3 (resource/postgres.rs): the mark lives
in a ``bigint`` column of the guarded row, and every fenced write or read is ONE
conditional statement that checks and advances it. Under READ COMMITTED a concurrent
``UPDATE`` waits for the row lock and re-checks the condition on the newest row version,
so two writers cannot both pass the gate.

Each operation runs in ``conn.transaction()`` (its own transaction on an autocommit
connection, a savepoint inside yours otherwise), the statement and, after a refusal, the
read-back of the mark that names ``highest_seen``."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

from ..errors import NotFound
from ._common import FENCE_COLUMN_DEFAULT, ident, need, rejected, sql_token, value_bytes

need("psycopg", "postgres")


class PgKv:
    """A key-value table ``(key text PRIMARY KEY, value bytea, fence_token bigint NOT NULL)``
    behind the gate, over a psycopg 3 connection (created if missing)."""

    def __init__(self, conn: Any, table: str = "fenced_kv") -> None:
        self.conn = conn
        self.table = ident(table)
        with conn.transaction():
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self.table} "
                f"(key text PRIMARY KEY, value bytea, {FENCE_COLUMN_DEFAULT} bigint NOT NULL)"
            )

    def write(self, key: str, value: bytes, token: int) -> None:
        """One statement: insert, or update only where the stored mark is not above the token."""
        t = sql_token(token)
        table, fc = self.table, FENCE_COLUMN_DEFAULT
        sql = (
            f"INSERT INTO {table} (key, value, {fc}) VALUES (%s, %s, %s) "
            f"ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, {fc} = EXCLUDED.{fc} "
            f"WHERE {table}.{fc} <= EXCLUDED.{fc}"
        )
        self._gated(key, t, sql, (key, value_bytes(value), t))

    def read(self, key: str, token: int) -> Optional[bytes]:
        """One statement: advances the mark (creating the row with no value for a new key, so
        the mark holds for a key not written yet) and returns the value."""
        t = sql_token(token)
        table, fc = self.table, FENCE_COLUMN_DEFAULT
        sql = (
            f"INSERT INTO {table} (key, value, {fc}) VALUES (%s, NULL, %s) "
            f"ON CONFLICT (key) DO UPDATE SET {fc} = EXCLUDED.{fc} WHERE {table}.{fc} <= EXCLUDED.{fc} "
            f"RETURNING value"
        )
        row = self._gated(key, t, sql, (key, t)).fetchone()
        return None if row[0] is None else bytes(row[0])

    def value(self, key: str) -> Optional[bytes]:
        """The value as it stands, read without a token (nothing moves)."""
        row = self.conn.execute(f"SELECT value FROM {self.table} WHERE key = %s", (key,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def _gated(self, key: str, token: int, sql: str, params: Tuple[Any, ...]) -> Any:
        """Runs the one conditional statement of a write or a read under ``token`` in its
        transaction: its cursor when it passed the gate (the row inserted or updated). Else
        the row's mark, read back in the same transaction, is above the token: the refusal
        is raised."""
        with self.conn.transaction():
            cur = self.conn.execute(sql, params)
            if cur.rowcount == 1:
                return cur
            mark = self._mark(key)
        refusal = rejected(key, token, mark)
        assert refusal is not None, "a conflicting row whose mark is not above the token was not updated"
        raise refusal

    def _mark(self, key: str) -> Optional[int]:
        row = self.conn.execute(f"SELECT {FENCE_COLUMN_DEFAULT} FROM {self.table} WHERE key = %s", (key,)).fetchone()
        return None if row is None else int(row[0])


class PgFence:
    """The gate on the rows of an existing table: ``PgFence("accounts", "id")``."""

    def __init__(self, table: str, key_column: str, fence_column: str = FENCE_COLUMN_DEFAULT) -> None:
        self.table = ident(table)
        self.key_column = ident(key_column)
        self.fence_column = ident(fence_column)

    def add_fence_column(self, conn: Any) -> None:
        """``ALTER TABLE .. ADD COLUMN IF NOT EXISTS fence_token bigint NOT NULL DEFAULT 0``:
        existing rows start at 0, below every token."""
        with conn.transaction():
            conn.execute(
                f"ALTER TABLE {self.table} ADD COLUMN IF NOT EXISTS {self.fence_column} bigint NOT NULL DEFAULT 0"
            )

    def update(self, conn: Any, key: Any, token: int, set_sql: str, params: Optional[Mapping[str, Any]] = None) -> int:
        """``UPDATE table SET <set_sql>, fence = t WHERE key = k AND fence <= t`` in one
        statement; ``set_sql`` names its parameters ``%(name)s``. Returns the rows changed;
        raises StaleToken, or NotFound when no row has that key."""
        t = sql_token(token)
        table, kc, fc = self.table, self.key_column, self.fence_column
        args = dict(params or {})
        args.update(fenced_key=key, fenced_token=t)
        sql = (f"UPDATE {table} SET {set_sql}, {fc} = %(fenced_token)s "
               f"WHERE {kc} = %(fenced_key)s AND {fc} <= %(fenced_token)s")
        with conn.transaction():
            changed: int = conn.execute(sql, args).rowcount
            if changed > 0:
                return changed
            mark = self._mark(conn, key)
        refusal = rejected(str(key), t, mark)
        if refusal is None:
            raise NotFound(f"no row of {table} with that {kc}")
        raise refusal

    def read(self, conn: Any, key: Any, token: int, columns: str) -> Optional[Tuple[Any, ...]]:
        """A fenced read: ``UPDATE table SET fence = t WHERE key = k AND fence <= t RETURNING
        <columns>``, one statement. ``None`` when no row has that key."""
        t = sql_token(token)
        table, kc, fc = self.table, self.key_column, self.fence_column
        sql = f"UPDATE {table} SET {fc} = %s WHERE {kc} = %s AND {fc} <= %s RETURNING {columns}"
        with conn.transaction():
            row = conn.execute(sql, (t, key, t)).fetchone()
            if row is not None:
                return tuple(row)
            mark = self._mark(conn, key)
        refusal = rejected(str(key), t, mark)
        if refusal is not None:
            raise refusal
        return None

    def _mark(self, conn: Any, key: Any) -> Optional[int]:
        sql = f"SELECT {self.fence_column} FROM {self.table} WHERE {self.key_column} = %s"
        row = conn.execute(sql, (key,)).fetchone()
        return None if row is None else int(row[0])
