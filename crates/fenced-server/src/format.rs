//! The data directory's format version, in the file `FORMAT` (one line,
//! `fenced data directory format N`), written when the directory is created and checked
//! at every start, before anything in it is opened:
//!
//! - the same version: served;
//! - an earlier format: upgraded in place, one way (docs/operations.md, *Upgrade*).
//!   What it holds is still read; what is written from now on is this format's, so
//!   `FORMAT` says so before anything is opened, and a release that reads only the
//!   earlier format refuses the directory rather than fail on the first record it
//!   cannot read. Format 1 kept log entries and snapshots as serde JSON; format 2
//!   writes entries as binary records (`fenced_raft::entry_format`); format 3 also
//!   writes snapshots in a binary format (`fenced_raft::snapshot_format`) and may hold
//!   the entry that sets the cluster's limits (`SetLimits`), which format 2 cannot read;
//!   format 4 keeps the snapshot in a file of its own (`snapshot`, see
//!   `fenced_raft::snapshot_file`), moved out of `raft.redb` at the first open, where
//!   format 3 would look for it and, not finding it, start from nothing; format 5
//!   keeps the log, the vote and the marks in segments of their own (the directory
//!   `log`, see `fenced_raft::segment_log`), moved out of `raft.redb` at the first open,
//!   where format 4 would find no log;
//! - a newer one (written by a later release): refused, saying both versions and what
//!   to do; nothing in the directory is touched;
//! - no `FORMAT` beside the files of an earlier release (`raft.redb`, or `fenced.redb`
//!   of the formats `migrate` brings over): those are format 1, upgraded as above;
//! - an empty or new directory: created with the file.
//!
//! A start reads the format first ([`check`], changing nothing) and writes what it
//! found was due ([`mark`]) only once nothing else refuses the start, before anything
//! in the directory is written: a refused start leaves the directory as it was.
//!
//! A later release that changes what `raft.redb` holds raises [`FORMAT_VERSION`] and
//! upgrades from every version before it (the fixture of each release's directory in
//! `tests/fixtures/` proves it still reads them), or refuses with the documented way
//! over (docs/operations.md, *Upgrade*).

use std::io::Write;
use std::path::Path;

/// The format this release writes and reads.
pub const FORMAT_VERSION: u32 = 5;

/// The earliest format this release reads (and upgrades to [`FORMAT_VERSION`]).
pub const FORMAT_VERSION_MIN: u32 = 1;

const FILE: &str = "FORMAT";
const PREFIX: &str = "fenced data directory format ";

/// Files that mark a directory written by an earlier release without `FORMAT`.
const EARLIER: [&str; 2] = ["raft.redb", "fenced.redb"];

/// Checks `dir`'s format, creating the directory and its `FORMAT` when new; an error
/// says why the directory cannot be served and what to do.
pub fn check_or_create(dir: &Path) -> Result<(), String> {
    let marking = check(dir)?;
    mark(dir, marking)
}

/// What [`mark`] has to do once a start's other checks passed.
#[must_use]
pub enum Marking {
    /// `FORMAT` says this release's format.
    Done,
    /// A new directory: created, with its `FORMAT`.
    New,
    /// A directory of an earlier format (`from`; 1 when it has no `FORMAT`): upgraded.
    Upgrade { from: u32 },
}

/// Reads `dir`'s format without changing anything: an error says why the directory
/// cannot be served and what to do; otherwise what [`mark`] is to write, which a start
/// does only once nothing else refuses it (a refused start leaves the directory as it
/// was), and before anything in the directory is written.
pub fn check(dir: &Path) -> Result<Marking, String> {
    let file = dir.join(FILE);
    match std::fs::read_to_string(&file) {
        Ok(text) => version(dir, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(if EARLIER.iter().any(|f| dir.join(f).exists()) { Marking::Upgrade { from: 1 } } else { Marking::New })
        }
        Err(e) => Err(format!("cannot read {}: {e}", file.display())),
    }
}

/// Writes what [`check`] found was to be written.
pub fn mark(dir: &Path, marking: Marking) -> Result<(), String> {
    let file = dir.join(FILE);
    match marking {
        Marking::Done => return Ok(()),
        Marking::New => {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create the data directory {}: {e}", dir.display()))?;
        }
        Marking::Upgrade { from } => {
            tracing::info!(data_dir = %dir.display(), from, to = FORMAT_VERSION, "the data directory's format is upgraded (one way: what is written from now on is in the new format)");
        }
    }
    write(dir).map_err(|e| format!("cannot write {}: {e}", file.display()))
}

fn version(dir: &Path, text: &str) -> Result<Marking, String> {
    let version = text.trim().strip_prefix(PREFIX).and_then(|v| v.parse::<u32>().ok()).ok_or_else(|| {
        format!(
            "{} does not say a format ('{}'): this is not a Fenced data directory, or its FORMAT file is damaged",
            dir.join(FILE).display(),
            text.trim().chars().take(80).collect::<String>()
        )
    })?;
    match version {
        FORMAT_VERSION => Ok(Marking::Done),
        v if v > FORMAT_VERSION => Err(format!(
            "the data directory {} is in format {v}, written by a later release of Fenced; this release ({}) \
             reads format {FORMAT_VERSION} (and upgrades formats {FORMAT_VERSION_MIN} and later). Run that release (or a \
             later one) on it, or restore a snapshot into a new directory (docs/operations.md, Upgrade); nothing \
             in it was changed",
            dir.display(),
            env!("CARGO_PKG_VERSION"),
        )),
        v if v >= FORMAT_VERSION_MIN => Ok(Marking::Upgrade { from: v }),
        v => Err(format!("the data directory {} says format {v}, which no release wrote", dir.display())),
    }
}

/// Writes `FORMAT` durably: a temporary file, fsynced, renamed, and the directory fsynced.
fn write(dir: &Path) -> std::io::Result<()> {
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{PREFIX}{FORMAT_VERSION}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests;
