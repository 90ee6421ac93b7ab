//! Tests of the data directory's format marker: written, read, refused when it is not this release's.

use super::*;

fn scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fenced-format-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn a_new_directory_gets_its_format_and_reads_it_back() {
    let d = scratch("new");
    check_or_create(&d).unwrap();
    assert_eq!(std::fs::read_to_string(d.join(FILE)).unwrap(), format!("{PREFIX}{FORMAT_VERSION}\n"));
    check_or_create(&d).unwrap();
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_newer_format_is_refused_and_left_alone() {
    let d = scratch("newer");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(FILE), format!("{PREFIX}{}\n", FORMAT_VERSION + 1)).unwrap();
    let e = check_or_create(&d).unwrap_err();
    let later = FORMAT_VERSION + 1;
    assert!(e.contains(&format!("format {later}, written by a later release")), "{e}");
    assert!(e.contains(&format!("reads format {FORMAT_VERSION}")), "{e}");
    assert_eq!(std::fs::read_to_string(d.join(FILE)).unwrap(), format!("{PREFIX}{later}\n"), "untouched");
    std::fs::write(d.join(FILE), "something else\n").unwrap();
    assert!(check_or_create(&d).unwrap_err().contains("does not say a format"));
    std::fs::write(d.join(FILE), format!("{PREFIX}0\n")).unwrap();
    assert!(check_or_create(&d).unwrap_err().contains("which no release wrote"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_earlier_format_is_upgraded_to_this_format() {
    for earlier in FORMAT_VERSION_MIN..FORMAT_VERSION {
        let d = scratch(&format!("earlier-{earlier}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(FILE), format!("{PREFIX}{earlier}\n")).unwrap();
        check_or_create(&d).unwrap();
        assert_eq!(std::fs::read_to_string(d.join(FILE)).unwrap(), format!("{PREFIX}{FORMAT_VERSION}\n"));
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[test]
fn an_earlier_releases_directory_is_marked_as_it_is() {
    let d = scratch("earlier");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("raft.redb"), b"not opened here").unwrap();
    check_or_create(&d).unwrap();
    assert!(d.join(FILE).exists());
    assert_eq!(std::fs::read(d.join("raft.redb")).unwrap(), b"not opened here");
    let _ = std::fs::remove_dir_all(&d);
}
