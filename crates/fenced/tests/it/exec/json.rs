//! `fenced lock`, `locks`, `put` and `get` speak JSON.

use super::*;

#[test]
fn lock_locks_put_and_get_speak_json() {
    let server = Server::start("cli");
    let cli = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(args).arg("--json").env("FENCED_ENDPOINT", &server.endpoint);
        c
    };
    let json = |out: &Output| -> serde_json::Value {
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    // `lock` prints the grant and holds until interrupted.
    // `fenced lock` prints the grant, holds until interrupted, then releases.
    let take = || {
        let mut lock = cli(&["lock", "orders/42", "--ttl", "5s"]).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(lock.stdout.take().unwrap()), &mut line).unwrap();
        let grant: serde_json::Value = serde_json::from_str(&line).unwrap();
        (lock, grant)
    };
    let (mut lock, grant) = take();
    assert_eq!(grant["name"], "orders/42");
    let token = grant["token"].as_u64().unwrap();
    assert!(LeaseId::from_hex(grant["lease_id"].as_str().unwrap()).is_some());
    let locks = json(&output(cli(&["locks", "--prefix", "orders/"])));
    assert_eq!(locks["locks"][0]["name"], "orders/42");
    assert_eq!(locks["locks"][0]["token"].as_u64(), Some(token));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(lock.id() as i32, libc::SIGINT) };
    assert_eq!(wait_exit(&mut lock, Duration::from_secs(20)).code(), Some(0));
    let locks = json(&output(cli(&["locks", "--prefix", "orders/"])));
    assert!(locks["locks"].as_array().unwrap().iter().all(|l| l["held"] == false), "released: {locks}");
    // A later holder (the store takes only tokens the service issued).
    let (mut later, grant) = take();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(later.id() as i32, libc::SIGINT) };
    assert_eq!(wait_exit(&mut later, Duration::from_secs(20)).code(), Some(0));
    let (stale_token, token) = (token, grant["token"].as_u64().unwrap());

    // The store: accepted, then refused with both tokens, and reads.
    let put = output(cli(&["put", "orders/42/state", "paid", "--token", &token.to_string()]));
    assert_eq!(put.status.code(), Some(0));
    assert_eq!(json(&put)["accepted"], true);
    let stale = output(cli(&["put", "orders/42/state", "refunded", "--token", &stale_token.to_string()]));
    assert_eq!(stale.status.code(), Some(1));
    let v = json(&stale);
    assert_eq!((v["accepted"].as_bool(), v["highest_seen"].as_u64()), (Some(false), Some(token)));
    let got = output(cli(&["get", "orders/42/state", "--token", &token.to_string()]));
    assert_eq!(got.status.code(), Some(0));
    assert_eq!(json(&got)["value"], "paid");
    let missing = output(cli(&["get", "nothing"]));
    assert_eq!((missing.status.code(), json(&missing)["found"].as_bool()), (Some(1), Some(false)));
    let zero = output(cli(&["put", "k", "v", "--token", "0"]));
    assert_eq!(zero.status.code(), Some(2), "token 0 is a bad argument");
}
