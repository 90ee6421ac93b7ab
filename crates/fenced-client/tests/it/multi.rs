//! issue 29: `Client::lock_all` against a real server: many callers asking for random
//! sets in random orders never deadlock and never overlap, each lock's tokens only go
//! up, and a guard's tokens and release cover the whole set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fenced_client::Error;
use fenced_core::xorshift::XorShift;
use tokio::time::Instant;

use crate::support::Server;

const NAMES: [&str; 5] = ["set/a", "set/b", "set/c", "set/d", "set/e"];

/// Two or three distinct names, in a random order.
fn random_set(rng: &mut XorShift) -> Vec<&'static str> {
    let mut names = NAMES.to_vec();
    for i in (1..names.len()).rev() {
        names.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    names.truncate(2 + (rng.next() % 2) as usize);
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_asking_for_random_sets_in_random_orders_never_deadlock_or_overlap() {
    let server = Server::start().await;
    let held: Arc<Mutex<HashMap<&'static str, usize>>> = Arc::default();
    let last_token: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let until = Instant::now() + Duration::from_secs(6);
    let mut callers = vec![];
    for caller in 0..8usize {
        let (client, held, last_token) = (server.client(), held.clone(), last_token.clone());
        callers.push(tokio::spawn(async move {
            let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ ((caller as u64 + 1) * 0x2545_F491_4F6C_DD1D));
            let (mut grants, mut timeouts) = (0u32, 0u32);
            while Instant::now() < until {
                let set = random_set(&mut rng);
                let request = client.lock_all(set.clone()).ttl(Duration::from_secs(10)).wait(Duration::from_secs(8));
                let guard = match request.acquire().await {
                    Ok(g) => g,
                    Err(Error::LockHeld { .. }) => {
                        timeouts += 1;
                        continue;
                    }
                    Err(e) => panic!("caller {caller}: {e}"),
                };
                let tokens = guard.tokens();
                let mut sorted = set.clone();
                sorted.sort_unstable();
                assert_eq!(tokens.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), sorted);
                {
                    let mut h = held.lock().unwrap();
                    for n in &set {
                        if let Some(other) = h.insert(n, caller) {
                            panic!("{n} held by callers {other} and {caller} at once");
                        }
                    }
                    let mut last = last_token.lock().unwrap();
                    for (n, t) in &tokens {
                        let before = last.insert(n.to_string(), t.get()).unwrap_or(0);
                        assert!(t.get() > before, "{n}: token {t} after {before}");
                    }
                }
                tokio::time::sleep(Duration::from_millis(1 + rng.next() % 8)).await;
                {
                    let mut h = held.lock().unwrap();
                    for n in &set {
                        h.remove(n);
                    }
                }
                guard.release().await.expect("released");
                grants += 1;
            }
            (grants, timeouts)
        }));
    }
    let mut total = 0;
    for (i, c) in callers.into_iter().enumerate() {
        let (grants, timeouts) = c.await.expect("a caller panicked");
        assert_eq!(timeouts, 0, "caller {i} waited 8 s for a set of locks each held for under 10 ms: a deadlock");
        assert!(grants >= 5, "caller {i} got only {grants} sets in 6 s");
        total += grants;
    }
    // Every lock is free at the end: no set was left half taken.
    let client = server.client();
    for n in NAMES {
        let view = client.lock_info(n).await.unwrap();
        assert_eq!(view["held"], false, "{n}: {view}");
    }
    eprintln!("{total} sets granted to 8 callers in 6 s");
}

#[tokio::test]
async fn a_set_guard_releases_every_lock_and_a_set_with_one_held_waits_or_fails_whole() {
    let server = Server::start().await;
    let client = server.client();
    let guard = client.lock_all(["g/b", "g/a"]).ttl(Duration::from_secs(5)).acquire().await.expect("free set");
    assert_eq!(guard.name().as_str(), "g/a", "the first in sorted order");
    let tokens = guard.tokens();
    assert_eq!(tokens.len(), 2);
    assert!(tokens[0].1 < tokens[1].1);
    let refused = client.lock_all(["g/b", "g/c"]).try_acquire().await;
    assert!(matches!(refused, Err(Error::LockHeld { .. })), "{refused:?}");
    assert_eq!(client.lock_info("g/c").await.unwrap()["held"], false, "nothing of the refused set taken");
    guard.release().await.expect("released");
    for n in ["g/a", "g/b"] {
        assert_eq!(client.lock_info(n).await.unwrap()["held"], false, "{n} released with the set");
    }
    // The same over the wire protocol (ACQUIRE_ALL): a set, then a refused overlap.
    let wire = Server::start_wire(&[]).await;
    let wc = wire.wire_client();
    let set = wc.lock_all(["x", "w"]).ttl(Duration::from_secs(5)).try_acquire().await.expect("over the wire");
    let names: Vec<String> = set.tokens().into_iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(names, ["w", "x"]);
    assert!(matches!(wc.lock_all(["x", "y"]).try_acquire().await, Err(Error::LockHeld { .. })));
    set.release().await.expect("released over the wire");
    let after = wc.lock_all(["x", "y"]).try_acquire().await.expect("x was released with its set");
    after.release().await.expect("released");
}
