//! The fenced key-value store, as part of the replicated state: each key's value and
//! its `highest_seen` mark, changed only by [`StoreCommand`]s applied from the log.
//!
//! The store is the reference resource behind the fence gate ([`crate::gate::admit`]):
//! a write or a fenced read carrying token `t` is admitted iff `t >= highest_seen`, and
//! then the mark is `t`. Because the store lives in the same state as the lock table, it
//! also refuses a token the service never issued (unless the key is under the prefix
//! for other lock services' tokens): one buggy client must not shut a key to every real
//! holder for good. Everything that decides an answer is either replicated state or
//! carried in the command (whether a key takes foreign tokens, the quotas), so every
//! replica decides every command the same way.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::Error;
use crate::gate::{admit, Admission, Op};
use crate::Token;

/// The room a record takes against `bytes_max`: its key, its value and 9 bytes for the
/// mark and the "has a value" flag (the layout of the store before it joined the log).
pub const RECORD_OVERHEAD: u64 = 9;

/// Bounds on the store's size, decided by the proposer and carried in the command: a
/// write that would pass one is refused ([`Error::StoreFull`]) and changes nothing,
/// while writes that take no new room (an overwrite no longer than before) go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Quotas {
    /// Keys, counting keys that only a fenced read marked.
    pub keys_max: u64,
    /// Bytes of keys and records together.
    pub bytes_max: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas { keys_max: u64::MAX, bytes_max: u64::MAX }
    }
}

/// Which quota a refused write would have passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Quota {
    Keys,
    Bytes,
}

impl Quota {
    pub fn as_str(self) -> &'static str {
        match self {
            Quota::Keys => "keys",
            Quota::Bytes => "bytes",
        }
    }
}

/// One change to the store (a fenced read is one: it moves the mark).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum StoreCommand {
    /// A fenced write: value and mark change together, or neither.
    Write {
        key: String,
        token: Token,
        #[cfg_attr(feature = "serde", serde(with = "bytes"))]
        value: Vec<u8>,
        /// The key guards a resource locked by another lock service: its tokens are not
        /// this service's, so only the gate's rule applies.
        foreign: bool,
        quotas: Quotas,
    },
    /// A fenced read: admitted tokens move the mark up before the value is returned.
    FencedRead { key: String, token: Token, foreign: bool, quotas: Quotas },
    /// A write to a key the server keeps unfenced: no mark (any mark is dropped), last
    /// writer wins.
    WriteUnfenced {
        key: String,
        #[cfg_attr(feature = "serde", serde(with = "bytes"))]
        value: Vec<u8>,
        quotas: Quotas,
    },
    /// Records of a store kept outside the log (the format before the store joined it),
    /// brought in once. A key the log's store already has keeps its record: anything
    /// there was written after the import began.
    Import { records: Vec<(String, Record)> },
}

impl StoreCommand {
    pub fn key(&self) -> Option<&str> {
        match self {
            StoreCommand::Write { key, .. }
            | StoreCommand::FencedRead { key, .. }
            | StoreCommand::WriteUnfenced { key, .. } => Some(key),
            StoreCommand::Import { .. } => None,
        }
    }
}

/// A key's record: its mark (the highest token any write or fenced read carried) and
/// its value (absent for a key only a fenced read has marked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Record {
    pub mark: Option<Token>,
    #[cfg_attr(feature = "serde", serde(with = "opt_bytes"))]
    pub value: Option<Vec<u8>>,
}

impl Record {
    fn size(&self, key: &str) -> u64 {
        key.len() as u64 + RECORD_OVERHEAD + self.value.as_ref().map_or(0, |v| v.len() as u64)
    }
}

/// What an admitted store command answers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum StoreAnswer {
    /// A fenced write was admitted; the key's mark is now `mark`.
    Written { mark: Token },
    /// A fenced read was admitted: the mark now, and the value (`None`: the key has none).
    Read {
        mark: Token,
        #[cfg_attr(feature = "serde", serde(with = "opt_bytes"))]
        value: Option<Vec<u8>>,
    },
    /// An unfenced write or an import was done.
    Done,
}

/// A key in a listing: its mark and the size of its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    pub key: String,
    pub highest_seen: Option<Token>,
    pub value_bytes: Option<usize>,
}

/// The store's records and what they take.
///
/// Each record is shared (`Arc`), so that a copy of the store (a snapshot's or a
/// backup's point-in-time copy, taken under the state machine's lock) copies the map
/// and a reference count per key, never the values: with a store of hundreds of MiB a
/// deep copy held every apply for a second and more, long enough for the leader to
/// miss its heartbeats and be deposed. A record changed later is replaced, so the copy
/// keeps the old one (copy on write).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Store {
    #[cfg_attr(feature = "serde", serde(with = "shared_records"))]
    records: BTreeMap<String, Arc<Record>>,
    /// Kept as records change: `(keys, bytes)` against the quotas.
    keys: u64,
    bytes: u64,
}

