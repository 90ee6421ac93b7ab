//! The narrow trait a storage engine implements: atomic, durable transactions over two
//! tables (meta: name to `u64`; kv: key to bytes), and reads of committed state.

use crate::StoreError;

/// A storage engine. `transact` returns `Ok` only once every write of `body` is
/// durable, all together; on `Err` none of them happened.
pub trait Backend: Send + Sync + 'static {
    fn transact(&self, body: &mut dyn FnMut(&mut dyn Txn) -> Result<(), StoreError>) -> Result<(), StoreError>;

    /// A value of the kv table as last committed.
    fn kv_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Up to `limit` records of the kv table whose keys start with `prefix`, in key
    /// order, as last committed.
    fn kv_scan(&self, prefix: &str, limit: usize) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
}

/// The operations inside one transaction; reads see the transaction's own writes.
pub trait Txn {
    fn meta_get(&mut self, name: &str) -> Result<Option<u64>, StoreError>;
    fn meta_put(&mut self, name: &str, value: u64) -> Result<(), StoreError>;
    fn meta_delete(&mut self, name: &str) -> Result<(), StoreError>;
    /// Every meta entry whose name starts with `prefix`, in name order.
    fn meta_scan(&mut self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError>;
    fn kv_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    fn kv_put(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError>;
}
