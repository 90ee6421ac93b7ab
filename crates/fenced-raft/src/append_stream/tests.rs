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
