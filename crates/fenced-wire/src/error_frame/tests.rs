//! Tests of `error_frame`.

use fenced_core::{Error, Token};
use proptest::prelude::*;

use super::*;
use crate::{decode_response, encode_response, op, split_frame};

fn t(n: u64) -> Token {
    Token::new(n).expect("not 0")
}

/// Every refusal of the lock service, as the server carries it: the code, the
/// message, and its details as typed fields.
fn core_errors() -> Vec<Error> {
    Error::examples()
}

fn fields(e: &Error) -> Vec<Detail<'static>> {
    let mut d: Vec<Detail<'static>> = e
        .details()
        .into_iter()
        .map(|(name, v)| Detail::parse(name, Value::Number(v)).unwrap_or_else(|| panic!("{name} is a field")))
        .collect();
    if let Error::StoreFull { quota, .. } = e {
        d.push(Detail::What(quota.as_str().into()));
    }
    d
}

/// The server's own refusals (its edges' codes), each with the fields it sends.
fn edge_errors() -> Vec<(&'static str, Vec<Detail<'static>>)> {
    use Detail as D;
    vec![
        ("invalid_name", vec![D::LenMax(256)]),
        ("invalid_holder", vec![D::LenMax(256)]),
        ("invalid_key", vec![D::LenMax(1024)]),
        ("invalid_key", vec![D::Lock("acct/é".into())]),
        ("invalid_token", vec![]),
        ("token_required", vec![]),
        ("unfenced_key", vec![D::UnfencedPrefix("scratch/".into())]),
        ("not_found", vec![D::HighestSeen(t(7))]),
        ("not_found", vec![]),
        ("forbidden", vec![D::Operation("lock".into()), D::Identity("ci".into()), D::Name("a/b".into())]),
        ("unauthorized", vec![]),
        ("too_large", vec![D::LimitBytes(1 << 20)]),
        ("too_busy", vec![D::RetryAfterMs(100)]),
        ("too_many_connections", vec![]),
        ("bad_preamble", vec![]),
        ("unknown_op", vec![]),
        ("invalid_frame", vec![]),
        ("invalid_query", vec![]),
        ("invalid_forward", vec![]),
        ("cancelled", vec![]),
        ("compacted", vec![D::OldestIndex(41)]),
        ("not_leader", vec![D::LeaderId(2), D::LeaderUrl("https://10.0.0.2:7400".into())]),
        ("insufficient_storage", vec![D::FreeBytes(10), D::MinFreeBytes(1 << 26)]),
        ("signature_required", vec![D::Token(t(5)), D::Lock("acct".into())]),
        ("bad_signature", vec![D::Token(t(5)), D::Lock("acct".into())]),
        ("body_timeout", vec![D::BodyTimeoutMs(10_000)]),
        ("internal", vec![]),
        ("every_field", crate::detail::one_of_each()),
    ]
}

/// Every error the server sends, as `(code, message, details)`.
fn every_error() -> Vec<(String, String, Vec<Detail<'static>>)> {
    let core = core_errors().into_iter().map(|e| (e.code().to_string(), e.to_string(), fields(&e)));
    let edge = edge_errors().into_iter().map(|(c, d)| (c.to_string(), format!("the server said {c}: é"), d));
    core.chain(edge).collect()
}

fn frame(id: u32, code: &str, message: &str, details: &[Detail<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_response(&mut out, id, &Response::Error { code, message, details: details.to_vec() });
    out
}

fn decoded(frame: &[u8]) -> Result<Response<'_>, FrameError> {
    let (id, kind, payload, used) = split_frame(frame, usize::MAX)?.expect("a whole frame");
    assert_eq!(used, frame.len());
    decode_response(id, kind, payload)
}

#[test]
fn every_error_the_server_sends_round_trips_with_its_fields() {
    for (code, message, details) in every_error() {
        let out = frame(9, &code, &message, &details);
        let want = Response::Error { code: &code, message: &message, details: details.clone() };
        assert_eq!(decoded(&out), Ok(want), "{code}");
        assert_eq!(error_code(&out[crate::HEADER_BYTES..]), Some(code.as_str()));
    }
}

#[test]
fn a_core_refusal_reads_back_as_the_error_it_came_from() {
    for e in core_errors() {
        let out = frame(1, e.code(), &e.to_string(), &fields(&e));
        let Ok(Response::Error { code, message, details }) = decoded(&out) else { panic!("{e:?}") };
        assert_eq!(message, e.to_string());
        let back = Error::from_code(code, |name| crate::detail::number(&details, name));
        match e {
            // The quota is text: callers match on the code (see `Error::from_code`).
            Error::StoreFull { quota, limit } => {
                assert_eq!(back, None);
                assert_eq!(crate::detail::text(&details, "what"), Some(quota.as_str()));
                assert_eq!(crate::detail::number(&details, "limit"), Some(limit));
            }
            e => assert_eq!(back, Some(e)),
        }
    }
}

