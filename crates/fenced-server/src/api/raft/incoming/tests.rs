use std::time::Duration;

use super::*;

const IDLE: Duration = Duration::from_secs(5);

fn meta() -> fenced_raft::SnapshotMeta {
    let log_id = serde_json::json!({"leader_id": {"term": 2, "node_id": 1}, "index": 9});
    fenced_raft::SnapshotMeta {
        last_log_id: Some(serde_json::from_value(log_id).unwrap()),
        last_membership: Default::default(),
    }
}

fn vote() -> fenced_raft::Vote {
    fenced_raft::Vote::new_committed(2, 1)
}

fn data() -> Vec<u8> {
    (0..300_000u32).map(|i| (i % 251) as u8).collect()
}

/// A message: the frame's header, then `bytes`, in chunks of 64 KiB; cut (an error
/// from the stream, as hyper gives when the sender's connection drops) after `cut_at`
/// bytes of the whole message when given.
fn message(bytes: &[u8], cut_at: Option<usize>) -> Body {
    let mut whole = fenced_raft::framing::snapshot_head(&vote(), &meta());
    whole.extend_from_slice(bytes);
    let end = cut_at.unwrap_or(whole.len());
    let mut chunks: Vec<Result<Bytes, std::io::Error>> =
        whole[..end].chunks(64 << 10).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    if cut_at.is_some() {
        chunks.push(Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "the leader went away")));
    }
    Body::from_stream(futures_util::stream::iter(chunks))
}

fn named(offset: u64) -> Resume {
    Resume { id: Some("2-1-9-300000-0badcafe".into()), offset }
}

