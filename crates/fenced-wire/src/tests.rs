//! Round trips of every frame, and what a damaged one becomes.

use fenced_core::{LeaseId, Token};

use super::*;

fn round_trip_request(req: Request<'_>) {
    let mut out = Vec::new();
    encode_request(&mut out, 42, &req);
    let (id, op, payload, used) = split_frame(&out, 1 << 20).unwrap().unwrap();
    assert_eq!((id, used), (42, out.len()));
    assert_eq!(decode_request(id, op, payload).unwrap(), req);
}

fn round_trip_response(resp: Response<'_>) {
    let mut out = Vec::new();
    encode_response(&mut out, 7, &resp);
    let (id, kind, payload, _) = split_frame(&out, 1 << 20).unwrap().unwrap();
    assert_eq!(decode_response(id, kind, payload).unwrap(), resp);
}

#[test]
fn every_request_round_trips() {
    let lease = LeaseId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
    let t = Token::new(9);
    round_trip_request(Request::Auth { token: b"secret" });
    round_trip_request(Request::CreateLease { ttl_ms: 5000 });
    round_trip_request(Request::Keepalive { lease });
    round_trip_request(Request::Revoke { lease });
    round_trip_request(Request::AcquireAll {
        names: vec!["a", "é/b", ""],
        lease: None,
        ttl_ms: Some(100),
        wait_ms: 3,
        lock_delay_ms: 0,
        holder: Some("job"),
    });
    // A name cut short, or bytes after the last: malformed, not misread.
    let mut out = Vec::new();
    let req = Request::AcquireAll {
        names: vec!["ab"],
        lease: Some(lease),
        ttl_ms: None,
        wait_ms: 0,
        lock_delay_ms: 0,
        holder: None,
    };
    encode_request(&mut out, 1, &req);
    let (id, op, payload, _) = split_frame(&out, 1 << 20).unwrap().unwrap();
    assert!(decode_request(id, op, &payload[..payload.len() - 1]).is_err());
    let mut longer = payload.to_vec();
    longer.push(b'x');
    assert!(decode_request(id, op, &longer).is_err());
    round_trip_request(Request::Acquire {
        name: "a/b",
        lease: Some(lease),
        ttl_ms: None,
        wait_ms: 3,
        lock_delay_ms: 4,
        holder: None,
    });
    round_trip_request(Request::Acquire {
        name: "a/b",
        lease: None,
        ttl_ms: Some(100),
        wait_ms: 0,
        lock_delay_ms: 0,
        holder: Some("worker-7 on host-é"),
    });
    round_trip_request(Request::Acquire {
        name: "é",
        lease: None,
        ttl_ms: Some(100),
        wait_ms: 0,
        lock_delay_ms: 0,
        holder: None,
    });
    round_trip_request(Request::Release { name: "x", lease });
    round_trip_request(Request::Check { name: "x", token: 3 });
    round_trip_request(Request::Put { key: "k", token: t, value: b"\x00\x01v" });
    round_trip_request(Request::Put { key: "k", token: None, value: b"" });
    round_trip_request(Request::Get { key: "k", token: t });
    round_trip_request(Request::Cancel { target: 99 });
    round_trip_request(Request::Watch { prefix: "jobs/", since: Some(7), tail: None });
    round_trip_request(Request::Watch { prefix: "", since: None, tail: Some(100) });
    round_trip_request(Request::Watch { prefix: "é", since: None, tail: None });
}

#[test]
fn every_response_round_trips() {
    let lease = LeaseId(u128::MAX);
    let t = Token::new(5).unwrap();
    round_trip_response(Response::Done { op: op::REVOKE });
    round_trip_response(Response::Lease { op: op::KEEPALIVE, lease, ttl_ms: 9 });
    round_trip_response(Response::Granted { token: t, lease, ttl_ms: 100, signature: None });
    round_trip_response(Response::Granted { token: t, lease, ttl_ms: 100, signature: Some(&[7; 64]) });
    round_trip_response(Response::Released { token: t });
    let grants = vec![("a", t), ("é/b", Token::new(9).unwrap())];
    round_trip_response(Response::GrantedAll { lease, ttl_ms: 100, grants: grants.clone(), signatures: vec![] });
    let signatures = vec![&[1u8; 64][..], &[2u8; 64][..]];
    round_trip_response(Response::GrantedAll { lease, ttl_ms: 100, grants, signatures });
    // Signatures that do not add up to one per grant are refused, not half read.
    let mut out = Vec::new();
    encode_response(&mut out, 7, &Response::Granted { token: t, lease, ttl_ms: 1, signature: Some(&[3; 10]) });
    let (id, kind, payload, _) = split_frame(&out, 1 << 20).unwrap().unwrap();
    assert!(matches!(decode_response(id, kind, payload), Err(FrameError::Malformed { .. })));
    round_trip_response(Response::Checked { current: false, token: None });
    round_trip_response(Response::Written { token: t, highest_seen: t });
    round_trip_response(Response::Read { highest_seen: Some(t), value: b"v" });
    let details = [Detail::HolderToken(t)];
    round_trip_response(Response::Error { code: "lock_held", message: "held", details: details.to_vec() });
    round_trip_response(Response::Event { index: 41, data: br#"{"type":"granted"}"# });
    round_trip_response(Response::Mark { index: 40 });
    round_trip_response(Response::Lagged { missed: 9 });
}

#[test]
fn a_preamble_names_its_version() {
    assert_eq!(read_preamble(&PREAMBLE), Ok(Version::CURRENT));
    assert_eq!(Version::CURRENT.preamble(), PREAMBLE);
    assert_eq!(read_preamble(b"FENCED\x00\x02"), Ok(Version::V2));
    assert_eq!(read_preamble(b"FENCED\x00\x01"), Err(PreambleError::Version(1)));
    assert_eq!(read_preamble(b"FENCED\x00\x04"), Err(PreambleError::Version(4)));
    assert_eq!(read_preamble(b"GET / HT"), Err(PreambleError::NotFenced));
    for v in [Version::V2, Version::V3] {
        assert_eq!(Version::from_number(v.number()), Some(v));
        assert_eq!(read_preamble(&v.preamble()), Ok(v));
    }
}

#[test]
fn bad_frames_are_named() {
    assert_eq!(split_frame(&[0, 0], 100), Ok(None));
    assert_eq!(split_frame(&[0, 0, 0, 1], 100), Err(FrameError::TooShort { len: 1 }));
    assert!(matches!(split_frame(b"GET / HTTP/1.1", 100), Err(FrameError::TooLarge { .. })));
    let mut out = Vec::new();
    encode_request(&mut out, 1, &Request::CreateLease { ttl_ms: 1 });
    assert_eq!(split_frame(&out[..out.len() - 1], 100), Ok(None));
    assert_eq!(decode_request(1, 77, b""), Err(FrameError::UnknownOp { id: 1, op: 77 }));
    assert!(matches!(decode_request(1, op::KEEPALIVE, b"short"), Err(FrameError::Malformed { .. })));
    assert!(matches!(
        decode_request(1, op::PUT, &[0, 0, 0, 0, 0, 0, 0, 1, 0, 9, b'k']),
        Err(FrameError::Malformed { .. })
    ));
}