#[test]
fn every_cut_of_an_error_frame_is_refused_never_misread() {
    for (code, message, details) in every_error() {
        let out = frame(3, &code, &message, &details);
        let payload = &out[crate::HEADER_BYTES..];
        for cut in 0..payload.len() {
            let got = decode_response(3, op::ERROR, &payload[..cut]);
            assert!(matches!(got, Err(FrameError::Malformed { id: 3, .. })), "{code} cut at {cut}: {got:?}");
        }
        // A stream cut anywhere is not yet a frame.
        for cut in 0..out.len() {
            assert_eq!(split_frame(&out[..cut], usize::MAX), Ok(None), "{code} cut at {cut}");
        }
        let mut longer = payload.to_vec();
        longer.push(0);
        assert!(decode_response(3, op::ERROR, &longer).is_err(), "{code}: a byte after the last field");
    }
}

#[test]
fn a_flipped_byte_is_refused_or_read_as_a_frame_never_a_panic() {
    for (code, message, details) in every_error() {
        let payload = frame(3, &code, &message, &details)[crate::HEADER_BYTES..].to_vec();
        for at in 0..payload.len() {
            for flip in (0..8).map(|b| 1u8 << b).chain([0xff]) {
                let mut bad = payload.clone();
                bad[at] ^= flip;
                if let Ok(resp) = decode_response(3, op::ERROR, &bad) {
                    // Whatever it read encodes again (fields it did not know dropped).
                    let mut again = Vec::new();
                    encode_response(&mut again, 3, &resp);
                }
            }
        }
    }
}

#[test]
fn a_field_of_a_later_release_is_skipped_and_a_zero_token_refused() {
    let mut payload = Vec::new();
    write(&mut payload, "lock_held", "held", &[Detail::HolderToken(t(4))]);
    let count_at = 1 + "lock_held".len() + 2 + "held".len();
    payload[count_at] = 3;
    payload.extend_from_slice(&[127, 0, 0, 0, 0, 0, 0, 0, 1]); // an unknown number
    payload.extend_from_slice(&[255, 0, 2, b'h', b'i']); // an unknown text
    let got = decode_response(1, op::ERROR, &payload).unwrap();
    let details = [Detail::HolderToken(t(4))];
    assert_eq!(got, Response::Error { code: "lock_held", message: "held", details: details.to_vec() });
    let mut zero = Vec::new();
    write(&mut zero, "lock_held", "held", &[Detail::HolderToken(t(4))]);
    let last = zero.len() - 1;
    zero[last - 7..].fill(0);
    assert!(matches!(decode_response(1, op::ERROR, &zero), Err(FrameError::Malformed { .. })));
}

#[test]
fn long_text_is_cut_on_a_character_boundary() {
    let message = "é".repeat(40_000);
    let lock = "ü".repeat(40_000);
    let out = frame(1, "bad_signature", &message, &[Detail::Lock(lock.as_str().into())]);
    let Ok(Response::Error { message: m, details, .. }) = decoded(&out) else { panic!("not read back") };
    assert!(m.len() <= u16::MAX as usize && message.starts_with(m) && m.len() > 60_000);
    let l = crate::detail::text(&details, "lock").unwrap();
    assert!(l.len() <= u16::MAX as usize && lock.starts_with(l));
}

#[test]
fn version_2s_error_frame_reads_as_before() {
    let mut out = Vec::new();
    let body = br#"{"error":{"code":"lock_held","message":"held","holder_token":3}}"#;
    v2::encode_error(&mut out, 5, "lock_held", body);
    let (id, kind, payload, _) = split_frame(&out, usize::MAX).unwrap().unwrap();
    assert_eq!((id, kind), (5, op::ERROR));
    assert_eq!(v2::decode_error(payload), Some(("lock_held", &body[..])));
    assert_eq!(error_code(payload), Some("lock_held"), "the code is first in every version");
    assert!(decode_response(id, kind, payload).is_err(), "version 3 does not misread version 2's body");
    assert_eq!(v2::decode_error(&[9, b'x']), None);
}

proptest! {
    #[test]
    fn any_payload_of_any_kind_decodes_or_is_refused(kind: u8, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_response(1, kind, &payload);
        let _ = crate::decode_request(1, kind, &payload);
        let _ = error_code(&payload);
    }

    #[test]
    fn any_error_round_trips(
        code in "[a-z_]{1,40}",
        message in ".{0,200}",
        picks in proptest::collection::vec((0..Detail::NAMES.len(), any::<u64>(), ".{0,40}"), 0..8),
    ) {
        let details: Vec<Detail<'static>> = picks
            .into_iter()
            .filter_map(|(i, n, s)| {
                let name = Detail::NAMES[i];
                Detail::parse(name, Value::Number(n)).or_else(|| Detail::parse(name, Value::Text(s.into())))
            })
            .collect();
        let out = frame(7, &code, &message, &details);
        let want = Response::Error { code: &code, message: &message, details: details.clone() };
        prop_assert_eq!(decoded(&out), Ok(want));
    }
}