struct Dir(std::path::PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("fenced-incoming-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn path(&self) -> std::path::PathBuf {
        self.0.join(fenced_raft::snapshot_file::INCOMING)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A whole message is received: its vote, meta and bytes as sent, nothing kept for a
/// resume, and the file is a whole kept snapshot (meta, bytes, checksum) to be renamed
/// at install, not written again.
#[tokio::test]
async fn a_whole_message_is_received_into_a_kept_snapshot_file() {
    let dir = Dir::new("whole");
    let mut held = None;
    let (r, kept) =
        receive_into(&dir.path(), &mut held, named(0), message(&data(), None), IDLE, &AtomicU64::new(0)).await;
    let (v, m, bytes) = r.unwrap();
    assert_eq!((v, m.last_log_id, bytes), (vote(), meta().last_log_id, data()));
    assert_eq!(kept, None);
    let (kept_meta, kept_data) = fenced_raft::snapshot_file::read_path(&dir.path()).expect("a whole snapshot file");
    assert_eq!(kept_meta, serde_json::to_vec(&meta()).unwrap());
    assert_eq!(kept_data, data());
    assert!(!dir.0.join(fenced_raft::snapshot_file::INCOMING_ID).exists(), "the name goes once the bytes are whole");
}

/// A member that restarts in the middle of a named transfer finds what it held and its
/// name ([`recovered`]), and the leader's next message resumes from there; a file
/// without its name is removed at start.
#[tokio::test]
async fn a_transfer_cut_by_a_restart_resumes_too() {
    let dir = Dir::new("restarted");
    let head = fenced_raft::framing::snapshot_head(&vote(), &meta()).len();
    let first = message(&data(), Some(head + 120_000));
    let (r, kept) = receive_into(&dir.path(), &mut None, named(0), first, IDLE, &AtomicU64::new(0)).await;
    assert!(r.is_err());
    assert_eq!(kept.as_ref().map(|p| p.len), Some(120_000));
    // The process goes; the files stay.
    let found = recovered_partial(&dir.0).expect("a cut transfer is found at start");
    assert_eq!(found, kept.unwrap());
    let mut held = Some(found);
    let rest = &data()[120_000..];
    let (r, _) =
        receive_into(&dir.path(), &mut held, named(120_000), message(rest, None), IDLE, &AtomicU64::new(0)).await;
    assert_eq!(r.unwrap().2, data());
    // A file without its name (an unnamed transfer, cut) is not resumed, and goes.
    std::fs::write(dir.path(), b"left over").unwrap();
    assert_eq!(recovered_partial(&dir.0), None);
    assert!(!dir.path().exists());
}

/// A named transfer cut midway keeps what arrived under its name; the leader's next
/// message, from that offset, completes it, and the bytes are the snapshot's whole.
#[tokio::test]
async fn a_cut_named_transfer_resumes_where_it_stopped() {
    let dir = Dir::new("resume");
    let mut held = None;
    let head = fenced_raft::framing::snapshot_head(&vote(), &meta()).len();
    let received = AtomicU64::new(0);
    let first = message(&data(), Some(head + 200_000));
    let (r, kept) = receive_into(&dir.path(), &mut held, named(0), first, IDLE, &received).await;
    assert_eq!(r.unwrap_err().code, "invalid_body");
    let kept = kept.expect("a cut named transfer is kept");
    assert_eq!(kept, Partial { id: named(0).id.unwrap(), len: 200_000, installed: false });
    let incoming: Incoming = std::sync::Arc::new(tokio::sync::Mutex::new(Some(kept.clone())));
    assert_eq!(offset(&incoming, &kept.id).unwrap(), 200_000);
    assert_eq!(offset(&incoming, "another snapshot").unwrap(), 0, "held bytes are offered only under their name");

    let mut held = Some(kept);
    let rest = &data()[200_000..];
    let (r, kept) = receive_into(&dir.path(), &mut held, named(200_000), message(rest, None), IDLE, &received).await;
    assert_eq!(r.unwrap().2, data(), "the resumed bytes are the snapshot's, in order");
    assert_eq!(kept, None);
    assert_eq!(received.into_inner(), data().len() as u64, "no byte crossed twice");
}

/// A resume that does not continue what is held (another offset, another name, nothing
/// held) is refused and drops what was held: the leader starts again from nothing.
#[tokio::test]
async fn a_resume_that_does_not_continue_what_is_held_is_refused() {
    let dir = Dir::new("mismatch");
    let id = named(0).id.unwrap();
    for (held, resume) in [
        (Some(Partial { id: id.clone(), len: 1_000, installed: false }), named(2_000)),
        (Some(Partial { id: "another".into(), len: 2_000, installed: false }), named(2_000)),
        (None, named(2_000)),
        // What was installed whole is answered before a message is read, never resumed.
        (Some(Partial { id: id.clone(), len: 2_000, installed: true }), named(2_000)),
    ] {
        std::fs::write(dir.path(), vec![7u8; 2_000]).unwrap();
        let mut held = held;
        let (r, kept) =
            receive_into(&dir.path(), &mut held, resume, message(&data()[2_000..], None), IDLE, &AtomicU64::new(0))
                .await;
        let e = r.unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::CONFLICT, "snapshot_not_resumable"), "{}", e.message);
        assert_eq!(kept, None);
        assert!(!dir.path().exists(), "what was held is dropped");
    }
}

/// A transfer from the start replaces what was held, even of another snapshot; cut
/// before its first byte, it keeps nothing of the old bytes under the new name.
#[tokio::test]
async fn a_transfer_from_the_start_replaces_what_was_held() {
    let dir = Dir::new("restart");
    std::fs::write(dir.path(), vec![7u8; 5_000]).unwrap();
    let mut held = Some(Partial { id: "older".into(), len: 5_000, installed: false });
    let (r, kept) =
        receive_into(&dir.path(), &mut held, named(0), message(&data(), Some(3)), IDLE, &AtomicU64::new(0)).await;
    assert!(r.is_err());
    assert_eq!(kept, Some(Partial { id: named(0).id.unwrap(), len: 0, installed: false }));
    std::fs::write(dir.path(), vec![7u8; 5_000]).unwrap();
    let mut held = Some(Partial { id: "older".into(), len: 5_000, installed: false });
    let (r, _) = receive_into(&dir.path(), &mut held, named(0), message(&data(), None), IDLE, &AtomicU64::new(0)).await;
    assert_eq!(r.unwrap().2, data());
}

