//! The newtypes every layer shares: fencing tokens, lease ids and lock names.

use std::fmt;

/// A fencing token: strictly increasing over the life of a lock service, never 0.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Token(u64);

impl Token {
    /// The first token a fresh service issues.
    pub const FIRST: Token = Token(1);

    /// `None` for 0, which is never a valid token.
    pub fn new(raw: u64) -> Option<Token> {
        (raw != 0).then_some(Token(raw))
    }

    pub fn get(self) -> u64 {
        self.0
    }

    /// The token after this one. Panics on overflow: 2^64 grants do not happen, and
    /// wrapping would silently break the one property this type exists for.
    pub fn next(self) -> Token {
        Token(self.0.checked_add(1).expect("fencing token space exhausted"))
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A lease id. The server fills it with at least 128 random bits; the simulator
/// may number its leases. The core only compares them.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct LeaseId(pub u128);

/// Serialized as its 32 hex digits (JSON numbers stop at 64 bits in most readers).
#[cfg(feature = "serde")]
impl serde::Serialize for LeaseId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for LeaseId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<LeaseId, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        LeaseId::from_hex(&s).ok_or_else(|| serde::de::Error::custom("a lease id is 32 hex digits"))
    }
}

impl LeaseId {
    /// 32 lowercase hex digits, the wire form.
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// Parses exactly 32 hex digits.
    pub fn from_hex(s: &str) -> Option<LeaseId> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(LeaseId)
    }

    /// Fewest distinct hex digits an id a caller names may have (see [`Self::looks_random`]).
    pub const DISTINCT_DIGITS_MIN: usize = 6;

    /// Whether this id could have been drawn at random: at least
    /// [`Self::DISTINCT_DIGITS_MIN`] of the 16 hex digits occur in its 32. An id a
    /// caller names is the lease's capability, so `000…0`, `123…123` or a counter must
    /// be refused; 128 random bits have fewer than six distinct digits with a
    /// probability below 10^-9 (16 choose 5, times (5/16)^32).
    pub fn looks_random(self) -> bool {
        let mut seen = 0u16;
        let mut v = self.0;
        for _ in 0..32 {
            seen |= 1 << (v & 0xf);
            v >>= 4;
        }
        seen.count_ones() as usize >= Self::DISTINCT_DIGITS_MIN
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A lock name: UTF-8, 1 to `LockName::LEN_MAX` bytes, `/` allowed for hierarchy,
/// no control characters. Cloning is a reference-count increment.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct LockName(std::sync::Arc<str>);

#[cfg(feature = "serde")]
impl serde::Serialize for LockName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Validated like any name from outside: a log or snapshot cannot smuggle one in.
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for LockName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<LockName, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        LockName::new(&s).map_err(serde::de::Error::custom)
    }
}

/// Why a string is not a valid lock name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NameError {
    Empty,
    TooLong { len: usize, len_max: usize },
    ControlCharacter,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::Empty => write!(f, "a lock name must not be empty"),
            NameError::TooLong { len, len_max } => {
                write!(f, "a lock name is at most {len_max} bytes, this one is {len}")
            }
            NameError::ControlCharacter => {
                write!(f, "a lock name must not contain control characters")
            }
        }
    }
}

impl std::error::Error for NameError {}

impl LockName {
    /// The design's upper bound on a name, in bytes.
    pub const LEN_MAX: usize = 256;

    pub fn new(name: &str) -> Result<LockName, NameError> {
        LockName::with_len_max(name, LockName::LEN_MAX)
    }

    /// Validates against a configured bound, itself capped at `LEN_MAX`.
    pub fn with_len_max(name: &str, len_max: usize) -> Result<LockName, NameError> {
        let len_max = len_max.min(LockName::LEN_MAX);
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > len_max {
            return Err(NameError::TooLong { len: name.len(), len_max });
        }
        if name.chars().any(char::is_control) {
            return Err(NameError::ControlCharacter);
        }
        Ok(LockName(name.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses a duration written like `750ms`, `90s`, `10m`, `1h` (or a bare number of
/// milliseconds) into milliseconds.
pub fn duration_ms(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err(format!("'{s}' is not a duration: write it like 750ms, 90s, 10m or 1h"));
    }
    let n: u64 = digits.parse().map_err(|_| format!("'{s}' is too large"))?;
    let scale = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("'{s}' has an unknown unit '{unit}': use ms, s, m or h")),
    };
    n.checked_mul(scale).ok_or_else(|| format!("'{s}' is too large"))
}

/// The bytes a grant's signature covers: a domain tag, the service's identity, the lock
/// name and the token, so that a signature proves the service issued that token for that
/// lock (and no other lock, and no other service sharing the key). What every verifier
/// (the Rust, Python and TypeScript gates) rebuilds.
pub fn grant_message(service: &str, name: &str, token: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(24 + service.len() + name.len());
    m.extend_from_slice(b"fenced-grant-v1\0");
    m.extend_from_slice(service.as_bytes());
    m.push(0);
    m.extend_from_slice(name.as_bytes());
    m.push(0);
    m.extend_from_slice(&token.to_be_bytes());
    m
}

/// Bytes as lowercase hex (a grant's signature, a key).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex (either case) as bytes; `None` for an odd length or a non-hex digit.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let digit = |b: u8| (b as char).to_digit(16);
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes.chunks(2).map(|p| Some((digit(p[0])? * 16 + digit(p[1])?) as u8)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_not_a_token() {
        assert_eq!(Token::new(0), None);
        assert_eq!(Token::new(7).map(Token::get), Some(7));
        assert_eq!(Token::FIRST.next().get(), 2);
    }

    #[test]
    fn lease_id_hex_round_trip() {
        let id = LeaseId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        assert_eq!(LeaseId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(LeaseId::from_hex("abc"), None);
        assert_eq!(LeaseId::from_hex(&"g".repeat(32)), None);
    }

    #[test]
    fn names_are_bounded() {
        assert_eq!(LockName::new(""), Err(NameError::Empty));
        assert!(LockName::new(&"a".repeat(256)).is_ok());
        assert_eq!(LockName::new(&"a".repeat(257)), Err(NameError::TooLong { len: 257, len_max: 256 }));
        assert_eq!(LockName::new("a\nb"), Err(NameError::ControlCharacter));
        assert_eq!(LockName::new("orders/42").unwrap().as_str(), "orders/42");
        assert!(LockName::with_len_max("abcd", 3).is_err());
    }
}
