//! The leader's side of a stream against a member played by the test, on an
//! in-memory connection.

use std::time::Duration;

use futures_util::StreamExt;
use openraft::vote::RaftLeaderIdExt;
use openraft::EntryPayload;
use tokio::io::{AsyncWriteExt, DuplexStream};

use super::*;
use crate::{Entry, Vote};

fn log_id(index: u64) -> LogId {
    LogId::new(openraft::alias::LeaderIdOf::<TypeConfig>::new_committed(3, 2), index)
}

/// The append of entry `index` alone.
fn append(index: u64) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: Vote::new_committed(3, 2),
        prev_log_id: index.checked_sub(1).map(log_id),
        entries: vec![Entry { log_id: log_id(index), payload: EntryPayload::Blank }],
        leader_commit: None,
    }
}

/// The appends of entries `1..=n`, as openraft's replication stream yields them (its
/// size hint says nothing of its length).
fn appends(n: u64) -> impl futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin + Send + 'static {
    futures_util::stream::iter((1..=n).map(append))
}

/// The member's end: reads one append.
async fn read_append(m: &mut DuplexStream) -> Option<AppendEntriesRequest<TypeConfig>> {
    let len = read_len(m, usize::MAX).await.unwrap()?;
    Some(crate::framing::decode_append(&read_body(m, len).await.unwrap()).unwrap())
}

async fn answer(m: &mut DuplexStream, acked: Option<LogId>) {
    let a: Answer = Ok(Ok(acked));
    write_frame(m, &serde_json::to_vec(&a).unwrap()).await.unwrap();
}

const TTL: Duration = Duration::from_millis(200);

#[tokio::test]
async fn appends_go_before_the_answers_and_the_answers_come_in_order() {
    let (leader, mut member) = tokio::io::duplex(1 << 20);
    let mut out = Box::pin(pipelined(leader, appends(5), TTL, 2));
    let member = tokio::spawn(async move {
        // Every append arrives before any is answered: none waited for an answer.
        let mut got = Vec::new();
        for _ in 0..5 {
            got.push(read_append(&mut member).await.unwrap().entries[0].log_id);
        }
        for id in &got {
            answer(&mut member, Some(*id)).await;
        }
        // The leader closes its side once its input ends.
        assert!(read_append(&mut member).await.is_none());
        got
    });
    let mut acked = Vec::new();
    while let Some(r) = tokio::time::timeout(Duration::from_secs(5), out.next()).await.unwrap() {
        acked.push(r.unwrap().unwrap().unwrap().index);
    }
    assert_eq!(acked, [1, 2, 3, 4, 5]);
    let sent: Vec<u64> = member.await.unwrap().iter().map(|l| l.index).collect();
    assert_eq!(sent, [1, 2, 3, 4, 5]);
}

#[tokio::test]
async fn no_more_than_the_bound_go_unanswered() {
    let n = IN_FLIGHT_MAX as u64 + 8;
    let (leader, mut member) = tokio::io::duplex(64 << 20);
    let mut out = Box::pin(pipelined(leader, appends(n), Duration::from_secs(10), 2));
    let waiting = tokio::spawn(async move { out.next().await.map(|r| r.is_ok()) });
    let mut seen = 0;
    while tokio::time::timeout(Duration::from_millis(300), read_append(&mut member)).await.is_ok() {
        seen += 1;
    }
    assert_eq!(seen, IN_FLIGHT_MAX, "appends sent with none answered");
    // One answer lets one more go.
    answer(&mut member, Some(log_id(1))).await;
    assert_eq!(waiting.await.unwrap(), Some(true));
    assert!(tokio::time::timeout(Duration::from_millis(300), read_append(&mut member)).await.is_ok());
}

