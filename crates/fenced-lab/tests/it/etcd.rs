//! The workspace's etcd gateway client (`fenced_client::etcd`) against a real etcd (Debian's `etcd-server`): each call the
//! torture and bench recipes make, with the answers etcd gives when things go wrong.

use std::time::Duration;

use fenced_client::etcd::{spawn_keepalive, Etcd};
use fenced_lab::peers::Service;

/// Short enough for a test, long enough for a loaded machine.
const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// The shortest lease etcd keeps with its default election timeout.
const TTL_S: i64 = 2;

/// One etcd at a time in this file: each picks two free ports, and two starting at
/// once can pick the same one.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A test's etcd, stopped when dropped, and its turn.
struct Running {
    _service: Service,
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// A fresh single-node etcd and a client of it. Without etcd the test skips, except
/// under CI, where it must be there.
fn etcd() -> Option<(Running, Etcd)> {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    match Service::etcd() {
        Ok(service) => {
            let client = Etcd::new(&service.url(), Duration::from_secs(1), OP_TIMEOUT).expect("an http:// endpoint");
            Some((Running { _service: service, _turn: turn }, client))
        }
        Err(e) if std::env::var_os("CI").is_none() && e.to_string().contains("not found on PATH") => {
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => panic!("cannot start etcd: {e:#}"),
    }
}

#[tokio::test]
async fn a_waiter_queues_and_an_abandoned_wait_leaves_the_queue() {
    let Some((_service, etcd)) = etcd() else { return };
    let a = etcd.lease_grant(TTL_S * 5).await.unwrap();
    let first = etcd.lock(b"job", a, OP_TIMEOUT).await.unwrap().expect("a free lock is granted");
    assert!(first.key.starts_with(b"job/"), "the lock key is under the name: {:?}", first.key);
    assert!(first.revision > 0);

    // Held: a second lease waits in line until its wait runs out.
    let b = etcd.lease_grant(TTL_S * 5).await.unwrap();
    assert_eq!(etcd.lock(b"job", b, Duration::from_millis(300)).await.unwrap(), None);

    // The abandoned wait took its key back out: once the holder unlocks, a third lease
    // gets the lock at once, though the second lease still lives.
    etcd.unlock(&first.key).await.unwrap();
    let c = etcd.lease_grant(TTL_S * 5).await.unwrap();
    let next = etcd.lock(b"job", c, Duration::from_secs(2)).await.unwrap().expect("nobody left in line");
    assert_ne!(next.key, first.key);
    assert!(next.revision > first.revision, "revisions only grow: {} then {}", first.revision, next.revision);
    etcd.unlock(&next.key).await.unwrap();
    for lease in [a, b, c] {
        etcd.lease_revoke(lease).await.unwrap();
    }
}

#[tokio::test]
async fn a_kept_alive_lease_holds_its_lock_past_the_ttl_and_an_unkept_one_loses_it() {
    let Some((_service, etcd)) = etcd() else { return };
    let kept = etcd.lease_grant(TTL_S).await.unwrap();
    let unkept = etcd.lease_grant(TTL_S).await.unwrap();
    let keeper = spawn_keepalive(etcd.clone(), kept, Duration::from_secs(TTL_S as u64));
    let held = etcd.lock(b"kept", kept, OP_TIMEOUT).await.unwrap().expect("granted");
    etcd.lock(b"unkept", unkept, OP_TIMEOUT).await.unwrap().expect("granted");

    tokio::time::sleep(Duration::from_secs(TTL_S as u64 * 2)).await;
    let waiter = etcd.lease_grant(TTL_S * 5).await.unwrap();
    // The unkept lease expired and its lock went with it...
    assert_eq!(etcd.lease_keep_alive(unkept).await.unwrap(), 0, "etcd still knows the unkept lease");
    let taken = etcd.lock(b"unkept", waiter, Duration::from_secs(2)).await.unwrap().expect("the lock was freed");
    etcd.unlock(&taken.key).await.unwrap();
    // ...while the kept one still holds its lock.
    assert!(etcd.lease_keep_alive(kept).await.unwrap() > 0, "the keeper let the lease expire");
    assert_eq!(etcd.lock(b"kept", waiter, Duration::from_millis(300)).await.unwrap(), None);

    // Revoked, the lease is gone for its keeper too, and its lock is free.
    drop(keeper);
    etcd.lease_revoke(kept).await.unwrap();
    assert_eq!(etcd.lease_keep_alive(kept).await.unwrap(), 0);
    let after = etcd.lock(b"kept", waiter, Duration::from_secs(2)).await.unwrap().expect("the revoke freed the lock");
    assert_ne!(after.key, held.key);
}

#[tokio::test]
async fn put_and_get_carry_any_bytes() {
    let Some((_service, etcd)) = etcd() else { return };
    assert_eq!(etcd.get(b"counter/x").await.unwrap(), None, "a missing key");
    let bytes = [0u8, 255, b'\n', b'"', 0x80, b'=', b'+', b'/'];
    etcd.put(b"counter/x", &bytes).await.unwrap();
    assert_eq!(etcd.get(b"counter/x").await.unwrap().as_deref(), Some(&bytes[..]));
    // An empty value is left out of the gateway's JSON; the key still exists.
    etcd.put(b"counter/x", b"").await.unwrap();
    assert_eq!(etcd.get(b"counter/x").await.unwrap(), Some(Vec::new()));
}

#[tokio::test]
async fn etcd_refusals_and_an_absent_server_are_errors() {
    let Some((_service, etcd)) = etcd() else { return };
    let lease = etcd.lease_grant(TTL_S).await.unwrap();
    etcd.lease_revoke(lease).await.unwrap();
    let again = etcd.lease_revoke(lease).await.unwrap_err().to_string();
    assert!(again.contains("lease not found"), "{again}");
    let lock = etcd.lock(b"job", lease, OP_TIMEOUT).await.unwrap_err().to_string();
    assert!(lock.contains("lease not found"), "{lock}");

    let port = fenced_lab::peers::free_port().unwrap();
    let nobody = Etcd::new(&format!("http://127.0.0.1:{port}"), Duration::from_secs(1), OP_TIMEOUT).unwrap();
    assert!(nobody.put(b"k", b"v").await.is_err(), "a put to nowhere succeeded");
    assert!(Etcd::new("127.0.0.1:2379", Duration::from_secs(1), OP_TIMEOUT).is_err(), "an endpoint without http://");
}
