//! A server alone cannot be talked out of its quorum, and `--force-new-cluster` brings
//! back a member whose quorum is gone, keeping everything.

use super::*;

/// The two requests that used to destroy a single server for good (its own URL added
/// as a second voter, then the real member removed), and the raft routes of a server
/// that is a cluster of one: all refused, and the server serves on, also after kill -9.
#[test]
fn a_server_alone_takes_no_peer_message_and_cannot_be_talked_out_of_its_quorum() {
    let dir = scratch("alone");
    let addr = free_addr();
    let start = || {
        Command::new(BIN)
            .args(["server", "--listen", &addr.to_string(), "--data-dir"])
            .arg(&dir)
            .env("FENCED_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let child = Killed(start());
    until(20, || matches!(call(addr, "GET", "/livez", "", &[]), Ok((200, _))));
    let (st, g) = call(addr, "POST", "/v1/locks/a/acquire", r#"{"ttl_ms":60000}"#, &[]).unwrap();
    assert_eq!(st, 200, "{g}");
    for route in PEER_ROUTES {
        let (st, v) = call(addr, "POST", &format!("/raft/{route}"), &forged(route, 100), &[]).unwrap();
        assert_eq!((st, v["error"]["code"].as_str()), (403, Some("not_a_cluster")), "{route}: {v}");
    }
    // Its own URL, and another spelling of it that only the handshake can tell apart.
    for (url, why) in [
        (format!("http://{addr}"), "one process holds one vote"),
        (format!("http://localhost:{}", addr.port()), "this node itself"),
    ] {
        let own = format!(r#"{{"id":17861812,"url":"{url}"}}"#);
        let (st, v) = call(addr, "POST", "/v1/cluster/members", &own, &[]).unwrap();
        assert_eq!((st, v["error"]["code"].as_str()), (409, Some("membership_change_failed")), "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(why), "{url}: {v}");
    }
    let (st, v) = call(addr, "DELETE", "/v1/cluster/members/1", "", &[]).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("membership_change_failed")), "{v}");
    let (_, s) = call(addr, "GET", "/v1/cluster", "", &[]).unwrap();
    assert_eq!(s["members"].as_array().map(Vec::len), Some(1), "{s}");
    drop(child);
    let _child = Killed(start());
    until(20, || matches!(call(addr, "GET", "/v1/locks/a", "", &[]), Ok((200, _))));
    let (_, v) = call(addr, "GET", "/v1/locks/a", "", &[]).unwrap();
    assert_eq!((v["held"].as_bool(), v["token"].as_u64()), (Some(true), g["token"].as_u64()), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A member whose quorum is gone for good (the other two data directories lost):
/// restarted with `--force-new-cluster` it becomes the only voter, keeping every
/// acknowledged lock and write, and tokens go on above them; restarted again without
/// the flag it stays a cluster of one.
#[test]
fn force_new_cluster_brings_back_a_member_whose_quorum_is_gone_keeping_everything() {
    let c = Insecure::new("force");
    let children = c.start_all();
    // The survivor is the leader. It answered the write once a majority held it, which
    // may have been the two followers before its own fsync: it holds everything
    // acknowledged once its own row of /v1/cluster (the log on its disk) reaches what it
    // applied. That is what an operator reads to pick the survivor.
    let k = c.leader();
    let (id, one) = (c.members[k].0, c.members[k].1);
    // Right after its election a leader may still be taking office (503): ask again.
    let mut g = Value::Null;
    until(10, || {
        let (st, v) = call(one, "POST", "/v1/locks/kept/acquire", r#"{"ttl_ms":60000}"#, &[]).unwrap();
        g = v;
        st == 200
    });
    let token = g["token"].as_u64().unwrap();
    let t = token.to_string();
    let (st, w) = call(one, "PUT", "/v1/store/acct", "balance=1000", &[("fencing-token", t)]).unwrap();
    assert_eq!(st, 200, "{w}");
    until(10, || {
        c.status(k).is_some_and(|s| {
            let own = s["members"].as_array().unwrap().iter().find(|m| m["id"].as_u64() == Some(id)).cloned();
            let flushed = own.and_then(|m| m["last_log_index"].as_u64());
            flushed.is_some() && flushed >= s["last_applied_index"].as_u64()
        })
    });
    // The survivor alone is left; the others' data is gone for good.
    drop(children);
    for (_, _, dir) in c.members.iter().filter(|m| m.0 != id) {
        let _ = std::fs::remove_dir_all(dir);
    }
    let child = c.start(k, &["--force-new-cluster"]);
    until(20, || c.status(k).is_some_and(|s| s["leader_id"].as_u64() == Some(id)));
    let s = c.status(k).unwrap();
    let ids: Vec<u64> = s["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [id], "{s}");
    let (_, v) = call(one, "GET", "/v1/locks/kept", "", &[]).unwrap();
    assert_eq!((v["held"].as_bool(), v["token"].as_u64()), (Some(true), Some(token)), "{v}");
    let (st, v) = call(one, "GET", "/v1/store/acct", "", &[]).unwrap();
    assert_eq!((st, v.as_str()), (200, Some("balance=1000")), "{v}");
    let (st, g) = call(one, "POST", "/v1/locks/after/acquire", r#"{"ttl_ms":5000}"#, &[]).unwrap();
    assert_eq!(st, 200, "{g}");
    assert!(g["token"].as_u64().unwrap() > token, "{g}");
    // Without the flag it stays a cluster of one.
    drop(child);
    let _child = c.start(k, &[]);
    until(20, || c.status(k).is_some_and(|s| s["leader_id"].as_u64() == Some(id)));
    let (_, v) = call(one, "GET", "/v1/locks/kept", "", &[]).unwrap();
    assert_eq!((v["held"].as_bool(), v["token"].as_u64()), (Some(true), Some(token)), "{v}");
}

/// `--force-new-cluster` on a path that holds no data directory (a new path, or an
/// empty directory) is refused before anything is written: no directory, no `FORMAT`,
/// no log is left behind by the refused start.
#[test]
fn force_new_cluster_without_a_data_directory_is_refused_and_creates_nothing() {
    let base = scratch("force-nothing");
    let empty = base.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    for dir in [base.join("new"), empty.clone()] {
        let out = Command::new(BIN)
            .args(["server", "--force-new-cluster", "--listen", &free_addr().to_string(), "--data-dir"])
            .arg(&dir)
            .env("FENCED_LOG", "error")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: {stderr}", dir.display());
        assert!(stderr.contains("no log to keep"), "{}: {stderr}", dir.display());
        let left: Vec<_> = std::fs::read_dir(&base).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["empty"], "{}: the refused start left {left:?}", dir.display());
        assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "{}", dir.display());
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// Settings refused at start (an audit log in a directory that does not exist, a grant
/// signing key that is not there) are read before the data directory is touched: the
/// refused start creates no directory.
#[test]
fn a_start_refused_for_its_settings_leaves_the_data_directory_alone() {
    let base = scratch("refused-settings");
    std::fs::create_dir_all(&base).unwrap();
    let missing = base.join("missing").join("x");
    let refused = |flags: &[&std::ffi::OsStr], env: Option<(&str, &std::path::Path)>, says: &str| {
        let mut cmd = Command::new(BIN);
        cmd.args(["server", "--listen", &free_addr().to_string(), "--data-dir"]).arg(base.join("new")).args(flags);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.env("FENCED_LOG", "error").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says), "{says}: {stderr}");
        let left: Vec<_> = std::fs::read_dir(&base).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{says}: the refused start left {left:?}");
    };
    refused(&["--audit-log".as_ref(), missing.as_os_str()], None, "audit_log");
    refused(&[], Some(("FENCED_GRANT_SIGNING_KEY", &missing)), "grant_signing_key");
    let _ = std::fs::remove_dir_all(&base);
}

/// A single-node directory of an earlier format started with `--peers` is refused, and
/// the refused start leaves it exactly as it was: the old file read, not opened for
/// writing, and no `FORMAT` written (a start marks the format only once nothing refuses
/// it), so the start without `--peers` that the message asks for still migrates it.
#[test]
fn a_single_node_directory_started_with_peers_is_refused_unchanged() {
    let dir = scratch("old-with-peers");
    std::fs::create_dir_all(&dir).unwrap();
    let fixture =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../fenced-server/tests/fixtures/single-node-format/fenced.redb");
    std::fs::copy(fixture, dir.join("fenced.redb")).unwrap();
    let before = std::fs::read(dir.join("fenced.redb")).unwrap();
    let (a, b, c) = (free_addr(), free_addr(), free_addr());
    let peers = format!("1=http://{a},2=http://{b},3=http://{c}");
    let out = Command::new(BIN)
        .args(["server", "--listen", &a.to_string(), "--node-id", "1", "--peers", &peers, "--insecure-peers"])
        .arg("--data-dir")
        .arg(&dir)
        .env("FENCED_LOG", "error")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("without --peers"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["fenced.redb"], "the refused start left {left:?}");
    assert!(std::fs::read(dir.join("fenced.redb")).unwrap() == before, "the refused start changed fenced.redb");
    let _ = std::fs::remove_dir_all(&dir);
}
