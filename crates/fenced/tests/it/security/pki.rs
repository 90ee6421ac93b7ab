//! A certificate authority made with the `openssl` commands of docs/server.md, *Security*,
//! and the certificates it issues.

use super::*;

/// A certificate authority in a directory, and the certificates it issues.
pub(super) struct Pki {
    pub(super) dir: PathBuf,
    pub(super) name: String,
}

pub(super) fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl is installed");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// `openssl req` (with `kind`: `-x509` for a self-signed certificate) with a new P-256
/// key written to `key`, then `more` arguments.
pub(super) fn new_key_request(dir: &Path, kind: &[&str], key: &str, more: &[&str]) {
    let mut args = vec!["req"];
    args.extend(kind);
    args.extend(["-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", key]);
    args.extend(more);
    openssl(dir, &args);
}

impl Pki {
    /// A new CA, `NAME-ca.pem` and `NAME-ca.key` in `dir`.
    pub(super) fn new(dir: &Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let (pem, key, subj) = (format!("{name}-ca.pem"), format!("{name}-ca.key"), format!("/CN={name} CA"));
        new_key_request(dir, &["-x509"], &key, &["-out", &pem, "-days", "30", "-subj", &subj]);
        Pki { dir: dir.to_path_buf(), name: name.to_string() }
    }

    pub(super) fn ca(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// A certificate for 127.0.0.1, good for a server and a client (`who.pem`, `who.key`).
    pub(super) fn issue(&self, who: &str) -> (PathBuf, PathBuf) {
        let ext = format!("{who}.ext");
        std::fs::write(
            self.dir.join(&ext),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        let (csr, pem, key, subj) =
            (format!("{who}.csr"), format!("{who}.pem"), format!("{who}.key"), format!("/CN={who}"));
        let (ca_pem, ca_key) = (format!("{}-ca.pem", self.name), format!("{}-ca.key", self.name));
        new_key_request(&self.dir, &[], &key, &["-out", &csr, "-subj", &subj]);
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_pem,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "30",
                "-extfile",
                &ext,
            ],
        );
        (self.dir.join(pem), self.dir.join(key))
    }
}
