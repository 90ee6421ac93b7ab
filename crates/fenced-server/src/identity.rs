//! Who is calling, and what they may do: identities found by a bearer token or by the
//! subject of a client certificate (`client_ca`), each granted operations on name
//! prefixes (`identities_file`, TOML), or the one identity of `auth_token_file`, or, with
//! neither, everyone as one identity with every right. A token presented decides alone
//! (a wrong one is refused, whatever the certificate). With `client_ca` and no
//! `identities_file`, a verified client certificate is required on every call (and the
//! token too, with `auth_token_file`).
//!
//! A lease belongs to the identity that created it. The server never stores that:
//! an identity's lease ids are mapped into the lock table through a one-way function
//! of the identity's name and the id the caller sees (SHA-256, first 128 bits), so the
//! same id sent by another identity names another lease (`lease_not_found`), on every
//! member alike and across failover, with nothing added to the replicated state. The
//! single identity of `auth_token_file` (and the open server) keeps the ids as they
//! are, so their data directories read as before.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fenced_core::LeaseId;
use ring::digest::{digest, SHA256};
use serde::Deserialize;

/// An operation a rule can grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Acquire, release, check and view locks; create, keep alive and revoke leases.
    Lock,
    /// Read fenced-store keys (plain or fenced reads) and list them.
    StoreRead,
    /// Write fenced-store keys.
    StoreWrite,
    /// Change the membership, and run the laboratory's simulations.
    Admin,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Lock => "lock",
            Op::StoreRead => "store_read",
            Op::StoreWrite => "store_write",
            Op::Admin => "admin",
        }
    }

    const ALL: [Op; 4] = [Op::Lock, Op::StoreRead, Op::StoreWrite, Op::Admin];
}

/// Operations granted on names starting with `prefix`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub prefix: String,
    pub ops: Vec<Op>,
}

/// One caller's rights.
#[derive(Debug)]
pub struct Identity {
    pub name: String,
    rules: Vec<Rule>,
    /// Whether this identity's lease ids are its own (mapped, see the module's doc);
    /// false for the single identity of `auth_token_file` or of an open server.
    own_leases: bool,
}

impl Identity {
    /// Every right on every name, lease ids as they are.
    fn everything(name: &str) -> Identity {
        let rules = vec![Rule { prefix: String::new(), ops: Op::ALL.to_vec() }];
        Identity { name: name.into(), rules, own_leases: false }
    }

    /// Whether `op` is allowed on `name`: the rule with the longest prefix of `name`
    /// decides; no rule, no access.
    pub fn allows(&self, op: Op, name: &str) -> bool {
        let rule = self.rules.iter().filter(|r| name.starts_with(&r.prefix)).max_by_key(|r| r.prefix.len());
        rule.is_some_and(|r| r.ops.contains(&op))
    }

    /// Whether `op` is allowed on some name (leases, which name no lock).
    pub fn allows_some(&self, op: Op) -> bool {
        self.rules.iter().any(|r| r.ops.contains(&op))
    }

    /// The lock table's id of the lease this identity calls `id`.
    pub fn lease(&self, id: LeaseId) -> LeaseId {
        if !self.own_leases {
            return id;
        }
        let mut input = Vec::with_capacity(self.name.len() + 24);
        input.extend_from_slice(b"fenced lease\0");
        input.extend_from_slice(self.name.as_bytes());
        input.push(0);
        input.extend_from_slice(&id.0.to_le_bytes());
        let h = digest(&SHA256, &input);
        let mut b = [0u8; 16];
        b.copy_from_slice(&h.as_ref()[..16]);
        LeaseId(u128::from_le_bytes(b))
    }
}

/// Everyone who may call, by the SHA-256 of their bearer token or by their
/// certificate's subject (canonical, [`crate::subject`]).
#[derive(Debug)]
pub struct Identities {
    by_token: HashMap<[u8; 32], Arc<Identity>>,
    by_subject: HashMap<String, Arc<Identity>>,
    /// `client_ca` without `identities_file`: no call without a verified certificate.
    cert_required: bool,
    /// With no credential configured at all: everyone is this identity.
    open: Option<Arc<Identity>>,
}

/// The most identities a file may hold, and rules an identity may have.
const IDENTITIES_MAX: usize = 10_000;
const RULES_MAX: usize = 1_000;
/// The longest identity name, in bytes (it goes into audit lines).
pub const NAME_BYTES_MAX: usize = 128;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    identity: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    token_file: Option<PathBuf>,
    token_sha256: Option<String>,
    cert_subject: Option<String>,
    #[serde(default)]
    allow: Vec<Rule>,
}

/// How an identity of the file is found.
enum Credential {
    Token([u8; 32]),
    Subject(String),
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, bytes).as_ref());
    out
}

