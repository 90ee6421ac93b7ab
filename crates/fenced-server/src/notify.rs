//! Readiness for a service manager: systemd's `sd_notify` protocol, written here in a
//! few lines rather than taken as a crate. Under `Type=notify` systemd sets
//! `NOTIFY_SOCKET` (a path, or `@name` for an abstract socket) and waits for one
//! datagram `READY=1` before it counts the service started; `STOPPING=1` says the
//! drain began. Without `NOTIFY_SOCKET` (any other supervisor, a terminal) nothing is
//! sent. A failure to send is logged once and never stops the server: readiness is a
//! courtesy to the supervisor, `/readyz` remains the truth.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `"READY=1"`) to the service manager, if there is one.
pub fn notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&socket, state) {
        tracing::warn!(error = %e, socket = ?socket, state, "cannot tell the service manager");
    }
}

fn send(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = socket.as_bytes();
    let sock = UnixDatagram::unbound()?;
    match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            sock.send_to(state.as_bytes(), std::path::Path::new(socket))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory of this test's own under the system's temporary directory.
    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("fenced-notify-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_datagram_reaches_a_path_socket_and_an_abstract_one() {
        let dir = scratch("path");
        let path = dir.join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("fenced-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        send(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_missing_socket_is_an_error_not_a_panic() {
        let dir = scratch("absent");
        assert!(send(dir.join("absent").as_os_str(), "READY=1").is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
