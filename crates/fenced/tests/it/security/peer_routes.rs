//! The peer routes refuse a client's credential, no credential and another CA's
//! certificate; a member with another CA's certificate can neither join nor vote.

use super::*;

#[test]
fn no_client_credential_and_no_foreign_certificate_opens_a_peer_route() {
    let dir = scratch("tls-attack-pki");
    let pki = Pki::new(&dir, "cluster");
    let rogue_ca = Pki::new(&dir, "rogue");
    let rogue = rogue_ca.issue("rogue-member");
    let c = TlsCluster::start("tls-attack", &pki, 3);
    let terms: Vec<u64> = (0..3).map(|i| c.term(i)).collect();
    let ca = pki.ca();
    let ca = ca.to_str().unwrap();
    let auth = format!("authorization: Bearer {TOKEN}");
    for (i, term) in terms.iter().enumerate() {
        for route in PEER_ROUTES {
            let body = forged(route, term + 100);
            // On the client listener, with the client token or without: refused.
            for extra in [vec!["--cacert", ca, "-H", &auth], vec!["--cacert", ca]] {
                let r = curl(&c.url(i, &format!("/raft/{route}")), "POST", &body, &extra);
                let (st, v) = r.expect("the client listener answers");
                assert_eq!((st, v["error"]["code"].as_str()), (403, Some("forbidden")), "{route} on member {i}: {v}");
            }
            // On the peer listener: no TLS handshake without a certificate of the cluster
            // CA, with the client token, with none, or with another CA's certificate.
            let peer_url = format!("https://{}/raft/{route}", c.members[i].peer);
            let (rogue_cert, rogue_key) = (rogue.0.to_str().unwrap(), rogue.1.to_str().unwrap());
            for extra in
                [vec!["--cacert", ca, "-H", &auth], vec!["--cacert", ca, "--cert", rogue_cert, "--key", rogue_key]]
            {
                let r = curl(&peer_url, "POST", &body, &extra);
                assert!(r.is_none(), "{route} on member {i}'s peer listener with {extra:?}: {r:?}");
            }
        }
    }
    // The control: a member's own certificate does reach the peer listener.
    let (m_cert, m_key) = (c.members[0].cert.0.to_str().unwrap(), c.members[0].cert.1.to_str().unwrap());
    let hello = curl(
        &format!("https://{}/raft/hello", c.members[1].peer),
        "GET",
        "",
        &["--cacert", ca, "--cert", m_cert, "--key", m_key],
    );
    assert_eq!(hello.as_ref().map(|h| (h.0, h.1["node_id"].as_u64())), Some((200, Some(2))), "{hello:?}");
    // No forgery moved a term.
    let after: Vec<u64> = (0..3).map(|i| c.term(i)).collect();
    assert_eq!(after, terms, "a forged vote changed a member's term");
    // A process with another CA's certificate cannot join: the handshake fails.
    let l = c.leader();
    let rogue_url = format!("https://{}", free_addr());
    let (st, v) = c.call(l, "POST", "/v1/cluster/members", &format!(r#"{{"id":4,"url":"{rogue_url}"}}"#)).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("membership_change_failed")), "{v}");
    let ids: Vec<u64> =
        c.status(l).unwrap()["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1, 2, 3]);
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A member started with a certificate of another CA, listed in the cluster's peers:
/// the leader cannot complete the handshake with it, so it is never added (its forged
/// votes are refused at the TLS handshake in the test above).
#[test]
fn a_member_with_another_cas_certificate_cannot_join_or_vote() {
    let dir = scratch("tls-rogue-pki");
    let pki = Pki::new(&dir, "cluster");
    let rogue_ca = Pki::new(&dir, "rogue");
    let mut c = TlsCluster::start("tls-rogue", &pki, 3);
    let terms: Vec<u64> = (0..3).map(|i| c.term(i)).collect();
    let rogue = Member {
        id: 4,
        client: free_addr(),
        peer: free_addr(),
        cert: rogue_ca.issue("rogue-4"),
        ca: rogue_ca.ca(),
        dir: scratch("tls-rogue-4"),
        child: None,
    };
    let url = format!("https://{}", rogue.peer);
    c.peers = format!("{},4={url}", c.peers);
    c.members.push(rogue);
    c.spawn(3);
    let l = c.leader();
    let (st, v) = c.call(l, "POST", "/v1/cluster/members", &format!(r#"{{"id":4,"url":"{url}"}}"#)).unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (409, Some("membership_change_failed")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("handshake"), "{v}");
    let ids: Vec<u64> =
        c.status(l).unwrap()["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1, 2, 3]);
    let after: Vec<u64> = (0..3).map(|i| c.term(i)).collect();
    assert_eq!(after, terms, "the attempt moved a member's term");
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}
