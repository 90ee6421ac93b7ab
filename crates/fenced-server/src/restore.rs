//! `fenced snapshot restore`: a new data directory from a backup file, for a fresh
//! single server or for every member of a new cluster (each restores the same file).
//!
//! The directory is built beside its destination (`DIR.restoring`) and renamed into
//! place only once whole (its `FORMAT`, and a log whose base state is the saved table),
//! so a restore cut short leaves no directory a server would start on (only
//! `DIR.restoring`, which a later restore refuses to take over: it removes nothing it did
//! not create). A destination
//! that exists and holds anything is refused: a restore never mixes a backup into a
//! member's log.

use std::path::{Path, PathBuf};

use fenced_core::Token;
use fenced_raft::backup;
pub use fenced_raft::backup::Header;

/// The largest backup file read (the table of a service at its default limits is far
/// smaller; this bounds the memory a wrong path can take).
pub const FILE_BYTES_MAX: u64 = 16 << 30;

/// Reads and verifies a backup file: its header and checksum, or why it is refused.
pub fn inspect(file: &Path) -> Result<(Header, String), String> {
    let b = read(file)?;
    Ok((b.header, b.checksum))
}

fn read(file: &Path) -> Result<backup::Backup, String> {
    let len = std::fs::metadata(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?.len();
    if len > FILE_BYTES_MAX {
        return Err(format!("{} is {len} bytes, more than any snapshot ({FILE_BYTES_MAX})", file.display()));
    }
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    backup::parse(&bytes).map_err(|e| format!("{}: {e}", file.display()))
}

/// Restores `file` into `dir`, which must be absent or empty; with `tokens_above`, the
/// restored service's next token is above it too. Returns the file's header and checksum.
pub fn restore(file: &Path, dir: &Path, tokens_above: Option<u64>) -> Result<(Header, String), String> {
    let b = read(file)?;
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(format!(
                    "{} is not empty: restore into a new directory (a restore never mixes a backup into a log)",
                    dir.display()
                ));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    }
    let staging = staging_dir(dir);
    // Made here, never taken over: what this restore did not create, it does not remove.
    if let Err(e) = std::fs::create_dir(&staging) {
        return Err(if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!(
                "{} exists (a restore cut short, or something else): remove it, or restore into another \
                 directory; nothing was changed",
                staging.display()
            )
        } else {
            format!("cannot create {}: {e}", staging.display())
        });
    }
    let (header, checksum) = (b.header.clone(), b.checksum.clone());
    let built = (|| {
        crate::format::check_or_create(&staging)?;
        let floor = tokens_above.and_then(Token::new);
        backup::restore(&staging, b, floor).map_err(|e| format!("cannot write the restored log: {e}"))?;
        sync_dir(&staging)?;
        // An empty destination is replaced (rename cannot replace a directory otherwise).
        if dir.exists() {
            std::fs::remove_dir(dir).map_err(|e| format!("cannot replace the empty {}: {e}", dir.display()))?;
        }
        std::fs::rename(&staging, dir)
            .map_err(|e| format!("cannot move the restored data to {}: {e}", dir.display()))?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        Ok(())
    })();
    if built.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    built.map(|()| (header, checksum))
}

fn staging_dir(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "data".into());
    name.push(".restoring");
    dir.with_file_name(name)
}

fn sync_dir(dir: &Path) -> Result<(), String> {
    std::fs::File::open(dir).and_then(|f| f.sync_all()).map_err(|e| format!("cannot sync {}: {e}", dir.display()))
}
