//! The web console in a real browser: starts `fenced server`, then runs the
//! playwright-core tests in `tests/browser` against it with Debian's Chromium.
//! Without node, Chromium or `npm ci` in `tests/browser`, this fails under CI and
//! skips with the reason elsewhere.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::exit_within;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// What is missing to run the browser tests, if anything.
fn missing(browser_dir: &Path) -> Option<String> {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !Path::new(&chromium).exists() {
        return Some(format!("no Chromium at {chromium} (apt-get install chromium)"));
    }
    if Command::new("node").arg("--version").output().is_err() {
        return Some("no node on PATH".into());
    }
    if !browser_dir.join("node_modules/playwright-core").exists() {
        return Some(format!("playwright-core is not installed (cd {} && npm ci)", browser_dir.display()));
    }
    None
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn livez(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /livez HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

/// The scenario names `fenced sim --help` lists.
fn cli_scenarios() -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_fenced")).args(["sim", "--scenario", "?"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let list = err.split("choose one of ").nth(1).expect("the error lists the scenarios");
    list.lines().next().unwrap().split(", ").map(|s| s.trim().to_string()).collect()
}

#[test]
fn the_console_in_a_real_browser() {
    let root = root();
    let browser_dir = root.join("tests/browser");
    if let Some(why) = missing(&browser_dir) {
        assert!(std::env::var_os("CI").is_none(), "browser tests cannot run under CI: {why}");
        eprintln!("skipping the browser tests: {why}");
        return;
    }
    let data = std::env::temp_dir().join(format!("fenced-console-it-{}", std::process::id()));
    let port = fenced_lab::peers::free_port().unwrap();
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_fenced"))
            .args(["server", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start fenced server"),
    );
    let started = Instant::now();
    while !livez(port) {
        assert!(started.elapsed() < Duration::from_secs(30), "the server did not answer /livez");
        std::thread::sleep(Duration::from_millis(100));
    }
    let shots = root.join("target/console-screenshots");
    // What `fenced sim --json` prints for every scenario on seed 1: the page's verdict
    // must say the same numbers.
    let names = cli_scenarios();
    let summaries: Vec<String> = names
        .iter()
        .map(|name| {
            let out = Command::new(env!("CARGO_BIN_EXE_fenced"))
                .args(["sim", "--scenario", name, "--seed", "1", "--json"])
                .output()
                .expect("run fenced sim");
            assert!(out.status.success(), "fenced sim --scenario {name} failed");
            format!("{:?}:{}", name, String::from_utf8(out.stdout).unwrap().trim())
        })
        .collect();
    let mut node = Command::new("node")
        .args(["--test", "--test-reporter=spec", "console.test.mjs"])
        .current_dir(&browser_dir)
        .env("FENCED_URL", format!("http://127.0.0.1:{port}"))
        .env("SCREENSHOT_DIR", &shots)
        .env("CLI_SUMMARIES", format!("{{{}}}", summaries.join(",")))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start node");
    let status = exit_within(&mut node, Duration::from_secs(300));
    let out = node.wait_with_output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    drop(server);
    let _ = std::fs::remove_dir_all(&data);
    let status = status.unwrap_or_else(|| panic!("the browser tests ran over 300 s:\n{report}"));
    assert!(status.success(), "the browser tests failed:\n{report}");
    for shot in ["lab.png", "live.png", "lab-split-brain.png"] {
        assert!(shots.join(shot).exists(), "no screenshot {shot}");
    }
}
