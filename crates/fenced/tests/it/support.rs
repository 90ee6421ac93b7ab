//! What the subcommands' tests share: running the binary, reading its JSON, and
//! finding the programs a test needs.

use std::path::Path;
use std::process::{Command, Output};

/// `fenced ARGS...`, run to its end.
pub fn fenced(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fenced")).args(args).output().expect("run fenced")
}

/// A report's numeric field; a report without it fails the test.
pub fn num(v: &serde_json::Value, field: &str) -> u64 {
    v[field].as_u64().unwrap_or_else(|| panic!("{field} is not a number in {v}"))
}

/// Whether `program` is on the PATH (and `file`, if named, exists): without them the
/// test skips with the reason, except under CI, where they must be there.
pub fn installed(program: &str, file: Option<&str>, install: &str) -> bool {
    let found = std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        && file.is_none_or(|f| Path::new(f).exists());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "{program} is needed ({install})");
        eprintln!("skipping: {program} is not installed ({install})");
    }
    found
}
