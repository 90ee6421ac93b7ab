//! The in-memory backend: the same semantics without a disk, for tests and for
//! measuring what durability costs. Nothing survives the process.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crate::backend::{Backend, Txn};
use crate::StoreError;

#[derive(Default)]
pub struct MemoryBackend {
    state: Mutex<State>,
}

#[derive(Default, Clone)]
struct State {
    meta: BTreeMap<String, u64>,
    kv: HashMap<String, Vec<u8>>,
}

/// Writes go to a copy that replaces the state only when the body succeeds.
struct MemTxn<'a> {
    base: &'a State,
    meta: BTreeMap<String, Option<u64>>,
    kv: HashMap<String, Vec<u8>>,
}

impl Txn for MemTxn<'_> {
    fn meta_get(&mut self, name: &str) -> Result<Option<u64>, StoreError> {
        Ok(match self.meta.get(name) {
            Some(v) => *v,
            None => self.base.meta.get(name).copied(),
        })
    }
    fn meta_put(&mut self, name: &str, value: u64) -> Result<(), StoreError> {
        self.meta.insert(name.to_string(), Some(value));
        Ok(())
    }
    fn meta_delete(&mut self, name: &str) -> Result<(), StoreError> {
        self.meta.insert(name.to_string(), None);
        Ok(())
    }
    fn meta_scan(&mut self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let mut all: BTreeMap<String, u64> =
            self.base.meta.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, v)| (k.clone(), *v)).collect();
        for (k, v) in self.meta.iter().filter(|(k, _)| k.starts_with(prefix)) {
            match v {
                Some(v) => all.insert(k.clone(), *v),
                None => all.remove(k),
            };
        }
        Ok(all.into_iter().collect())
    }
    fn kv_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.kv.get(key).or_else(|| self.base.kv.get(key)).cloned())
    }
    fn kv_put(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.kv.insert(key.to_string(), value.to_vec());
        Ok(())
    }
}

impl Backend for MemoryBackend {
    fn transact(&self, body: &mut dyn FnMut(&mut dyn Txn) -> Result<(), StoreError>) -> Result<(), StoreError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut t = MemTxn { base: &state, meta: BTreeMap::new(), kv: HashMap::new() };
        body(&mut t)?;
        let (meta, kv) = (t.meta, t.kv);
        for (k, v) in meta {
            match v {
                Some(v) => state.meta.insert(k, v),
                None => state.meta.remove(&k),
            };
        }
        state.kv.extend(kv);
        Ok(())
    }

    fn kv_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.state.lock().unwrap_or_else(|p| p.into_inner()).kv.get(key).cloned())
    }

    fn kv_scan(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut hits: Vec<(String, Vec<u8>)> =
            state.kv.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, v)| (k.clone(), v.clone())).collect();
        hits.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        hits.truncate(limit);
        Ok(hits)
    }
}
