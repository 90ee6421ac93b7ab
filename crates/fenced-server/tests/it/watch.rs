//! issue 29: events with a position, and an operator's release by name.
//!
//! A watcher of a prefix reconnects again and again, cut mid-stream under load, and
//! resumes from its last index: every grant and release of the workers' locks arrives
//! once, in order, and nothing of another prefix. Past the retention a resume is
//! refused 410 `compacted` with the oldest index held.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{eventually, request, TestServer};

/// One SSE block: its `id:`, `event:` and `data:` (a position marker has only an id).
#[derive(Debug, Default)]
struct Block {
    id: Option<u64>,
    kind: Option<String>,
    data: Option<Value>,
}

/// An event stream over HTTP/1.0 (no chunked framing: the body is the SSE text as it
/// is, until the server closes).
struct Stream {
    status: u16,
    reader: BufReader<TcpStream>,
    /// The rest of the head, or the error body when not 200.
    head: String,
}

fn open(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Stream {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut req = format!("GET {path} HTTP/1.0\r\nhost: x\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    c.write_all(req.as_bytes()).unwrap();
    let mut reader = BufReader::new(c);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut head = String::new();
    loop {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream closed in its head");
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    Stream { status, reader, head }
}

impl Stream {
    /// The next block, or `None` when the stream ended.
    fn next(&mut self) -> Option<Block> {
        let mut b = Block::default();
        let mut any = false;
        let mut line = String::new();
        loop {
            line.clear();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let l = line.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                if any {
                    return Some(b);
                }
                continue;
            }
            any = true;
            if let Some(v) = l.strip_prefix("id: ") {
                b.id = Some(v.parse().unwrap());
            } else if let Some(v) = l.strip_prefix("event: ") {
                b.kind = Some(v.into());
            } else if let Some(v) = l.strip_prefix("data: ") {
                b.data = Some(serde_json::from_str(v).unwrap());
            }
        }
    }

    fn body(&mut self) -> Value {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.reader, &mut rest);
        serde_json::from_str(&rest).unwrap_or(Value::Null)
    }

    fn cut(self) {
        let _ = self.reader.get_ref().shutdown(Shutdown::Both);
    }
}

/// What the watcher saw, by index: (type, name, token).
type Seen = BTreeMap<u64, (String, String, u64)>;

#[test]
fn a_watcher_cut_again_and_again_under_load_resumes_with_nothing_lost_or_repeated() {
    if let Err(e) = cut_and_resume(0) {
        panic!("{e}");
    }
}

/// The negative control: a watcher that resumes one position too far on (a client that
/// adds one to its `since`) loses events, and the same check says so.
#[test]
fn the_watch_check_catches_a_watcher_that_resumes_one_too_far() {
    let e = cut_and_resume(1).expect_err("a watcher that skips was not caught");
    assert!(e.contains("seen"), "{e}");
}

/// Runs the cut-and-resume watcher, resuming at `skip` past its position (0: honest);
/// `Err` when an event of the load was missed or one came twice.
fn cut_and_resume(skip: u64) -> Result<(), String> {
    let s = TestServer::start();
    let addr = s.addr;
    let done = Arc::new(AtomicBool::new(false));
    let workers = start_load(addr, &done);
    // The watcher: cut after a few events each time (sometimes inside a burst), resumed
    // by `since` or by `Last-Event-ID`, alternately.
    let mut seen = Seen::new();
    // From the start: the load begins before the first stream is open.
    let mut last: Option<u64> = Some(0);
    let mut reconnects = 0;
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let mut stream = match last {
            None => open(addr, "/v1/events?prefix=w/", &[]),
            Some(n) if reconnects % 2 == 0 => open(addr, &format!("/v1/events?prefix=w/&since={}", n + skip), &[]),
            Some(n) => open(addr, "/v1/events?prefix=w/", &[("last-event-id", &(n + skip).to_string())]),
        };
        assert_eq!(stream.status, 200, "{}", stream.head);
        let take = 3 + reconnects % 17;
        let mut got = 0;
        while got < take {
            let Some(b) = stream.next() else { break };
            let Some(id) = b.id else { continue };
            if let Some(prev) = last {
                assert!(id >= prev, "the position went back: {id} after {prev}");
            }
            last = Some(id);
            let Some(d) = b.data else { continue };
            assert_eq!(d["index"].as_u64(), Some(id), "the data's index is its id: {d}");
            let entry = event_entry(&d);
            assert!(entry.1.starts_with("w/"), "an event of another prefix: {d}");
            if seen.insert(id, entry).is_some() {
                return Err(format!("event {id} came twice"));
            }
            got += 1;
        }
        stream.cut();
        reconnects += 1;
    }
    done.store(true, Ordering::Relaxed);
    let mut expected: Vec<(String, u64)> = vec![];
    for w in workers {
        let (name, tokens) = w.join().unwrap();
        if name.starts_with("w/") {
            expected.extend(tokens.into_iter().map(|t| (name.clone(), t)));
        }
    }
    // Drain what happened after the last cut, until every worker cycle is seen.
    let mut stream = open(addr, &format!("/v1/events?prefix=w/&since={}", last.unwrap_or(0)), &[]);
    assert_eq!(stream.status, 200, "{}", stream.head);
    let want =
        |seen: &Seen| expected.iter().all(|(n, t)| seen.values().filter(|e| &e.1 == n && e.2 == *t).count() >= 2);
    // The load has stopped: what is left comes at once, and a second of silence ends it.
    stream.reader.get_ref().set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !want(&seen) && Instant::now() < deadline {
        let Some(b) = stream.next() else { break };
        if let (Some(id), Some(d)) = (b.id, b.data) {
            if seen.insert(id, event_entry(&d)).is_some() {
                return Err(format!("event {id} came twice"));
            }
        }
    }
    stream.cut();
    assert!(reconnects >= 20 && expected.len() >= 100, "too little load: {reconnects} cuts, {} cycles", expected.len());
    every_cycle_seen_once(&seen, &expected)
}