/// A message without a name (a leader before level 3) is never kept when cut, and a
/// message refused for its header keeps nothing either.
#[tokio::test]
async fn unnamed_or_refused_messages_keep_nothing() {
    let dir = Dir::new("unnamed");
    let unnamed = Resume { id: None, offset: 0 };
    let (r, kept) =
        receive_into(&dir.path(), &mut None, unnamed, message(&data(), Some(100_000)), IDLE, &AtomicU64::new(0)).await;
    assert!(r.is_err());
    assert_eq!(kept, None);
    assert!(!dir.path().exists());
    let garbage = Body::from(vec![0xffu8; 64]);
    let (r, kept) = receive_into(&dir.path(), &mut None, named(0), garbage, IDLE, &AtomicU64::new(0)).await;
    assert_eq!(r.unwrap_err().code, "invalid_frame");
    assert_eq!(kept, None);
}

/// Every cut of a whole message is refused, kept for a resume, or read short (the
/// snapshot format's own length and checksum refuse short bytes later): never a panic,
/// and never more bytes than were sent.
#[tokio::test]
async fn every_cut_of_a_message_is_refused_or_read_short() {
    let dir = Dir::new("cuts");
    let mut whole = fenced_raft::framing::snapshot_head(&vote(), &meta());
    whole.extend_from_slice(b"the table's bytes");
    for len in 0..whole.len() {
        let body = Body::from(whole[..len].to_vec());
        let (r, _) =
            receive_into(&dir.path(), &mut None, Resume { id: None, offset: 0 }, body, IDLE, &AtomicU64::new(0)).await;
        if let Ok((_, _, data)) = r {
            assert!(data.len() < 17, "a cut at {len} read whole");
        }
    }
}

/// The headers that say where a message's bytes begin.
#[test]
fn the_resume_headers_are_read_or_refused() {
    let headers = |pairs: &[(&'static str, &'static str)]| {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, axum::http::HeaderValue::from_static(v));
        }
        h
    };
    let (id, off) = (fenced_raft::framing::SNAPSHOT_ID_HEADER, fenced_raft::framing::SNAPSHOT_OFFSET_HEADER);
    assert_eq!(Resume::of(&headers(&[])).unwrap(), Resume { id: None, offset: 0 });
    assert_eq!(Resume::of(&headers(&[(id, "x"), (off, "12")])).unwrap(), Resume { id: Some("x".into()), offset: 12 });
    assert_eq!(Resume::of(&headers(&[(off, "12")])).unwrap_err().code, "invalid_header");
    assert_eq!(Resume::of(&headers(&[(id, "x"), (off, "-1")])).unwrap_err().code, "invalid_header");
}

/// A snapshot installed whole after its leader gave up on the message: the leader,
/// asking again, hears that this member holds all its bytes, and its message resuming
/// at their end is answered without a byte read. Another name, another offset, or
/// an unnamed message is not.
#[tokio::test]
async fn a_snapshot_installed_after_its_leader_gave_up_is_not_sent_again() {
    let headers = |id: &str, offset: u64| {
        let mut h = HeaderMap::new();
        h.insert(fenced_raft::framing::SNAPSHOT_ID_HEADER, id.parse().unwrap());
        h.insert(fenced_raft::framing::SNAPSHOT_OFFSET_HEADER, offset.to_string().parse().unwrap());
        h
    };
    let incoming: Incoming = std::sync::Arc::new(tokio::sync::Mutex::new(None));
    let id = named(0).id.unwrap();
    let mut held = take(&incoming).unwrap();
    assert!(!installed_already(&held, &headers(&id, 300_000)).unwrap());
    installed(&mut held, &headers(&id, 0), 300_000);
    assert!(installed_already(&held, &headers(&id, 300_000)).unwrap());
    assert!(!installed_already(&held, &headers(&id, 299_999)).unwrap());
    assert!(!installed_already(&held, &headers("another", 300_000)).unwrap());
    assert!(!installed_already(&held, &HeaderMap::new()).unwrap());
    drop(held);
    assert_eq!(offset(&incoming, &id).unwrap(), 300_000);
    assert_eq!(offset(&incoming, "another").unwrap(), 0);
}
