//! The store's values and records as the log, snapshots and members carry them (JSON).

/// The store's shared records in the JSON of earlier releases' snapshots: the same
/// map of records as before they were shared.
pub(super) mod shared_records {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::store::Record;

    pub fn serialize<S: Serializer>(v: &BTreeMap<String, Arc<Record>>, s: S) -> Result<S::Ok, S::Error> {
        let plain: BTreeMap<&String, &Record> = v.iter().map(|(k, r)| (k, &**r)).collect();
        plain.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, Arc<Record>>, D::Error> {
        let plain = BTreeMap::<String, Record>::deserialize(d)?;
        Ok(plain.into_iter().map(|(k, r)| (k, Arc::new(r))).collect())
    }
}

/// Values travel in the log, in snapshots and between members as JSON: base64 keeps
/// them a third larger, not four times (an array of numbers).
pub(super) mod bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD.decode(s.as_bytes()).map_err(serde::de::Error::custom)
    }
}

pub(super) mod opt_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => super::bytes::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        #[derive(Deserialize)]
        struct Wrap(#[serde(with = "super::bytes")] Vec<u8>);
        Ok(Option::<Wrap>::deserialize(d)?.map(|Wrap(v)| v))
    }
}
