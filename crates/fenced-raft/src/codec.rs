//! The primitives of the binary formats written by hand (`entry_format`,
//! `snapshot_format`): LEB128 varints, lease ids as 16 bytes little-endian, strings
//! and byte strings as a varint length and the bytes, options as a flag byte, and the
//! CRC-32C that guards a record. Each format adds its own `impl Reader` for its
//! compound fields.

use fenced_core::{LeaseId, Limits, LockName, Quotas, Token};

/// The CRC-32C (Castagnoli) of `bytes`.
pub(crate) fn crc(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

pub(crate) fn put_u64(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}

pub(crate) fn put_name(out: &mut Vec<u8>, name: &LockName) {
    put_bytes(out, name.as_str().as_bytes());
}

pub(crate) fn put_lease(out: &mut Vec<u8>, lease: LeaseId) {
    out.extend_from_slice(&lease.0.to_le_bytes());
}

pub(crate) fn put_flag(out: &mut Vec<u8>, v: bool) {
    out.push(u8::from(v));
}

pub(crate) fn put_opt<T>(out: &mut Vec<u8>, v: Option<T>, put: impl FnOnce(&mut Vec<u8>, T)) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            put(out, v);
        }
    }
}

pub(crate) fn put_quotas(out: &mut Vec<u8>, q: Quotas) {
    put_u64(out, q.keys_max);
    put_u64(out, q.bytes_max);
}

/// The limits, field by field in a fixed order (each a varint).
pub(crate) fn put_limits(out: &mut Vec<u8>, l: &Limits) {
    let Limits {
        leases_max,
        locks_max,
        waiters_max,
        waiters_per_lock_max,
        ttl_ms_min,
        ttl_ms_max,
        wait_ms_max,
        lock_delay_ms_max,
    } = l;
    for n in [*leases_max, *locks_max, *waiters_max, *waiters_per_lock_max] {
        put_u64(out, n as u64);
    }
    for n in [*ttl_ms_min, *ttl_ms_max, *wait_ms_max, *lock_delay_ms_max] {
        put_u64(out, n);
    }
}

/// Reads a body front to back; every read is bounded by the bytes left, so a damaged
/// length is an error, never an allocation of what it claims.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    /// Refused unless every byte was read.
    pub(crate) fn end(&self) -> Result<(), String> {
        match self.bytes.len() {
            0 => Ok(()),
            n => Err(format!("{n} bytes follow its fields")),
        }
    }

    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        let (&b, rest) = self.bytes.split_first().ok_or("the record ends early")?;
        self.bytes = rest;
        Ok(b)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            // The tenth byte carries the 64th bit alone.
            if i == 9 && b > 1 {
                break;
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err("a varint overflows".into())
    }

    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        let v = self.u64()?;
        u32::try_from(v).map_err(|_| format!("{v} does not fit 32 bits"))
    }

    /// A count of items each at least `item_min` bytes long: never more than the bytes
    /// left could hold.
    pub(crate) fn count(&mut self, item_min: usize) -> Result<usize, String> {
        let n = self.u64()?;
        match usize::try_from(n) {
            Ok(n) if n.saturating_mul(item_min) <= self.bytes.len() => Ok(n),
            _ => Err(format!("a count of {n} is more than the record holds")),
        }
    }

    /// `count(item_min)` items, each read by `read`.
    pub(crate) fn list<T>(
        &mut self,
        item_min: usize,
        mut read: impl FnMut(&mut Self) -> Result<T, String>,
    ) -> Result<Vec<T>, String> {
        let n = self.count(item_min)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(read(self)?);
        }
        Ok(v)
    }

    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.count(1)?;
        let (b, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(b)
    }

    pub(crate) fn string(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| "a string is not UTF-8".into())
    }

    pub(crate) fn name(&mut self) -> Result<LockName, String> {
        LockName::new(&self.string()?).map_err(|e| format!("lock name: {e}"))
    }

    pub(crate) fn token(&mut self) -> Result<Token, String> {
        Token::new(self.u64()?).ok_or_else(|| "token 0".into())
    }

    pub(crate) fn flag(&mut self) -> Result<bool, String> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(format!("a flag of {b}")),
        }
    }

    pub(crate) fn opt<T>(&mut self, read: impl FnOnce(&mut Self) -> Result<T, String>) -> Result<Option<T>, String> {
        if self.flag()? {
            read(self).map(Some)
        } else {
            Ok(None)
        }
    }

    pub(crate) fn lease(&mut self) -> Result<LeaseId, String> {
        let (b, rest) = self.bytes.split_at_checked(16).ok_or("the record ends early")?;
        self.bytes = rest;
        Ok(LeaseId(u128::from_le_bytes(b.try_into().expect("16 bytes"))))
    }

    pub(crate) fn quotas(&mut self) -> Result<Quotas, String> {
        Ok(Quotas { keys_max: self.u64()?, bytes_max: self.u64()? })
    }

    pub(crate) fn usize(&mut self) -> Result<usize, String> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| format!("{v} does not fit this machine's word"))
    }

    pub(crate) fn limits(&mut self) -> Result<Limits, String> {
        Ok(Limits {
            leases_max: self.usize()?,
            locks_max: self.usize()?,
            waiters_max: self.usize()?,
            waiters_per_lock_max: self.usize()?,
            ttl_ms_min: self.u64()?,
            ttl_ms_max: self.u64()?,
            wait_ms_max: self.u64()?,
            lock_delay_ms_max: self.u64()?,
        })
    }
}