impl Store {
    /// Applies one command. `highest_issued` is the lock service's: a token above it was
    /// never issued.
    pub fn apply(&mut self, cmd: StoreCommand, highest_issued: Option<Token>) -> Result<StoreAnswer, Error> {
        let not_issued = |token: Token, foreign: bool| {
            (!foreign && highest_issued.is_none_or(|h| token > h))
                .then_some(Error::TokenNotIssued { token, highest_issued })
        };
        match cmd {
            StoreCommand::Write { key, token, value, foreign, quotas } => {
                if let Some(e) = not_issued(token, foreign) {
                    return Err(e);
                }
                let mark = self.records.get(&key).and_then(|r| r.mark);
                match admit(mark, Some(token), Op::Write) {
                    Admission::Accepted { token, .. } => {
                        assert!(mark.is_none_or(|m| token >= m), "store mark would regress");
                        self.put(key, Record { mark: Some(token), value: Some(value) }, quotas)?;
                        Ok(StoreAnswer::Written { mark: token })
                    }
                    Admission::Rejected { token, highest_seen } => Err(Error::StaleToken { token, highest_seen }),
                    other => unreachable!("a write with a token was admitted as {other:?}"),
                }
            }
            StoreCommand::FencedRead { key, token, foreign, quotas } => {
                if let Some(e) = not_issued(token, foreign) {
                    return Err(e);
                }
                let old = self.records.get(&key).cloned().unwrap_or_default();
                let old: &Record = &old;
                match admit(old.mark, Some(token), Op::Read) {
                    Admission::Accepted { token, .. } => {
                        if old.mark != Some(token) {
                            self.put(key, Record { mark: Some(token), value: old.value.clone() }, quotas)?;
                        }
                        Ok(StoreAnswer::Read { mark: token, value: old.value.clone() })
                    }
                    Admission::Rejected { token, highest_seen } => Err(Error::StaleToken { token, highest_seen }),
                    other => unreachable!("a read with a token was admitted as {other:?}"),
                }
            }
            StoreCommand::WriteUnfenced { key, value, quotas } => {
                self.put(key, Record { mark: None, value: Some(value) }, quotas)?;
                Ok(StoreAnswer::Done)
            }
            StoreCommand::Import { records } => {
                for (key, record) in records {
                    if !self.records.contains_key(&key) {
                        self.put(key, record, Quotas::default())?;
                    }
                }
                Ok(StoreAnswer::Done)
            }
        }
    }

    /// Puts `record` under `key`, unless that takes the store past a quota; a record
    /// that takes no new room always goes in.
    fn put(&mut self, key: String, record: Record, quotas: Quotas) -> Result<(), Error> {
        let old = self.records.get(&key).map(|r| r.size(&key));
        let keys = self.keys + old.is_none() as u64;
        let bytes = self.bytes - old.unwrap_or(0) + record.size(&key);
        if keys > self.keys && keys > quotas.keys_max {
            return Err(Error::StoreFull { quota: Quota::Keys, limit: quotas.keys_max });
        }
        if bytes > self.bytes && bytes > quotas.bytes_max {
            return Err(Error::StoreFull { quota: Quota::Bytes, limit: quotas.bytes_max });
        }
        self.records.insert(key, Arc::new(record));
        (self.keys, self.bytes) = (keys, bytes);
        Ok(())
    }

    /// A key's record, as of the last applied command.
    pub fn get(&self, key: &str) -> Option<&Record> {
        self.records.get(key).map(|r| &**r)
    }

    /// Keys starting with `prefix`, in order, at most `limit`.
    pub fn list(&self, prefix: &str, limit: usize) -> Vec<KeyInfo> {
        self.records
            .range::<str, _>((std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, r)| KeyInfo { key: k.clone(), highest_seen: r.mark, value_bytes: r.value.as_ref().map(Vec::len) })
            .collect()
    }

    /// Every record, by key.
    pub fn records(&self) -> impl Iterator<Item = (&String, &Record)> {
        self.records.iter().map(|(k, r)| (k, &**r))
    }

    /// Every record, by key, as the store shares it (a copy of the map copies no value).
    pub fn shared_records(&self) -> impl Iterator<Item = (&String, &Arc<Record>)> {
        self.records.iter()
    }

    /// The store of `records` (by key, each once), its usage counted again.
    pub fn from_records(records: Vec<(String, Arc<Record>)>) -> Result<Store, String> {
        if records.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err("its store's keys are not in order, or one repeats".into());
        }
        let bytes = records.iter().map(|(k, r)| r.size(k)).sum();
        let records: BTreeMap<_, _> = records.into_iter().collect();
        Ok(Store { keys: records.len() as u64, bytes, records })
    }

    /// `(keys, bytes)` held, as counted against the quotas.
    pub fn usage(&self) -> (u64, u64) {
        (self.keys, self.bytes)
    }
}

#[cfg(feature = "serde")]
mod json;
#[cfg(feature = "serde")]
use json::{bytes, opt_bytes, shared_records};

#[cfg(test)]
mod tests;