/// A token file's content, trimmed; never empty.
pub fn read_token(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    let token = text.trim().as_bytes().to_vec();
    if token.is_empty() {
        return Err(format!("{what} {} is empty", path.display()));
    }
    Ok(token)
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Identities {
    /// From the configuration: `identities_file` (relative token files are found beside
    /// it), `auth_token_file` (one identity, `default`, with every right) and whether
    /// `client_ca` is set (client certificates are verified by the TLS handshake).
    pub fn load(
        identities_file: Option<&Path>,
        auth_token_file: Option<&Path>,
        client_ca: bool,
    ) -> Result<Identities, String> {
        let mut ids = Identities {
            by_token: HashMap::new(),
            by_subject: HashMap::new(),
            cert_required: client_ca && identities_file.is_none(),
            open: (auth_token_file.is_none() && identities_file.is_none())
                .then(|| Arc::new(Identity::everything("anonymous"))),
        };
        if let Some(path) = auth_token_file {
            let token = sha256(&read_token(path, "auth_token_file")?);
            ids.by_token.insert(token, Arc::new(Identity::everything("default")));
        }
        if let Some(path) = identities_file {
            ids.read_file(path, client_ca)?;
        }
        Ok(ids)
    }

    fn read_file(&mut self, path: &Path, client_ca: bool) -> Result<(), String> {
        let what = |m: String| format!("identities_file {}: {m}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| what(e.to_string()))?;
        let file: File = toml::from_str(&text).map_err(|e| what(e.to_string()))?;
        if file.identity.len() > IDENTITIES_MAX {
            return Err(what(format!("more than {IDENTITIES_MAX} identities")));
        }
        let mut names = std::collections::HashSet::new();
        for e in file.identity {
            let bad = |m: &str| Err(what(format!("identity '{}': {m}", e.name)));
            if e.name.is_empty() || e.name.len() > NAME_BYTES_MAX || e.name.chars().any(char::is_control) {
                return bad("a name is 1 to 128 bytes without control characters");
            }
            if e.name == "default" || e.name == "anonymous" || !names.insert(e.name.clone()) {
                return bad("the name is taken (another identity, or 'default' or 'anonymous')");
            }
            if e.allow.len() > RULES_MAX {
                return bad("too many rules");
            }
            let credential = match (&e.token_file, &e.token_sha256, &e.cert_subject) {
                (Some(file), None, None) => {
                    let file = if file.is_relative() {
                        path.parent().unwrap_or(Path::new(".")).join(file)
                    } else {
                        file.clone()
                    };
                    Credential::Token(sha256(&read_token(&file, "token_file")?))
                }
                (None, Some(hex), None) => match parse_hex32(&hex.to_ascii_lowercase()) {
                    Some(h) => Credential::Token(h),
                    None => return bad("token_sha256 is 64 hex digits, the SHA-256 of the token"),
                },
                (None, None, Some(_)) if !client_ca => {
                    return bad("cert_subject needs client_ca (the CA that signs the clients' certificates)")
                }
                (None, None, Some(subject)) => match crate::subject::canonical(subject) {
                    Ok(s) => Credential::Subject(s),
                    Err(m) => return bad(&m),
                },
                _ => return bad("give one of token_file, token_sha256 and cert_subject"),
            };
            let identity = Arc::new(Identity { name: e.name.clone(), rules: e.allow, own_leases: true });
            let taken = match credential {
                Credential::Token(hash) => self.by_token.insert(hash, identity).is_some(),
                Credential::Subject(s) => self.by_subject.insert(s, identity).is_some(),
            };
            if taken {
                return bad("its token or certificate subject is another identity's");
            }
        }
        Ok(())
    }

    /// The caller presenting `bearer` (the `Authorization: Bearer` value, or the wire
    /// protocol's AUTH token; None when it sent none) on a connection whose verified
    /// client certificate has `subject` (canonical), or None: 401.
    /// The identity called `name` (a caller a member forwarded, authenticated there).
    pub fn by_name(&self, name: &str) -> Option<Arc<Identity>> {
        if let Some(open) = &self.open {
            return (open.name == name).then(|| open.clone());
        }
        self.by_token.values().chain(self.by_subject.values()).find(|i| i.name == name).cloned()
    }

    pub fn find(&self, bearer: Option<&[u8]>, subject: Option<&str>) -> Option<Arc<Identity>> {
        if self.cert_required && subject.is_none() {
            return None;
        }
        if let Some(open) = &self.open {
            return Some(open.clone());
        }
        match bearer {
            Some(token) => self.by_token.get(&sha256(token)).cloned(),
            None => self.by_subject.get(subject?).cloned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(rules: &[(&str, &[Op])]) -> Identity {
        let rules = rules.iter().map(|(p, ops)| Rule { prefix: p.to_string(), ops: ops.to_vec() }).collect();
        Identity { name: "t".into(), rules, own_leases: true }
    }

    #[test]
    fn the_most_specific_prefix_decides_and_no_rule_is_no_access() {
        let id = identity(&[("billing/", &[Op::Lock, Op::StoreRead]), ("billing/secret/", &[Op::StoreRead])]);
        assert!(id.allows(Op::Lock, "billing/run"));
        assert!(!id.allows(Op::Lock, "billing/secret/x"), "the longer prefix takes the lock right away");
        assert!(id.allows(Op::StoreRead, "billing/secret/x"));
        assert!(!id.allows(Op::StoreWrite, "billing/run"));
        assert!(!id.allows(Op::Lock, "orders/1"), "no rule: no access");
        assert!(id.allows_some(Op::Lock) && !id.allows_some(Op::Admin));
    }

    #[test]
    fn an_identitys_lease_ids_are_its_own() {
        let a = Identity { name: "a".into(), rules: vec![], own_leases: true };
        let b = Identity { name: "b".into(), rules: vec![], own_leases: true };
        let id = LeaseId(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(a.lease(id), a.lease(id), "the same on every call and every member");
        assert_ne!(a.lease(id), b.lease(id));
        assert_ne!(a.lease(id), id);
        assert_eq!(Identity::everything("default").lease(id), id, "the single identity keeps its ids");
    }

    #[test]
    fn a_file_that_does_not_parse_or_repeats_a_token_is_refused() {
        let dir = std::env::temp_dir().join(format!("fenced-identities-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.token"), "alpha-token\n").unwrap();
        let file = dir.join("ids.toml");
        let hash: String = sha256(b"beta-token").iter().map(|b| format!("{b:02x}")).collect();
        let good = format!(
            "[[identity]]\nname = \"a\"\ntoken_file = \"a.token\"\nallow = [{{ prefix = \"a/\", ops = [\"lock\"] }}]\n\
             [[identity]]\nname = \"b\"\ntoken_sha256 = \"{hash}\"\nallow = [{{ prefix = \"\", ops = [\"admin\"] }}]\n"
        );
        std::fs::write(&file, &good).unwrap();
        let ids = Identities::load(Some(&file), None, false).unwrap();
        assert_eq!(ids.find(Some(b"alpha-token"), None).map(|i| i.name.clone()).as_deref(), Some("a"));
        assert_eq!(ids.find(Some(b"beta-token"), None).map(|i| i.name.clone()).as_deref(), Some("b"));
        assert!(ids.find(Some(b"gamma"), None).is_none() && ids.find(None, None).is_none());
        for bad in [
            "[[identity]]\nname = \"a\"\n".to_string(),
            "[[identity]]\nname = \"a\"\ntoken_file = \"a.token\"\nallow = [{ prefix = \"\", ops = [\"root\"] }]\n"
                .into(),
            format!("{good}[[identity]]\nname = \"c\"\ntoken_file = \"a.token\"\n"),
            "not toml [".into(),
        ] {
            std::fs::write(&file, &bad).unwrap();
            assert!(Identities::load(Some(&file), None, false).is_err(), "{bad}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_certificate_subject_finds_its_identity_and_a_token_decides_alone() {
        let dir = std::env::temp_dir().join(format!("fenced-identities-cert-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.token"), "alpha-token\n").unwrap();
        let file = dir.join("ids.toml");
        let good = "[[identity]]\nname = \"a\"\ntoken_file = \"a.token\"\n\
                    [[identity]]\nname = \"billing\"\ncert_subject = \"cn=billing, O=Acme\"\n";
        std::fs::write(&file, good).unwrap();
        let ids = Identities::load(Some(&file), None, true).unwrap();
        let name = |i: Option<Arc<Identity>>| i.map(|i| i.name.clone());
        assert_eq!(name(ids.find(None, Some("CN=billing,O=Acme"))).as_deref(), Some("billing"));
        assert_eq!(name(ids.find(None, Some("CN=billing"))), None, "the whole subject, not a part");
        assert_eq!(name(ids.find(Some(b"alpha-token"), Some("CN=billing,O=Acme"))).as_deref(), Some("a"));
        assert_eq!(name(ids.find(Some(b"wrong"), Some("CN=billing,O=Acme"))), None, "a wrong token is refused");
        // Without client_ca the file is refused: nothing would verify the certificates.
        let err = Identities::load(Some(&file), None, false).unwrap_err();
        assert!(err.contains("cert_subject needs client_ca"), "{err}");
        std::fs::write(&file, format!("{good}[[identity]]\nname = \"c\"\ncert_subject = \"CN=billing,O=Acme\"\n"))
            .unwrap();
        assert!(Identities::load(Some(&file), None, true).unwrap_err().contains("another identity's"));
        // client_ca alone: a verified certificate is the credential, none is no access.
        let ids = Identities::load(None, None, true).unwrap();
        assert!(ids.find(None, None).is_none());
        assert!(ids.find(None, Some("CN=anyone")).is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
