//! PostgreSQL as a fenced resource: the mark lives in a column of the guarded row, and
//! every fenced write or read is ONE conditional statement that checks and advances it,
//! so the check and the change cannot be split by another writer.
//!
//! Two shapes: [`PgFence`] adds a fence column to an existing table and runs your
//! `UPDATE .. SET ..` behind the gate; [`PgKv`] is a key-value table implementing
//! [`FencedResource`].

use fenced_core::Token;
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row};

use crate::error::Error;
use crate::resource::{ident, rejected, sql_token, Fenced, FencedResource};

/// The fence column's default name.
pub const FENCE_COLUMN_DEFAULT: &str = "fence_token";

/// The gate on the rows of one existing table.
#[derive(Clone, Debug)]
pub struct PgFence {
    /// The guarded table.
    table: String,
    /// The column that names a row (usually its primary key).
    key_column: String,
    /// The `bigint` column holding each row's highest token seen.
    fence_column: String,
}

impl PgFence {
    /// A gate on `table`, rows named by `key_column`, the mark in `fence_token`.
    pub fn new(table: &str, key_column: &str) -> Result<PgFence, Error> {
        Ok(PgFence {
            table: ident(table)?.to_owned(),
            key_column: ident(key_column)?.to_owned(),
            fence_column: FENCE_COLUMN_DEFAULT.to_owned(),
        })
    }

    /// Keeps the mark in another column.
    pub fn fence_column(mut self, column: &str) -> Result<PgFence, Error> {
        self.fence_column = ident(column)?.to_owned();
        Ok(self)
    }

    /// Adds the fence column to the table if it is not there (existing rows start at 0,
    /// below every token).
    pub async fn add_fence_column(&self, db: &impl GenericClient) -> Result<(), Error> {
        let sql = format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} bigint NOT NULL DEFAULT 0",
            self.table, self.fence_column
        );
        db.batch_execute(&sql).await?;
        Ok(())
    }

    /// `UPDATE table SET <set>, fence = $2 WHERE key = $1 AND fence <= $2` in one
    /// statement. `set` refers to its own parameters from `$3` on. Accepted with the
    /// number of rows changed; `NotFound` when no row has that key.
    pub async fn update(
        &self,
        db: &impl GenericClient,
        key: &(dyn ToSql + Sync),
        token: Token,
        set: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Fenced<u64>, Error> {
        let t = sql_token(token)?;
        let (table, kc, fc) = (&self.table, &self.key_column, &self.fence_column);
        let sql = format!("UPDATE {table} SET {set}, {fc} = $2 WHERE {kc} = $1 AND {fc} <= $2");
        let mut all: Vec<&(dyn ToSql + Sync)> = vec![key, &t];
        all.extend_from_slice(params);
        let changed = db.execute(&sql, &all).await?;
        if changed > 0 {
            return Ok(Fenced::Accepted(changed));
        }
        match rejected(token, self.mark(db, key).await?) {
            Some(r) => Ok(r),
            None => Err(Error::NotFound(format!("no row of {table} with that {kc}"))),
        }
    }

    /// A fenced read: `UPDATE table SET fence = $2 WHERE key = $1 AND fence <= $2
    /// RETURNING <columns>`, one statement that advances the mark and returns the row.
    /// `Accepted(None)` when no row has that key.
    pub async fn read(
        &self,
        db: &impl GenericClient,
        key: &(dyn ToSql + Sync),
        token: Token,
        columns: &str,
    ) -> Result<Fenced<Option<Row>>, Error> {
        let t = sql_token(token)?;
        let (table, kc, fc) = (&self.table, &self.key_column, &self.fence_column);
        let sql = format!("UPDATE {table} SET {fc} = $2 WHERE {kc} = $1 AND {fc} <= $2 RETURNING {columns}");
        if let Some(row) = db.query_opt(&sql, &[key, &t]).await? {
            return Ok(Fenced::Accepted(Some(row)));
        }
        Ok(rejected(token, self.mark(db, key).await?).unwrap_or(Fenced::Accepted(None)))
    }

    /// The row's mark, read after a statement changed nothing, to report `highest_seen`.
    async fn mark(&self, db: &impl GenericClient, key: &(dyn ToSql + Sync)) -> Result<Option<i64>, Error> {
        let sql = format!("SELECT {} FROM {} WHERE {} = $1", self.fence_column, self.table, self.key_column);
        Ok(db.query_opt(&sql, &[key]).await?.map(|r| r.get(0)))
    }
}

/// A key-value table `(key text PRIMARY KEY, value bytea, fence_token bigint)` behind
/// the gate.
#[derive(Debug)]
pub struct PgKv {
    /// The connection; its driver task is the caller's.
    db: tokio_postgres::Client,
    /// The table.
    table: String,
}

impl PgKv {
    /// Uses (and creates if missing) `table` over the connection `db`.
    pub async fn open(db: tokio_postgres::Client, table: &str) -> Result<PgKv, Error> {
        let table = ident(table)?.to_owned();
        db.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (key text PRIMARY KEY, value bytea, {FENCE_COLUMN_DEFAULT} bigint NOT NULL)"
        ))
        .await?;
        Ok(PgKv { db, table })
    }

    /// The connection, for plain (unfenced) queries.
    pub fn db(&self) -> &tokio_postgres::Client {
        &self.db
    }

    async fn mark(&self, key: &str) -> Result<Option<i64>, Error> {
        let sql = format!("SELECT {FENCE_COLUMN_DEFAULT} FROM {} WHERE key = $1", self.table);
        Ok(self.db.query_opt(&sql, &[&key]).await?.map(|r| r.get(0)))
    }
}

impl FencedResource for PgKv {
    /// One statement: insert, or update only where the stored mark is not above the token.
    async fn write(&self, key: &str, token: Token, value: &[u8]) -> Result<Fenced<()>, Error> {
        let t = sql_token(token)?;
        let (table, fc) = (&self.table, FENCE_COLUMN_DEFAULT);
        let sql = format!(
            "INSERT INTO {table} (key, value, {fc}) VALUES ($1, $2, $3) \
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, {fc} = EXCLUDED.{fc} \
             WHERE {table}.{fc} <= EXCLUDED.{fc}"
        );
        if self.db.execute(&sql, &[&key, &value, &t]).await? == 1 {
            return Ok(Fenced::Accepted(()));
        }
        let mark = self.mark(key).await?;
        Ok(rejected(token, mark).expect("a conflicting row whose mark is not above the token was not updated"))
    }

    /// One statement: advances the mark (creating the row with no value if the key is
    /// new, so the mark holds for a key not written yet) and returns the value.
    async fn read(&self, key: &str, token: Token) -> Result<Fenced<Option<Vec<u8>>>, Error> {
        let t = sql_token(token)?;
        let (table, fc) = (&self.table, FENCE_COLUMN_DEFAULT);
        let sql = format!(
            "INSERT INTO {table} (key, value, {fc}) VALUES ($1, NULL, $2) \
             ON CONFLICT (key) DO UPDATE SET {fc} = EXCLUDED.{fc} WHERE {table}.{fc} <= EXCLUDED.{fc} \
             RETURNING value"
        );
        if let Some(row) = self.db.query_opt(&sql, &[&key, &t]).await? {
            return Ok(Fenced::Accepted(row.get(0)));
        }
        let mark = self.mark(key).await?;
        Ok(rejected(token, mark).expect("a conflicting row whose mark is not above the token was not updated"))
    }
}
