//! The embedded-database backend: one redb file, every commit `Durability::Immediate`
//! (it returns after fsync).

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::backend::{Backend, Txn};
use crate::{db_err, StoreError};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");

pub struct RedbBackend {
    db: Database,
}

impl RedbBackend {
    /// Opens or creates `dir/fenced.redb` (redb repairs it after a crash).
    pub fn open(dir: &Path) -> Result<RedbBackend, StoreError> {
        std::fs::create_dir_all(dir).map_err(db_err)?;
        let db = Database::create(dir.join("fenced.redb")).map_err(db_err)?;
        let txn = db.begin_write().map_err(db_err)?;
        txn.open_table(META).map_err(db_err)?;
        txn.open_table(KV).map_err(db_err)?;
        txn.commit().map_err(db_err)?;
        Ok(RedbBackend { db })
    }
}

struct RedbTxn<'t> {
    meta: redb::Table<'t, &'static str, u64>,
    kv: redb::Table<'t, &'static str, &'static [u8]>,
}

impl Txn for RedbTxn<'_> {
    fn meta_get(&mut self, name: &str) -> Result<Option<u64>, StoreError> {
        Ok(self.meta.get(name).map_err(db_err)?.map(|v| v.value()))
    }
    fn meta_put(&mut self, name: &str, value: u64) -> Result<(), StoreError> {
        self.meta.insert(name, value).map_err(db_err).map(drop)
    }
    fn meta_delete(&mut self, name: &str) -> Result<(), StoreError> {
        self.meta.remove(name).map_err(db_err).map(drop)
    }
    fn meta_scan(&mut self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let mut out = Vec::new();
        for row in self.meta.range(prefix..).map_err(db_err)? {
            let (k, v) = row.map_err(db_err)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push((k.value().to_string(), v.value()));
        }
        Ok(out)
    }
    fn kv_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.kv.get(key).map_err(db_err)?.map(|v| v.value().to_vec()))
    }
    fn kv_put(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.kv.insert(key, value).map_err(db_err).map(drop)
    }
}

impl Backend for RedbBackend {
    fn transact(&self, body: &mut dyn FnMut(&mut dyn Txn) -> Result<(), StoreError>) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(db_err)?;
        {
            let mut t =
                RedbTxn { meta: txn.open_table(META).map_err(db_err)?, kv: txn.open_table(KV).map_err(db_err)? };
            // On error the transaction is dropped uncommitted: redb aborts it.
            body(&mut t)?;
        }
        txn.commit().map_err(db_err)
    }

    fn kv_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let table = txn.open_table(KV).map_err(db_err)?;
        Ok(table.get(key).map_err(db_err)?.map(|v| v.value().to_vec()))
    }

    fn kv_scan(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let table = txn.open_table(KV).map_err(db_err)?;
        let mut out = Vec::new();
        for entry in table.range(prefix..).map_err(db_err)? {
            let (k, v) = entry.map_err(db_err)?;
            if !k.value().starts_with(prefix) || out.len() >= limit {
                break;
            }
            out.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(out)
    }
}
