//! The leader's limits travel through the log: members configured apart decide alike,
//! and a node of an earlier release is refused once limits are in the log.

use super::*;

/// Members configured with different limits decide every command alike: the leader's
/// limits travel through the log (`SetLimits`). One member allows two locks, the others
/// a million; three locks are asked for, and whoever leads, every member applies the
/// same answers. The negative control (`limits-unagreed`, each member deciding with its
/// own configuration, as before) is caught by the replicas' digests.
#[test]
fn members_configured_apart_decide_alike_with_the_limits_in_the_log() {
    limits_apart("limits", None).unwrap();
    let e = limits_apart("limits-unagreed", Some("limits-unagreed")).unwrap_err();
    assert!(e.contains("disagree"), "the negative control was not caught: {e}");
}

fn limits_apart(name: &str, breaks: Option<&'static str>) -> Result<(), String> {
    let mut c = Cluster::unstarted(name, 3, breaks);
    let config = c.members[0].dir.with_extension("toml");
    std::fs::write(&config, "locks_max = 2\n").unwrap();
    c.spawn_with(0, &["--config", config.to_str().unwrap()]);
    c.spawn(1);
    c.spawn(2);
    c.leader(20);
    if breaks.is_none() {
        until(20, || (0..3).all(|i| c.status(i).is_some_and(|s| s["limits_agreed"] == true)));
    }
    let answers: Vec<u16> =
        (0..3).map(|i| c.any("POST", &format!("/v1/locks/lim{i}/acquire"), "{\"ttl_ms\":60000}").0).collect();
    let _ = std::fs::remove_file(&config);
    c.digests_agree().map_err(|e| format!("{e} (answers {answers:?})"))
}

/// A node of a release that cannot read the log (its handshake does not say it reads
/// peer level 4: the `SetLimits` entry of agreed limits, and the `Renewed` entry a
/// cluster of one writes for keepalives answered from memory) is refused before it is
/// added: it would fail on such an entry and never catch up. The control: the same
/// handshake saying level 4 passes the check (and the fake member, which answers
/// nothing else, fails later, as a silent member does).
#[test]
fn a_node_of_an_earlier_release_is_refused_once_limits_are_in_the_log() {
    let c = Cluster::start("add-old", 1);
    until(20, || c.status(0).is_some_and(|s| s["limits_agreed"] == true));
    for (level, refused) in [(None, true), (Some("2"), true), (Some("3"), true), (Some("4"), false)] {
        let url = fake_member(2, level);
        let (st, v) = c.any("POST", "/v1/cluster/members", &format!("{{\"id\":2,\"url\":\"{url}\"}}"));
        let message = v["error"]["message"].as_str().unwrap_or_default().to_string();
        assert_eq!(st, 409, "{v}");
        assert_eq!(message.contains("earlier release"), refused, "level {level:?}: {v}");
    }
    let (st, g) = c.any("POST", "/v1/locks/after-old/acquire", "{\"ttl_ms\":2000}");
    assert_eq!(st, 200, "{g}");
}

/// A listener that answers every request with the handshake of an empty node `id`,
/// saying peer `level` (none: a release before frames): its URL.
fn fake_member(id: u64, level: Option<&'static str>) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 8192];
            let _ = s.read(&mut buf);
            let body = format!("{{\"node_id\":{id},\"instance\":12345,\"initialized\":false}}");
            let header = level.map(|l| format!("x-fenced-raft-frames: {l}\r\n")).unwrap_or_default();
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{header}content-length: {}\r\nconnection: \
                 close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}
