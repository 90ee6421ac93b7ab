//! issue 28's backup: `fenced snapshot` save, status and restore, damaged copies
//! refused, and a restored cluster serving what was saved.

use super::*;

/// `fenced snapshot ARGS...`: its exit status, stdout and stderr.
fn snapshot_cmd(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let out = Command::new(BIN).arg("snapshot").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Copies of the snapshot `file`, one bit flipped and one cut short, are refused by
/// `status` and by `restore`, which leaves no directory.
fn damaged_copies_are_refused(files: &std::path::Path, file: &std::path::Path) {
    use std::ffi::OsStr;
    let bytes = std::fs::read(file).unwrap();
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x20;
    let bad = files.join("flipped.snap");
    std::fs::write(&bad, &flipped).unwrap();
    let short = files.join("short.snap");
    std::fs::write(&short, &bytes[..bytes.len() * 2 / 3]).unwrap();
    for damaged in [&bad, &short] {
        let (ok, _, err) = snapshot_cmd(&[OsStr::new("status"), damaged.as_os_str()]);
        assert!(!ok && err.contains("checksum"), "a damaged file was not refused: {err}");
        let dir = files.join("never");
        let (ok, _, err) =
            snapshot_cmd(&[OsStr::new("restore"), damaged.as_os_str(), OsStr::new("--data-dir"), dir.as_os_str()]);
        assert!(!ok && err.contains("checksum"), "{err}");
        assert!(!dir.exists() && !files.join("never.restoring").exists(), "a refused restore left a directory");
    }
}

/// A `FILE.part` or a `DIR.restoring` that was there before (a file of the user's, say)
/// makes `save` and `restore` refuse, and stays as it was: a command removes only what
/// it created. `save` refuses before it asks the service (the endpoint here is closed).
fn leftovers_of_others_are_refused_and_kept(files: &std::path::Path, file: &std::path::Path) {
    use std::ffi::OsStr;
    let part = files.join("again.snap.part");
    std::fs::write(&part, "mine").unwrap();
    let closed = format!("http://{}", free_addr());
    let (ok, _, err) = snapshot_cmd(&[
        OsStr::new("save"),
        files.join("again.snap").as_os_str(),
        OsStr::new("--endpoint"),
        OsStr::new(&closed),
    ]);
    assert!(!ok && err.contains("exists"), "{err}");
    assert_eq!(std::fs::read_to_string(&part).unwrap(), "mine", "save overwrote a .part it did not create");
    assert!(!files.join("again.snap").exists());
    // With the endpoint closed and no .part before, the save fails and leaves nothing.
    let (ok, _, err) = snapshot_cmd(&[
        OsStr::new("save"),
        files.join("other.snap").as_os_str(),
        OsStr::new("--endpoint"),
        OsStr::new(&closed),
    ]);
    assert!(!ok, "{err}");
    assert!(!files.join("other.snap.part").exists(), "a failed save left its .part");
    let staging = files.join("kept.restoring");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::write(staging.join("notes.txt"), "mine").unwrap();
    let dir = files.join("kept");
    let (ok, _, err) =
        snapshot_cmd(&[OsStr::new("restore"), file.as_os_str(), OsStr::new("--data-dir"), dir.as_os_str()]);
    assert!(!ok && err.contains("exists"), "{err}");
    assert_eq!(std::fs::read_to_string(staging.join("notes.txt")).unwrap(), "mine", "restore took over a directory");
    assert!(!dir.exists(), "a refused restore made its directory");
}

/// The restored cluster `b` serves the saved lock (same holder, same token, a full TTL),
/// its lease, the saved store values, and each key's mark.
fn serves_what_was_saved(b: &Cluster, held_token: u64, lease: &str, acked_stored: &BTreeMap<String, u64>) {
    let (st, lock) = b.any("GET", "/v1/locks/held%2Fx", "");
    assert_eq!((st, lock["held"].as_bool(), lock["token"].as_u64()), (200, Some(true), Some(held_token)), "{lock}");
    let left = lock["expires_in_ms"].as_u64().unwrap();
    assert!(left > 45_000, "the restored holder did not get a full TTL: {left} ms left");
    let (st, v) = b.any("POST", &format!("/v1/leases/{lease}/keepalive"), "");
    assert_eq!(st, 200, "the saved lease does not live on: {v}");
    let (st, v) = b.any("GET", "/v1/store/kept", "");
    assert_eq!((st, v.as_str()), (200, Some("kept-value")), "{v}");
    for (key, token) in acked_stored {
        let (st, v) = b.any("GET", &format!("/v1/store/{key}"), "");
        let stored: u64 = v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or(0);
        assert!(st == 200 && stored >= *token, "{key}: write {token} acknowledged before the save, restored {v}");
        // The key's mark is the snapshot's: a token below it is refused.
        let stale = [("fencing-token", (stored - 1).to_string())];
        let (st, v) = b.any_with("PUT", &format!("/v1/store/{key}"), "zombie", &stale);
        assert_eq!((st, v["error"]["code"].as_str()), (409, Some("stale_token")), "{key}: {v}");
    }
}

/// issue 28's backup: a snapshot saved from a three-member cluster under load, checked,
/// refused when damaged, and restored into a new three-member cluster that serves the
/// saved lock (same holder, same token, a full TTL), the saved store values and marks,
/// and tokens above every saved one.
#[test]
fn a_snapshot_saved_under_load_restores_into_a_new_three_member_cluster() {
    use std::ffi::OsStr;
    let a = Cluster::start("backup-a", 3);
    let (st, held) = a.any("POST", "/v1/locks/held%2Fx/acquire", "{\"ttl_ms\":60000}");
    assert_eq!(st, 200, "{held}");
    let held_token = held["token"].as_u64().unwrap();
    let lease = held["lease_id"].as_str().unwrap().to_string();
    let fence = [("fencing-token", held_token.to_string())];
    let (st, v) = a.any_with("PUT", "/v1/store/kept", "kept-value", &fence);
    assert_eq!(st, 200, "{v}");

    let load = Load::start(&a, 4);
    progress(&load.grants, 30).unwrap();
    let (acked_max, acked_stored) = {
        let g = load.grants.lock().unwrap();
        (g.tokens.iter().copied().max().unwrap(), g.stored.clone())
    };
    let files = scratch("backup-files");
    std::fs::create_dir_all(&files).unwrap();
    let file = files.join("cluster.snap");
    let endpoints = a.endpoints();
    let (ok, out, err) = snapshot_cmd(&[
        OsStr::new("save"),
        file.as_os_str(),
        OsStr::new("--endpoint"),
        OsStr::new(&endpoints),
        OsStr::new("--json"),
    ]);
    assert!(ok, "save failed: {err}");
    progress(&load.grants, 10).unwrap();
    load.finish();
    drop(a);
    let header: Value = serde_json::from_str(out.trim()).unwrap();
    let saved_top = header["highest_token"].as_u64().unwrap();
    assert!(saved_top >= acked_max, "the snapshot misses acknowledged grants: {saved_top} < {acked_max}");
    assert!(header["locks"].as_u64().unwrap() >= 1, "{header}");
    assert!(!files.join("cluster.snap.part").exists(), "the partial file stayed");
    let (ok, status, err) = snapshot_cmd(&[OsStr::new("status"), file.as_os_str(), OsStr::new("--json")]);
    assert!(ok, "{err}");
    let again: Value = serde_json::from_str(status.trim()).unwrap();
    assert_eq!(
        (again["sha256"].as_str(), again["highest_token"].as_u64()),
        (header["sha256"].as_str(), Some(saved_top))
    );

    // Damaged, cut short: refused by status and by restore, which leaves no directory.
    damaged_copies_are_refused(&files, &file);
    leftovers_of_others_are_refused_and_kept(&files, &file);

    // Tokens continue above what the old service may have issued after the save
    // (`--tokens-above`). One member is given a higher floor than the others: the floor
    // travels through the log, so the members still hold one state (before, each
    // raised its own base state, and they diverged).
    let floor = saved_top + 1_000;
    let mut b = Cluster::unstarted("backup-b", 3, None);
    for (i, m) in b.members.iter().enumerate() {
        let above = (floor + if i == 2 { 500 } else { 0 }).to_string();
        let (ok, _, err) = snapshot_cmd(&[
            OsStr::new("restore"),
            file.as_os_str(),
            OsStr::new("--data-dir"),
            m.dir.as_os_str(),
            OsStr::new("--tokens-above"),
            OsStr::new(&above),
        ]);
        assert!(ok, "restore into {}: {err}", m.dir.display());
    }
    // A second restore into a directory that holds one is refused.
    let (ok, _, err) = snapshot_cmd(&[
        OsStr::new("restore"),
        file.as_os_str(),
        OsStr::new("--data-dir"),
        b.members[0].dir.as_os_str(),
    ]);
    assert!(!ok && err.contains("not empty"), "{err}");
    b.start_all();

    serves_what_was_saved(&b, held_token, &lease, &acked_stored);
    let (st, g) = b.any("POST", "/v1/locks/after-restore/acquire", "{\"ttl_ms\":5000}");
    assert_eq!(st, 200, "{g}");
    assert!(g["token"].as_u64().unwrap() > floor, "a restored cluster granted {g} at or below --tokens-above {floor}");
    b.replicas_agree();
    let _ = std::fs::remove_dir_all(&files);
}