/// The load: four workers on `w/` names, one on `other/`, each acquiring and releasing
/// until `done`; each gives back its name and the tokens of its cycles.
fn start_load(addr: std::net::SocketAddr, done: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<(String, Vec<u64>)>> {
    (0..5)
        .map(|i| {
            let done = Arc::clone(done);
            std::thread::spawn(move || {
                let name = if i == 4 { "other/x".to_string() } else { format!("w/{i}") };
                let mut tokens = vec![];
                while !done.load(Ordering::Relaxed) {
                    let r = request(addr, "POST", &format!("/v1/locks/{name}/acquire"), &[], br#"{"ttl_ms":60000}"#);
                    assert_eq!(r.status, 200, "{}", r.json());
                    let g = r.json();
                    let body = format!("{{\"lease_id\":\"{}\"}}", g["lease_id"].as_str().unwrap());
                    let r = request(addr, "POST", &format!("/v1/locks/{name}/release"), &[], body.as_bytes());
                    assert_eq!(r.status, 200);
                    tokens.push(g["token"].as_u64().unwrap());
                }
                (name, tokens)
            })
        })
        .collect()
}

/// An event's (type, name, token).
fn event_entry(d: &serde_json::Value) -> (String, String, u64) {
    (d["type"].as_str().unwrap().to_string(), d["name"].as_str().unwrap().to_string(), d["token"].as_u64().unwrap())
}

/// Every cycle of the workers was seen: one granted and one released, nothing else,
/// nothing twice.
fn every_cycle_seen_once(seen: &Seen, expected: &[(String, u64)]) -> Result<(), String> {
    for (name, token) in expected {
        let kinds: Vec<&str> = seen.values().filter(|e| &e.1 == name && e.2 == *token).map(|e| e.0.as_str()).collect();
        if kinds != ["granted", "released"] {
            return Err(format!("{name} token {token}: seen {kinds:?}, not granted then released"));
        }
    }
    if seen.len() != 2 * expected.len() {
        return Err(format!("{} events seen for {} cycles: events nobody caused", seen.len(), expected.len()));
    }
    Ok(())
}

#[test]
fn a_resume_older_than_the_retention_is_refused_with_the_oldest_index() {
    let s = TestServer::with(|c| c.events_retained = 6);
    let lease = s.lease(60_000);
    for _ in 0..10 {
        let body = format!("{{\"lease_id\":\"{lease}\"}}");
        assert_eq!(s.acquire("r", &body).0, 200);
        assert_eq!(s.call("POST", "/v1/locks/r/release", &body).0, 200);
    }
    let mut stream = open(s.addr, "/v1/events?since=0", &[]);
    assert_eq!(stream.status, 410, "{}", stream.head);
    let v = stream.body();
    assert_eq!(v["error"]["code"], "compacted", "{v}");
    let oldest = v["error"]["oldest_index"].as_u64().unwrap();
    assert!(oldest > 1, "{v}");
    // One below the oldest resumes, with the six events held.
    let mut stream = open(s.addr, &format!("/v1/events?since={}", oldest - 1), &[]);
    assert_eq!(stream.status, 200, "{}", stream.head);
    let mut indexes = vec![];
    while indexes.len() < 6 {
        let b = stream.next().expect("the stream ended");
        if b.data.is_some() {
            indexes.push(b.id.unwrap());
        }
    }
    assert!(indexes.windows(2).all(|w| w[0] < w[1]) && indexes[0] >= oldest, "{indexes:?}");
    stream.cut();
    // `tail` opens with the last events held; the first block is where it starts.
    let mut stream = open(s.addr, "/v1/events?tail=2", &[]);
    let start = stream.next().unwrap();
    assert!(start.data.is_none() && start.id.is_some(), "{start:?}");
    let (a, b) = (stream.next().unwrap(), stream.next().unwrap());
    assert_eq!((a.kind.as_deref(), b.kind.as_deref()), (Some("granted"), Some("released")));
    assert_eq!(b.id, Some(indexes[5]));
    stream.cut();
    // Bad queries change nothing and say why.
    for q in ["since=abc", "since=1&tail=2", "from=3"] {
        let r = s.get(&format!("/v1/events?{q}"));
        assert_eq!((r.status, r.json()["error"]["code"].as_str()), (400, Some("invalid_query")), "{q}");
    }
}

/// An operator takes a lock from its holder by name: the next waiter is granted with a
/// higher token, the old holder's fenced write is refused, its lease lives on for its
/// other locks, and the release is an event (`reason` `forced`).
#[test]
fn an_operator_revokes_a_lock_by_name_and_the_old_holders_write_is_refused() {
    let s = TestServer::start();
    let lease = s.lease(60_000);
    let body = format!("{{\"lease_id\":\"{lease}\"}}");
    let (_, old) = s.acquire("acct", &body);
    assert_eq!(s.acquire("other", &body).0, 200);
    let old_token = old["token"].as_u64().unwrap();
    let waiter = {
        let addr = s.addr;
        std::thread::spawn(move || {
            let r = request(addr, "POST", "/v1/locks/acct/acquire", &[], br#"{"ttl_ms":60000,"wait_ms":20000}"#);
            (r.status, r.json())
        })
    };
    eventually(10, || s.call("GET", "/v1/locks/acct", "").1["waiters"] == 1);
    let mut events = open(s.addr, "/v1/events?prefix=acct", &[]);
    // Naming the wrong token takes nothing.
    let (st, v) = s.call("POST", "/v1/locks/acct/revoke", &format!("{{\"token\":{}}}", old_token + 1000));
    assert_eq!(
        (st, v["error"]["code"].as_str(), v["error"]["holder_token"].as_u64()),
        (409, Some("not_holder"), Some(old_token)),
        "{v}"
    );
    let (st, v) = s.call("POST", "/v1/locks/acct/revoke", "");
    assert_eq!((st, v["token"].as_u64(), v["revoked"].as_bool()), (200, Some(old_token), Some(true)), "{v}");
    let (st, next) = waiter.join().unwrap();
    assert_eq!(st, 200, "{next}");
    let next_token = next["token"].as_u64().unwrap();
    assert!(next_token > old_token);
    let released = loop {
        let b = events.next().expect("the stream ended");
        if b.kind.as_deref() == Some("released") {
            break b.data.unwrap();
        }
    };
    assert_eq!((released["token"].as_u64(), released["reason"].as_str()), (Some(old_token), Some("forced")));
    events.cut();
    // The new holder writes; the old one, still believing, is refused.
    let put = |token: u64| s.request("PUT", "/v1/store/acct", &[("fencing-token", &token.to_string())], b"v");
    assert_eq!(put(next_token).status, 200);
    let r = put(old_token);
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (409, Some("stale_token")));
    // The old lease lives on with its other lock.
    assert_eq!(s.call("POST", &format!("/v1/leases/{lease}/keepalive"), "").0, 200);
    assert_eq!(s.call("GET", "/v1/locks/other", "").1["held"], true);
    // Nobody holds it: refused, nothing changes.
    let (st, v) = s.call("POST", "/v1/locks/idle/revoke", "{}");
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("not_holder")), "{v}");
    let (st, v) = s.call("POST", "/v1/locks/acct/revoke", r#"{"token":0}"#);
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("invalid_token")), "{v}");
}
