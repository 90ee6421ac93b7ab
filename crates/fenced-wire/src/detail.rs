//! The typed fields of an error answer: the numbers and names a caller acts on
//! (`holder_token`, `retry_after_ms`, `limit`, ...), one registry for both transports.
//!
//! The server builds its errors from these; the HTTP edge writes each as a member of
//! the JSON error object under [`Detail::name`], the wire protocol as a tagged binary
//! field ([`crate::op::ERROR`]). A field's type is fixed by its variant, so a token is a
//! [`Token`] (never 0) and a lock name is text, on either edge.

use std::borrow::Cow;

use fenced_core::Token;

/// A detail's value as both edges carry it: a number (tokens too) or text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    Number(u64),
    Text(Cow<'a, str>),
}

/// Tags below this carry `u64`; from it on, `len u16` and that many bytes of UTF-8.
/// A reader skips a tag it does not know by this rule alone, so a later release may
/// add fields without a new protocol version.
pub const TEXT_TAGS_FROM: u8 = 128;

/// Declares [`Detail`] from one table: wire tag, name (the JSON member), variant and
/// kind (`token`: a [`Token`], `number`: a `u64`, `text`), so that the tag, the name
/// and the type of a field cannot drift apart.
macro_rules! details {
    ($( $(#[doc = $doc:literal])* $tag:literal $name:literal $variant:ident($kind:ident), )*) => {
        /// One typed field of an error answer.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Detail<'a> {
            $( $(#[doc = $doc])* $variant(details!(@type $kind)), )*
        }

        impl<'a> Detail<'a> {
            /// Every field's name, in tag order.
            pub const NAMES: &'static [&'static str] = &[$($name),*];

            /// The field's name: its member in the HTTP API's JSON error object.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Detail::$variant(_) => $name,)*
                }
            }

            /// The field's tag in a wire error frame.
            pub fn tag(&self) -> u8 {
                match self {
                    $(Detail::$variant(_) => $tag,)*
                }
            }

            /// The field's value, untyped, for an edge to write.
            pub fn value(&self) -> Value<'_> {
                match self {
                    $(Detail::$variant(v) => details!(@value $kind v),)*
                }
            }

            /// The value when it is a number (tokens too).
            pub fn number(&self) -> Option<u64> {
                match self {
                    $(Detail::$variant(v) => details!(@number $kind v),)*
                }
            }

            /// The value when it is text.
            pub fn text(&self) -> Option<&str> {
                match self {
                    $(Detail::$variant(v) => details!(@text $kind v),)*
                }
            }

            /// The same field, borrowing its text from this one.
            pub fn borrowed(&self) -> Detail<'_> {
                match self {
                    $(Detail::$variant(v) => Detail::$variant(details!(@borrowed $kind v)),)*
                }
            }

            /// The same field, owning its text.
            pub fn into_owned(self) -> Detail<'static> {
                match self {
                    $(Detail::$variant(v) => Detail::$variant(details!(@owned $kind v)),)*
                }
            }

            /// The field named `name` (an edge's member name) with `value`; `None` for
            /// a name that is no field, or a value of the wrong kind (text for a
            /// number, 0 for a token).
            pub fn parse(name: &str, value: Value<'a>) -> Option<Detail<'a>> {
                match name {
                    $($name => details!(@parse $kind $variant value),)*
                    _ => None,
                }
            }

            /// The field of wire tag `tag` with `value`: `None` for a tag this release
            /// does not know (skipped), `Some(None)` for a value of the wrong kind.
            pub(crate) fn from_tag(tag: u8, value: Value<'a>) -> Option<Option<Detail<'a>>> {
                match tag {
                    $($tag => Some(details!(@parse $kind $variant value)),)*
                    _ => None,
                }
            }
        }
    };
    (@type token) => { Token };
    (@type number) => { u64 };
    (@type text) => { Cow<'a, str> };
    (@value token $v:ident) => { Value::Number($v.get()) };
    (@value number $v:ident) => { Value::Number(*$v) };
    (@value text $v:ident) => { Value::Text(Cow::Borrowed($v.as_ref())) };
    (@number token $v:ident) => { Some($v.get()) };
    (@number number $v:ident) => { Some(*$v) };
    (@number text $v:ident) => {{ let _ = $v; None }};
    (@text text $v:ident) => { Some($v.as_ref()) };
    (@text $kind:ident $v:ident) => {{ let _ = $v; None }};
    (@borrowed text $v:ident) => { Cow::Borrowed($v.as_ref()) };
    (@borrowed $kind:ident $v:ident) => { *$v };
    (@owned text $v:ident) => { Cow::Owned($v.into_owned()) };
    (@owned $kind:ident $v:ident) => { $v };
    (@parse token $variant:ident $value:ident) => {
        match $value { Value::Number(n) => Token::new(n).map(Detail::$variant), Value::Text(_) => None }
    };
    (@parse number $variant:ident $value:ident) => {
        match $value { Value::Number(n) => Some(Detail::$variant(n)), Value::Text(_) => None }
    };
    (@parse text $variant:ident $value:ident) => {
        match $value { Value::Text(s) => Some(Detail::$variant(s)), Value::Number(_) => None }
    };
}

