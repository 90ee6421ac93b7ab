//! `fenced snapshot save|status|restore`: backups of a running service, and new data
//! directories made from them (docs/operations.md, *Backup and restore*).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use fenced_server::restore::Header;
use serde_json::json;

use crate::args::{duration_ms, Global};

#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// Save a backup of the running service to FILE, from the leader (--endpoint), with
    /// every write acknowledged before the call; an admin's call where identities exist.
    /// The file is written beside FILE, checked, then renamed into place.
    Save(SaveArgs),
    /// Check a backup file and print what it holds: format, last index and term, the
    /// highest token, the counts of leases, locks and store keys, and its checksum.
    Status { file: PathBuf },
    /// Make a new data directory from a backup: for a fresh single server, or for every
    /// member of a new cluster (each restores the same file, then starts with its own
    /// --node-id and the new cluster's --peers).
    Restore(RestoreArgs),
}

#[derive(Args, Debug)]
pub struct SaveArgs {
    pub file: PathBuf,
    /// How long the save may take, the transfer included.
    #[arg(long, default_value = "60s", value_parser = duration_ms)]
    pub timeout: u64,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    pub file: PathBuf,
    /// The new data directory (absent or empty).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Tokens the restored service grants start above this too: give the highest token
    /// the old service may have issued after the save (the resources keep refusing
    /// lower ones). Without it they continue above the snapshot's highest token.
    #[arg(long)]
    pub tokens_above: Option<u64>,
}

pub fn run(cmd: SnapshotCmd, global: &Global) -> anyhow::Result<ExitCode> {
    match cmd {
        SnapshotCmd::Save(a) => save(a, global),
        SnapshotCmd::Status { file } => {
            let (header, checksum) = fenced_server::restore::inspect(&file).map_err(anyhow::Error::msg)?;
            print_header("", &file, &header, &checksum, global);
            Ok(ExitCode::SUCCESS)
        }
        SnapshotCmd::Restore(a) => {
            let (header, checksum) =
                fenced_server::restore::restore(&a.file, &a.data_dir, a.tokens_above).map_err(anyhow::Error::msg)?;
            let next = header.highest_token.max(a.tokens_above.unwrap_or(0)) + 1;
            if global.json() {
                let mut v = header_json(&a.file, &header, &checksum);
                v["data_dir"] = json!(a.data_dir);
                v["next_token"] = json!(next);
                println!("{v}");
            } else {
                print_header("restored ", &a.file, &header, &checksum, global);
                println!("into {}: the next token granted is {next} or above", a.data_dir.display());
                println!("start each member on its restored directory with its --node-id and the new --peers");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn save(a: SaveArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let client = crate::client_cmd::client(global)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    let part = part_path(&a.file);
    // A new file, never one that was there: what this save did not create, it does not
    // overwrite or remove.
    let mut f = match std::fs::OpenOptions::new().write(true).create_new(true).open(&part) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => anyhow::bail!(
            "{} exists (a save cut short, or something else): remove it, or save to another file; nothing was changed",
            part.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("creating {}", part.display())),
    };
    let saved = (|| {
        let bytes = rt.block_on(client.snapshot(Duration::from_millis(a.timeout)))?;
        f.write_all(&bytes).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", part.display()))?;
        // Read back what is on disk: a transfer cut short is found here, not at restore.
        let checked = fenced_server::restore::inspect(&part)
            .map_err(|e| anyhow::anyhow!("the saved snapshot does not check: {e}"))?;
        std::fs::rename(&part, &a.file)
            .with_context(|| format!("renaming {} to {}", part.display(), a.file.display()))?;
        Ok::<_, anyhow::Error>(checked)
    })();
    let (header, checksum) = match saved {
        Ok(v) => v,
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    if let Some(dir) = a.file.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(dir).and_then(|f| f.sync_all()).with_context(|| format!("syncing {}", dir.display()))?;
    }
    print_header("saved ", &a.file, &header, &checksum, global);
    Ok(ExitCode::SUCCESS)
}

fn part_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "snapshot".into());
    name.push(".part");
    file.with_file_name(name)
}

fn header_json(file: &Path, h: &Header, checksum: &str) -> serde_json::Value {
    let mut v = serde_json::to_value(h).expect("a header serialises");
    v["file"] = json!(file);
    v["sha256"] = json!(checksum);
    v
}

fn print_header(verb: &str, file: &Path, h: &Header, checksum: &str, global: &Global) {
    if global.json() {
        println!("{}", header_json(file, h, checksum));
        return;
    }
    println!("{verb}{}: fenced snapshot format {}, release {}", file.display(), h.format, h.release);
    println!("  last index {}, term {}, saved by node {}", h.last_index, h.last_term, h.saved_by_node);
    println!("  highest token {}", h.highest_token);
    println!(
        "  {} leases, {} locks, {} waiters, {} store keys ({} bytes)",
        h.leases, h.locks, h.waiters, h.store_keys, h.store_bytes
    );
    println!("  sha256 {checksum}");
}
