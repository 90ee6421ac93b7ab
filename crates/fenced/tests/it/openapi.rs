//! An API fuzzer driven by the server's own `/openapi.json`, as outside testers run
//! one: schemathesis (PyPI, pinned in `.ci/run`, installed into `.venv-ci`) against a
//! release `fenced server` child on a loopback port, with the checks that the server
//! and its document agree (no 5xx; every status, content type and body the document's;
//! schema-violating input refused). A short, seeded run: the long one and its figures
//! are in docs/server.md.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::{call, free_addr, scratch, BIN};
use crate::support::exit_within;

/// The fuzzer: in the virtual environment `.ci/run` makes, or on the PATH.
fn schemathesis() -> Option<PathBuf> {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-ci/bin/schemathesis");
    if venv.exists() {
        return Some(venv);
    }
    let ok = Command::new("schemathesis").arg("--version").output().is_ok_and(|o| o.status.success());
    ok.then(|| "schemathesis".into())
}

/// The checks run, here and in the long run docs/server.md records.
pub(crate) const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
    response_schema_conformance,negative_data_rejection";

#[test]
fn an_api_fuzzer_driven_by_the_document_finds_no_disagreement() {
    let Some(st) = schemathesis() else {
        let why = "schemathesis is not installed (pip install schemathesis==4.32.5): the API was not fuzzed";
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("skipped: {why}");
        return;
    };
    let dir = scratch("schemathesis");
    std::fs::create_dir_all(&dir).unwrap();
    let addr = free_addr();
    let mut server = Command::new(BIN)
        .args(["server", "--listen", &addr.to_string(), "--data-dir"])
        .arg(dir.join("data"))
        .env("FENCED_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !matches!(call(addr, "GET", "/livez", "", &[]), Ok((200, _))) {
        assert!(Instant::now() < deadline, "the server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Left out: membership changes (adding a member that does not exist takes the
    // majority away from a cluster of one, see docs/server.md); the laboratory's runs
    // (seconds each; the console's own tests hold its document to its routes); and the
    // event stream, which never ends, so each request would wait out the timeout (the
    // server's openapi.rs checks real events against its schema).
    let mut fuzz = Command::new(&st)
        .arg("run")
        .arg(format!("http://{addr}/openapi.json"))
        .args(["--checks", CHECKS, "--phases", "coverage,fuzzing", "--max-examples", "20", "--seed", "1"])
        .args(["--workers", "1", "--request-timeout", "20", "--no-color"])
        .args(["--exclude-path-regex", "^/v1/(cluster/members|sim/|events)"])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("schemathesis runs");
    // Its own time bound: a fuzzer that hangs fails the test rather than the CI run.
    let status = exit_within(&mut fuzz, Duration::from_secs(120));
    let out = fuzz.wait_with_output().unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(status.is_some(), "schemathesis did not finish within 120 s:\n{text}");
    assert!(
        status.unwrap().success(),
        "schemathesis found disagreements between the server and /openapi.json:\n{text}"
    );
    // It ran: operations were tested and test cases generated.
    assert!(text.contains("Tested:") && text.contains("generated"), "{text}");
}
