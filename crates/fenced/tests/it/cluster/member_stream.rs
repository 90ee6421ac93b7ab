//! A member's side of an append stream (`POST /raft/append-stream`), spoken by hand
//! to a follower of a live cluster: a frame trickled past the body deadline, a frame
//! that does not decode, a leader that half-closes. Each time the stream ends as it
//! should and the member goes on serving (and replicating the real leader's log).
//!
//! The members run with `body_timeout_ms` 1000: the deadline of a frame's bytes and of
//! its wait for room in the peer budget.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

use super::*;

fn cluster(name: &str) -> (Cluster, usize, usize) {
    let mut c = Cluster::unstarted(name, 3, None);
    c.env.push(("FENCED_BODY_TIMEOUT_MS", "1000".to_string()));
    c.start_all();
    let l = c.leader(20);
    let f = (0..3).find(|i| *i != l).unwrap();
    (c, l, f)
}

/// The upgrade, by hand: the request, and the 101's head read byte by byte (nothing
/// of the stream after it is taken).
fn upgrade(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /raft/append-stream HTTP/1.1\r\nhost: {addr}\r\nconnection: upgrade\r\nupgrade: fenced-raft-append\r\n\
         content-length: 0\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).unwrap(), 1, "closed in the head: {}", String::from_utf8_lossy(&head));
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    s
}

/// `bytes` as one frame of the stream.
fn frame(bytes: &[u8]) -> Vec<u8> {
    let mut f = (bytes.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(bytes);
    f
}

/// An append of no entries from leader `leader` of `term` (`framing::encode_append`:
/// the header's length, then its JSON), as a frame of the stream. With the member's
/// own vote it is taken, and answered `Ok(None)`: nothing to match, nothing written.
fn empty_append(term: u64, leader: u64) -> Vec<u8> {
    let header = format!(
        r#"{{"vote":{{"leader_id":{{"term":{term},"node_id":{leader}}},"committed":true}},"prev_log_id":null,"entries":[],"leader_commit":null}}"#
    );
    let mut body = (header.len() as u32).to_be_bytes().to_vec();
    body.extend_from_slice(header.as_bytes());
    frame(&body)
}

/// The next frame, `None` at the end of the stream.
fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    match s.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
        Err(e) => panic!("reading a frame: {e}"),
    }
    let mut bytes = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut bytes).unwrap();
    Some(bytes)
}

/// Whether the member closed the stream (its end read, or the connection reset).
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => panic!("a byte from the member where none was due"),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => false,
        Err(_) => true,
    }
}

/// A peer message that declares `len` bytes and sends none: its status. 503
/// `too_busy` at once when the peer budget has no room for it; with room, the member
/// waits for the bytes and answers 408 `body_timeout` after `body_timeout_ms`.
fn declared(addr: SocketAddr, len: u32) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "POST /raft/append HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\n\
         content-length: {len}\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

/// The member's status: serving, and still replicating: a write on the leader reaches
/// its applied index.
fn serves_and_replicates(c: &Cluster, l: usize, f: usize) {
    let (st, v) = call(c.members[f].addr, "GET", "/readyz", "", &[]).unwrap();
    assert_eq!(st, 200, "{v}");
    let (st, g) = call(c.members[l].addr, "POST", "/v1/locks/after/acquire", "{\"ttl_ms\":2000}", &[]).unwrap();
    assert_eq!(st, 200, "{g}");
    let target = c.status(l).unwrap()["commit_index"].as_u64().unwrap();
    until(10, || c.status(f).is_some_and(|s| s["last_applied_index"].as_u64() >= Some(target)));
}

/// A "leader" that sends a frame's length (300 MiB) and then its bytes one at a time,
/// one every 100 ms: far slower than `body_timeout_ms`. While the member waits for the
/// bytes the frame's length is held of its peer budget (a second message of that size
/// finds no room, 503). The member ends the stream within the deadline (1 s, bounded
/// here at 10 s for a slow machine, and not before 0.9 s), gives the budget back (the
/// second message now finds room, and times out waiting for its body: 408), and
/// serves on.
#[test]
fn a_frame_trickled_past_the_body_deadline_ends_the_stream_and_frees_its_budget() {
    let (c, l, f) = cluster("stream-trickle");
    let addr = c.members[f].addr;
    let mut s = upgrade(addr);
    const LEN: u32 = 300 << 20;
    s.write_all(&LEN.to_be_bytes()).unwrap();
    let sent = Instant::now();
    // The member takes the length's share of the budget once it read the length.
    std::thread::sleep(Duration::from_millis(200));
    let (st, text) = declared(addr, LEN);
    assert_eq!(st, 503, "while the frame is read: {text}");
    assert!(text.contains("too_busy"), "{text}");
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut trickled = 0;
    while !closed(&mut s) {
        assert!(sent.elapsed() < Duration::from_secs(10), "the stream is open {trickled} bytes in");
        if s.write_all(b"x").is_err() {
            break;
        }
        trickled += 1;
    }
    let ended = sent.elapsed();
    println!("the member ended a trickled stream after {} ms ({trickled} bytes)", ended.as_millis());
    assert!(ended >= Duration::from_millis(900), "ended before the deadline: {ended:?}");
    let asked = Instant::now();
    let (st, text) = declared(addr, LEN);
    assert_eq!(st, 408, "the budget was not given back: {text}");
    assert!(asked.elapsed() >= Duration::from_millis(900), "{:?}", asked.elapsed());
    serves_and_replicates(&c, l, f);
}

/// A frame that does not decode (not an append: eight bytes of noise, and then a
/// header that is not JSON): the member ends the stream, answering nothing, and
/// serves on.
#[test]
fn a_frame_that_does_not_decode_ends_the_stream() {
    let (c, l, f) = cluster("stream-garbage");
    let addr = c.members[f].addr;
    for junk in [frame(b"\xff\xfe\xfd\xfc\x00\x01\x02\x03"), frame(&[0, 0, 0, 4, b'n', b'o', b'p', b'e'])] {
        let mut s = upgrade(addr);
        s.write_all(&junk).unwrap();
        let sent = Instant::now();
        assert_eq!(read_frame(&mut s), None, "an answer to a frame that does not decode");
        assert!(sent.elapsed() < Duration::from_secs(5), "{:?}", sent.elapsed());
    }
    serves_and_replicates(&c, l, f);
}

/// A "leader" that sends three appends (of no entries, under the member's own vote)
/// and shuts its write side: the member answers all three, in order, then closes.
#[test]
fn a_leader_that_half_closes_is_answered_then_the_stream_closes() {
    let (c, l, f) = cluster("stream-half-close");
    let addr = c.members[f].addr;
    let s = c.status(f).unwrap();
    let (term, leader) = (s["term"].as_u64().unwrap(), s["leader_id"].as_u64().unwrap());
    let mut s = upgrade(addr);
    for _ in 0..3 {
        s.write_all(&empty_append(term, leader)).unwrap();
    }
    s.shutdown(Shutdown::Write).unwrap();
    let sent = Instant::now();
    for n in 1..=3 {
        let answer = read_frame(&mut s).unwrap_or_else(|| panic!("the stream closed before answer {n}"));
        let v: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(v, serde_json::json!({"Ok": {"Ok": null}}), "answer {n}");
    }
    assert_eq!(read_frame(&mut s), None, "the member closes once it answered");
    assert!(sent.elapsed() < Duration::from_secs(5), "{:?}", sent.elapsed());
    serves_and_replicates(&c, l, f);
}