#[tokio::test]
async fn an_answer_later_than_the_time_out_ends_the_stream_with_an_error() {
    let (leader, mut member) = tokio::io::duplex(1 << 20);
    let mut out = Box::pin(pipelined(leader, appends(3), TTL, 2));
    let _member = tokio::spawn(async move {
        while read_append(&mut member).await.is_some() {}
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let started = std::time::Instant::now();
    let first = out.next().await.unwrap();
    assert!(matches!(first, Err(RPCError::Network(_))), "{first:?}");
    assert!(started.elapsed() >= TTL && started.elapsed() < TTL * 5, "{:?}", started.elapsed());
    assert!(out.next().await.is_none(), "nothing after the error");
}

#[tokio::test]
async fn an_append_taken_in_part_ends_the_stream() {
    let (leader, mut member) = tokio::io::duplex(1 << 20);
    let mut out = Box::pin(pipelined(leader, appends(3), TTL, 2));
    let _member = tokio::spawn(async move {
        read_append(&mut member).await.unwrap();
        // The first append took nothing: the appends behind it build on entry 1.
        answer(&mut member, None).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    assert!(matches!(out.next().await, Some(Ok(Ok(None)))));
    assert!(out.next().await.is_none(), "the stream ends after the partial answer");
}

#[tokio::test]
async fn a_member_that_closes_the_stream_while_nothing_is_asked_ends_it() {
    let (leader, mut member) = tokio::io::duplex(1 << 20);
    let mut out = Box::pin(pipelined(leader, futures_util::stream::pending(), TTL, 2));
    member.shutdown().await.unwrap();
    drop(member);
    let r = tokio::time::timeout(Duration::from_secs(5), out.next()).await.unwrap();
    assert!(matches!(r, Some(Err(RPCError::Network(_)))), "{r:?}");
}

#[tokio::test]
async fn a_refusal_ends_the_stream() {
    let (leader, mut member) = tokio::io::duplex(1 << 20);
    let mut out = Box::pin(pipelined(leader, appends(2), TTL, 2));
    let _member = tokio::spawn(async move {
        read_append(&mut member).await.unwrap();
        let a: Answer = Ok(Err(openraft::raft::StreamAppendError::HigherVote(Vote::new_committed(9, 1))));
        write_frame(&mut member, &serde_json::to_vec(&a).unwrap()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let r = out.next().await;
    assert!(matches!(r, Some(Ok(Err(_)))), "{r:?}");
    assert!(out.next().await.is_none());
}

/// A member that answers slowly, each answer well within the time-out of the one
/// before but all of them together far past it: the stream goes on (the deadline
/// counts from the last progress, not from the sends). Then it stalls: the error
/// comes a time-out after its last answer, not sooner.
#[tokio::test]
async fn a_member_that_trickles_its_answers_is_not_timed_out_but_one_that_stalls_is() {
    // Each answer 150 ms after the one before, against a time-out of 600 ms: a margin
    // of 450 ms for a loaded test machine. Eight answers take 1.2 s, twice the time-out.
    const TTL: Duration = Duration::from_millis(600);
    const EVERY: Duration = Duration::from_millis(150);
    let (leader, mut member) = tokio::io::duplex(1 << 20);
    let mut out = Box::pin(pipelined(leader, appends(9), TTL, 2));
    let _member = tokio::spawn(async move {
        let mut got = Vec::new();
        for _ in 0..9 {
            got.push(read_append(&mut member).await.unwrap().entries[0].log_id);
        }
        // Every append was sent at once: only the answers trickle. The ninth is never
        // answered.
        for id in &got[..8] {
            tokio::time::sleep(EVERY).await;
            answer(&mut member, Some(*id)).await;
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let started = std::time::Instant::now();
    for index in 1..=8 {
        let r = out.next().await.unwrap();
        assert_eq!(
            r.unwrap().unwrap().unwrap().index,
            index,
            "answer {index} came within the time-out of the one before"
        );
    }
    assert!(started.elapsed() > TTL, "the answers together took longer than one time-out: {:?}", started.elapsed());
    let last_answer = std::time::Instant::now();
    let stalled = tokio::time::timeout(Duration::from_secs(5), out.next()).await.unwrap().unwrap();
    assert!(matches!(stalled, Err(RPCError::Network(_))), "{stalled:?}");
    let waited = last_answer.elapsed();
    assert!(waited >= TTL - Duration::from_millis(50) && waited < TTL * 4, "the stall ended after {waited:?}");
    assert!(out.next().await.is_none(), "nothing after the error");
}

/// A member that shuts its side (no more answers) while appends wait for theirs: the
/// stream ends with an error at once, well before the time-out, and does not hang.
#[tokio::test]
async fn a_member_that_half_closes_with_appends_unanswered_ends_the_stream_at_once() {
    let ttl = Duration::from_secs(30);
    let (leader, mut member) = tokio::io::duplex(1 << 20);
    let mut out = Box::pin(pipelined(leader, appends(3), ttl, 2));
    let member = tokio::spawn(async move {
        for _ in 0..3 {
            read_append(&mut member).await.unwrap();
        }
        answer(&mut member, Some(log_id(1))).await;
        // The write side only: the member's end stays open (it would read on).
        member.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(member);
    });
    let started = std::time::Instant::now();
    let first = tokio::time::timeout(Duration::from_secs(5), out.next()).await.unwrap();
    assert!(matches!(first, Some(Ok(Ok(Some(id)))) if id == log_id(1)), "{first:?}");
    let r = tokio::time::timeout(Duration::from_secs(5), out.next()).await.expect("the stream hung").unwrap();
    let Err(RPCError::Network(e)) = r else { panic!("{r:?}") };
    assert!(!e.to_string().contains("in time"), "ended by the end of the stream, not the time-out: {e}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(
        tokio::time::timeout(Duration::from_secs(5), out.next()).await.unwrap().is_none(),
        "nothing after the error"
    );
    member.abort();
}

/// A member that sends a length over [`ANSWER_BYTES_MAX`] (garbage, or a member gone
/// wrong): an error as soon as the four bytes are read. The leader neither allocates
/// the length nor waits for its bytes, which never come: the error comes long before
/// the time-out, which a read of the body would have run into.
#[tokio::test]
async fn an_answer_length_over_the_bound_ends_the_stream_without_reading_it() {
    for len in [ANSWER_BYTES_MAX as u32 + 1, u32::MAX] {
        let ttl = Duration::from_secs(30);
        let (leader, mut member) = tokio::io::duplex(1 << 20);
        let mut out = Box::pin(pipelined(leader, appends(2), ttl, 2));
        let member = tokio::spawn(async move {
            read_append(&mut member).await.unwrap();
            member.write_all(&len.to_be_bytes()).await.unwrap();
            member.write_all(b"{\"Ok\"").await.unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(member);
        });
        let r = tokio::time::timeout(Duration::from_secs(5), out.next()).await.expect("the stream hung").unwrap();
        let Err(RPCError::Network(e)) = r else { panic!("{len}: {r:?}") };
        assert!(e.to_string().contains(&format!("a frame of {len} bytes, over {ANSWER_BYTES_MAX}")), "{e}");
        assert!(tokio::time::timeout(Duration::from_secs(5), out.next()).await.unwrap().is_none());
        member.abort();
    }
}

/// The bound itself is taken: an answer of exactly [`ANSWER_BYTES_MAX`] bytes is read
/// (it does not decode, and says so, which a refusal of its length would not).
#[tokio::test]
async fn an_answer_of_the_bound_is_read() {
    let (leader, mut member) = tokio::io::duplex(4 << 20);
    let mut out = Box::pin(pipelined(leader, appends(1), Duration::from_secs(30), 2));
    let member = tokio::spawn(async move {
        read_append(&mut member).await.unwrap();
        write_frame(&mut member, &vec![b' '; ANSWER_BYTES_MAX]).await.unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(member);
    });
    let r = tokio::time::timeout(Duration::from_secs(5), out.next()).await.unwrap().unwrap();
    let Err(RPCError::Network(e)) = r else { panic!("{r:?}") };
    assert!(e.to_string().contains("does not decode"), "{e}");
    member.abort();
}