details! {
    /// The token of the lock's holder (`lock_held`, `not_holder`).
    1 "holder_token" HolderToken(token),
    /// The token a call carried (`stale_token`, `token_not_issued`, `bad_signature`).
    2 "token" Token(token),
    /// A key's mark (`stale_token`; `not_found` of a key that has one).
    3 "highest_seen" HighestSeen(token),
    /// The highest token the service has issued (`token_not_issued`).
    4 "highest_issued" HighestIssued(token),
    /// When to try again (`recovering`, `too_busy`).
    5 "retry_after_ms" RetryAfterMs(number),
    6 "ttl_ms_min" TtlMsMin(number),
    7 "ttl_ms_max" TtlMsMax(number),
    8 "wait_ms_max" WaitMsMax(number),
    9 "lock_delay_ms_max" LockDelayMsMax(number),
    /// The count a `too_many_*`, `invalid_names` or `store_full` refusal hit.
    10 "limit" Limit(number),
    /// The size a `too_large` refusal hit.
    11 "limit_bytes" LimitBytes(number),
    /// The longest name, key or label accepted (`invalid_name`, `invalid_key`, ...).
    12 "len_max" LenMax(number),
    /// The member believed to lead (`not_leader`).
    13 "leader_id" LeaderId(number),
    /// The oldest event index a member still holds (`compacted`).
    14 "oldest_index" OldestIndex(number),
    15 "body_timeout_ms" BodyTimeoutMs(number),
    16 "free_bytes" FreeBytes(number),
    17 "min_free_bytes" MinFreeBytes(number),
    /// The store quota a `store_full` hit: `keys` or `bytes`.
    128 "what" What(text),
    /// The leader's URL, when known (`not_leader`).
    129 "leader_url" LeaderUrl(text),
    /// The operation refused (`forbidden`).
    130 "operation" Operation(text),
    /// The identity refused (`forbidden`).
    131 "identity" Identity(text),
    /// The name an operation was refused on (`forbidden`).
    132 "name" Name(text),
    /// The server's `unfenced_prefix` (`unfenced_key`).
    133 "unfenced_prefix" UnfencedPrefix(text),
    /// The lock whose signature a key asks for (`bad_signature`, `signature_required`).
    134 "lock" Lock(text),
}

/// The number of the field called `name` among `details`, if it is there.
pub fn number(details: &[Detail<'_>], name: &str) -> Option<u64> {
    details.iter().find(|d| d.name() == name).and_then(Detail::number)
}

/// The text of the field called `name` among `details`, if it is there.
pub fn text<'d>(details: &'d [Detail<'_>], name: &str) -> Option<&'d str> {
    details.iter().find(|d| d.name() == name).and_then(Detail::text)
}

/// One of every field, each value its own.
#[cfg(test)]
pub(crate) fn one_of_each() -> Vec<Detail<'static>> {
    Detail::NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let n = Detail::parse(name, Value::Number(i as u64 + 1));
            n.or_else(|| Detail::parse(name, Value::Text(Cow::Owned(format!("{name}-é")))))
                .unwrap_or_else(|| panic!("{name} takes neither a number nor text"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_has_its_own_name_and_tag_and_reads_back() {
        let all = one_of_each();
        assert_eq!(all.len(), Detail::NAMES.len());
        let tags: Vec<u8> = all.iter().map(Detail::tag).collect();
        assert!(tags.windows(2).all(|p| p[0] < p[1]), "tags are unique and in order: {tags:?}");
        for d in &all {
            assert_eq!(d.text().is_some(), d.tag() >= TEXT_TAGS_FROM, "{}: its kind follows its tag", d.name());
            assert_eq!(d.number().is_some(), d.tag() < TEXT_TAGS_FROM, "{}", d.name());
            assert_eq!(Detail::parse(d.name(), d.value()).as_ref(), Some(d), "{} by name", d.name());
            assert_eq!(Detail::from_tag(d.tag(), d.value()), Some(Some(d.clone())), "{} by tag", d.name());
            assert_eq!(&d.clone().into_owned(), d);
        }
    }

    #[test]
    fn a_value_of_the_wrong_kind_is_no_field() {
        assert_eq!(Detail::parse("holder_token", Value::Number(0)), None, "a token is never 0");
        assert_eq!(Detail::parse("holder_token", Value::Text("3".into())), None);
        assert_eq!(Detail::parse("lock", Value::Number(3)), None);
        assert_eq!(Detail::parse("no_such_field", Value::Number(3)), None);
        assert_eq!(Detail::from_tag(1, Value::Number(0)), Some(None));
        assert_eq!(Detail::from_tag(127, Value::Number(0)), None, "unknown: skipped");
        let details = [Detail::RetryAfterMs(5), Detail::Lock("l".into())];
        assert_eq!((number(&details, "retry_after_ms"), text(&details, "lock")), (Some(5), Some("l")));
        assert_eq!((number(&details, "lock"), text(&details, "limit")), (None, None));
    }
}
