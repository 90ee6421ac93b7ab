//! The process tree under `fenced exec` and its watchdog: finding every descendant,
//! signalling them, reaping them.
//!
//! A process group alone is not enough: `setsid` or a double fork takes a process out
//! of it. On Linux both `fenced exec` and its watchdog are child subreapers, so such a
//! process stays a descendant (it re-parents to the nearest of them instead of init),
//! and the tree is read from the `ppid` field of every `/proc/<pid>/stat`: that works
//! on every kernel, where `/proc/<pid>/task/*/children` needs `CONFIG_PROC_CHILDREN`.
//! Elsewhere there is no subreaper and no `/proc`: only the process group is found.

/// Makes orphaned descendants re-parent to this process rather than to init, so that a
/// process that left the group (setsid, double fork) can still be found and reaped.
#[cfg(target_os = "linux")]
pub fn become_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only; no memory is passed.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub fn become_subreaper() -> std::io::Result<()> {
    Ok(())
}

/// Every live (not zombie) process below `root`, parents before their children.
#[cfg(target_os = "linux")]
pub fn live_descendants(root: libc::pid_t) -> Vec<libc::pid_t> {
    use std::collections::HashMap;
    let mut children: HashMap<libc::pid_t, Vec<(libc::pid_t, bool)>> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<libc::pid_t>().ok()) else { continue };
        // A process may vanish between the listing and the read: then it is not there.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        if let Some((ppid, zombie)) = parse_stat(&stat) {
            children.entry(ppid).or_default().push((pid, zombie));
        }
    }
    // Zombies stay in the walk: a zombie's children are not re-parented until it is reaped.
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(p) = queue.pop() {
        for &(c, zombie) in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if !zombie {
                found.push(c);
            }
            queue.push(c);
        }
    }
    found
}

#[cfg(not(target_os = "linux"))]
pub fn live_descendants(_root: libc::pid_t) -> Vec<libc::pid_t> {
    Vec::new()
}

/// The parent pid and whether the process is a zombie, from `/proc/<pid>/stat`. The
/// command name may hold spaces and parentheses, so the fields start after the last `)`.
#[cfg(target_os = "linux")]
fn parse_stat(stat: &str) -> Option<(libc::pid_t, bool)> {
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state == "Z"))
}

/// Signals `pid`; a process that is already gone is not an error here.
pub fn kill(pid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: kill(2) takes no memory; a stale pid only fails with ESRCH.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Signals a whole process group.
pub fn killpg(pgid: libc::pid_t, sig: libc::c_int) {
    kill(-pgid, sig);
}

/// Whether any process of the group is still there (a zombie member counts until its
/// parent reaps it).
pub fn group_alive(pgid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks that the group exists and may be signalled.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// Reaps every child that has exited, without blocking; returns their pids and raw
/// wait statuses.
pub fn reap_exited() -> Vec<(libc::pid_t, libc::c_int)> {
    let mut reaped = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`, a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return reaped;
        }
        reaped.push((pid, status));
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::parse_stat;

    #[test]
    fn stat_fields_come_after_the_last_parenthesis() {
        assert_eq!(parse_stat("42 (sh) S 7 42 42 0 -1"), Some((7, false)));
        assert_eq!(parse_stat("43 (a) b) (c) Z 1 43 43 0 -1"), Some((1, true)));
        assert_eq!(parse_stat("garbage"), None);
    }
}
