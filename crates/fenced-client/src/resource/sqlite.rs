//! SQLite as a fenced resource: the mark lives in a column of the guarded row; the
//! check, the change and the mark's advance run in one `BEGIN IMMEDIATE` transaction
//! (a conditional upsert inside it), so no other writer can come between them.

use std::path::Path;
use std::sync::Mutex;

use fenced_core::Token;
use rusqlite::{Connection, OptionalExtension, ToSql, TransactionBehavior};

use crate::error::Error;
use crate::resource::{ident, rejected, sql_token, Fenced, FencedResource};

/// The fence column's default name.
pub const FENCE_COLUMN_DEFAULT: &str = "fence_token";

/// The gate on the rows of one existing table, like `postgres::PgFence`.
#[derive(Clone, Debug)]
pub struct SqliteFence {
    /// The guarded table.
    table: String,
    /// The column that names a row.
    key_column: String,
    /// The integer column holding each row's highest token seen.
    fence_column: String,
}

impl SqliteFence {
    pub fn new(table: &str, key_column: &str) -> Result<SqliteFence, Error> {
        Ok(SqliteFence {
            table: ident(table)?.to_owned(),
            key_column: ident(key_column)?.to_owned(),
            fence_column: FENCE_COLUMN_DEFAULT.to_owned(),
        })
    }

    /// Adds the fence column if the table lacks it (existing rows start at 0).
    pub fn add_fence_column(&self, db: &Connection) -> Result<(), Error> {
        let present: bool = db
            .prepare(&format!("SELECT 1 FROM pragma_table_info('{}') WHERE name = ?1", self.table))?
            .exists([&self.fence_column])?;
        if !present {
            db.execute_batch(&format!(
                "ALTER TABLE {} ADD COLUMN {} INTEGER NOT NULL DEFAULT 0",
                self.table, self.fence_column
            ))?;
        }
        Ok(())
    }

    /// `UPDATE table SET <set>, fence = ?2 WHERE key = ?1 AND fence <= ?2` in one
    /// immediate transaction with the read-back of the mark on refusal. `set` refers to
    /// its own parameters from `?3` on.
    pub fn update(
        &self,
        db: &mut Connection,
        key: &dyn ToSql,
        token: Token,
        set: &str,
        params: &[&dyn ToSql],
    ) -> Result<Fenced<u64>, Error> {
        let t = sql_token(token)?;
        let (table, kc, fc) = (&self.table, &self.key_column, &self.fence_column);
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut all: Vec<&dyn ToSql> = vec![key, &t];
        all.extend_from_slice(params);
        let changed =
            tx.execute(&format!("UPDATE {table} SET {set}, {fc} = ?2 WHERE {kc} = ?1 AND {fc} <= ?2"), &all[..])?;
        if changed > 0 {
            tx.commit()?;
            return Ok(Fenced::Accepted(changed as u64));
        }
        let mark: Option<i64> =
            tx.query_row(&format!("SELECT {fc} FROM {table} WHERE {kc} = ?1"), [key], |r| r.get(0)).optional()?;
        tx.commit()?;
        rejected(token, mark).ok_or_else(|| Error::NotFound(format!("no row of {table} with that {kc}")))
    }
}

/// A key-value table `(key TEXT PRIMARY KEY, value BLOB, fence_token INTEGER)` behind
/// the gate.
#[derive(Debug)]
pub struct SqliteKv {
    /// The connection; SQLite serialises writers anyway.
    db: Mutex<Connection>,
    /// The table.
    table: String,
}

impl SqliteKv {
    /// Opens (creating if needed) the database file and the table.
    pub fn open(path: impl AsRef<Path>, table: &str) -> Result<SqliteKv, Error> {
        let db = Connection::open(path)?;
        db.busy_timeout(std::time::Duration::from_secs(5))?;
        SqliteKv::with_connection(db, table)
    }

    /// Uses an open connection (an in-memory one in tests).
    pub fn with_connection(db: Connection, table: &str) -> Result<SqliteKv, Error> {
        let table = ident(table)?.to_owned();
        db.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, value BLOB, {FENCE_COLUMN_DEFAULT} INTEGER NOT NULL)"
        ))?;
        Ok(SqliteKv { db: Mutex::new(db), table })
    }

    /// Runs the conditional upsert; `value` `None` only advances the mark (a read).
    fn fenced(&self, key: &str, token: Token, value: Option<&[u8]>) -> Result<Fenced<Option<Vec<u8>>>, Error> {
        let t = sql_token(token)?;
        let (table, fc) = (&self.table, FENCE_COLUMN_DEFAULT);
        let mut db = self.db.lock().expect("sqlite connection lock");
        let tx = db.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let set_value = if value.is_some() { "value = excluded.value, " } else { "" };
        let sql = format!(
            "INSERT INTO {table} (key, value, {fc}) VALUES (?1, ?2, ?3) \
             ON CONFLICT (key) DO UPDATE SET {set_value}{fc} = excluded.{fc} WHERE {fc} <= excluded.{fc} \
             RETURNING value"
        );
        let row: Option<Option<Vec<u8>>> =
            tx.query_row(&sql, rusqlite::params![key, value, t], |r| r.get(0)).optional()?;
        let outcome = match row {
            Some(v) => Fenced::Accepted(v),
            None => {
                let mark: Option<i64> = tx
                    .query_row(&format!("SELECT {fc} FROM {table} WHERE key = ?1"), [key], |r| r.get(0))
                    .optional()?;
                rejected(token, mark).expect("inside the transaction the mark that refused is still there")
            }
        };
        tx.commit()?;
        Ok(outcome)
    }
}

impl FencedResource for SqliteKv {
    async fn write(&self, key: &str, token: Token, value: &[u8]) -> Result<Fenced<()>, Error> {
        Ok(self.fenced(key, token, Some(value))?.map(|_| ()))
    }

    async fn read(&self, key: &str, token: Token) -> Result<Fenced<Option<Vec<u8>>>, Error> {
        self.fenced(key, token, None)
    }
}
