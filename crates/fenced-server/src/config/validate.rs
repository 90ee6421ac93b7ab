//! The checks a configuration passes before a server starts with it.

use super::*;

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return bad("tls_cert and tls_key go together");
        }
        if self.grant_retired_key.is_some() && (self.grant_signing_key.is_none() || self.grant_retired_key_until == 0) {
            return bad(
                "grant_retired_key needs grant_signing_key (the key that replaced it) and grant_retired_key_until",
            );
        }
        if self.grant_service.is_empty() || self.grant_service.len() > 256 || self.grant_service.contains('\0') {
            return bad("grant_service must be 1 to 256 bytes without a NUL");
        }
        if self.client_ca.is_some() && self.tls_cert.is_none() {
            return bad("client_ca needs tls_cert and tls_key: client certificates come with TLS");
        }
        if self.ttl_ms_min == 0 || self.ttl_ms_min > self.ttl_ms_max {
            return bad("need 0 < ttl_ms_min <= ttl_ms_max");
        }
        if self.lock_name_bytes_max == 0 || self.lock_name_bytes_max > fenced_core::LockName::LEN_MAX {
            return bad("lock_name_bytes_max must be between 1 and 256");
        }
        if self.value_bytes_max > self.body_bytes_max {
            return bad("value_bytes_max must not exceed body_bytes_max");
        }
        if self.unfenced_prefix.chars().any(char::is_control) {
            return bad("unfenced_prefix must not hold control characters");
        }
        if self.foreign_token_prefix.chars().any(char::is_control) {
            return bad("foreign_token_prefix must not hold control characters");
        }
        self.validate_signed_keys()?;
        if self.body_bytes_in_flight_max < self.body_bytes_max || self.body_bytes_in_flight_max > u32::MAX as usize {
            return bad("body_bytes_in_flight_max must be at least body_bytes_max and below 4 GiB");
        }
        if self.proposal_bytes_max < 1 << 20 || self.proposal_bytes_max > 1 << 34 {
            return bad("proposal_bytes_max must be between 1 MiB and 16 GiB");
        }
        if self.log_linger_percent > 100 {
            return bad("log_linger_percent must be between 0 and 100");
        }
        if self.worker_threads > 1024 {
            return bad("worker_threads must be at most 1024 (0: one fewer than the cores)");
        }
        if self.audit_log_bytes_max < 4096 || self.audit_log_files > 1000 {
            return bad("audit_log_bytes_max must be at least 4096 and audit_log_files at most 1000");
        }
        if self.events_retained > 1_000_000 {
            return bad("events_retained must be at most 1000000");
        }
        if self.snapshot_entries < 10 {
            return bad("snapshot_entries must be at least 10");
        }
        if self.node_id == 0 {
            return bad("node_id must be at least 1");
        }
        self.validate_peers()?;
        if self.connections_max == 0 || self.store_key_bytes_max == 0 || self.list_locks_max == 0 {
            return bad("connections_max, store_key_bytes_max and list_locks_max must be positive");
        }
        Ok(())
    }

    /// The peer side: certificates all or none, on a listener of their own, member URLs
    /// whose scheme says whether peers speak TLS, and no cluster of several members
    /// without peer authentication unless `insecure_peers` says so.
    pub(super) fn validate_peers(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let certs = [&self.peer_cert, &self.peer_key, &self.peer_ca].iter().filter(|p| p.is_some()).count();
        if certs != 0 && certs != 3 {
            return bad("peer_cert, peer_key and peer_ca go together".into());
        }
        if self.peer_tls() && self.peer_listen.is_none() {
            return bad(
                "peer_cert needs peer_listen: members authenticated by certificate are served on a listener of \
                 their own, which takes no client"
                    .into(),
            );
        }
        let scheme = if self.peer_tls() { "https://" } else { "http://" };
        let routes = self.routes()?;
        let members = self.members(&format!("{scheme}self"))?;
        if !members.contains_key(&self.node_id) {
            return bad("peers must list this node's own node_id".into());
        }
        for (id, url) in members.iter().chain(routes.iter()) {
            if !url.starts_with(scheme) {
                let why = if self.peer_tls() { "with peer certificates" } else { "without peer certificates" };
                return bad(format!("member {id} at {url}: {why} the member URLs are {scheme}HOST:PORT"));
            }
        }
        if members.len() > 1 && !self.peer_tls() && self.identities_file.is_some() && self.auth_token_file.is_none() {
            return bad(
                "insecure_peers with identities_file needs auth_token_file: without peer certificates the members \
                 present that token to each other"
                    .into(),
            );
        }
        if self.join && (members.len() < 2 || self.force_new_cluster) {
            return bad("join is for a member of a cluster of several (peers), to be added by it; not with \
                 force_new_cluster, which makes a cluster of this member alone"
                .into());
        }
        if members.len() > 1 && !self.peer_tls() && !self.insecure_peers {
            return bad("a cluster of several members needs peer authentication (peer_listen, peer_cert, peer_key, \
                 peer_ca: see docs/server.md, Security) or, on a network you trust entirely, insecure_peers = true"
                .into());
        }
        Ok(())
    }

    pub(super) fn validate_signed_keys(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        let (keys, locks) = (&self.signed_key_prefix, &self.signed_lock_prefix);
        if keys.chars().chain(locks.chars()).any(char::is_control) {
            return bad("signed_key_prefix and signed_lock_prefix must not hold control characters");
        }
        if keys.is_empty() {
            return if locks.is_empty() { Ok(()) } else { bad("signed_lock_prefix needs signed_key_prefix") };
        }
        if self.grant_signing_key.is_none() {
            return bad("signed_key_prefix needs grant_signing_key: the store checks the service's own signatures");
        }
        // A key under two rules would be asked for a signature and also be taken without
        // one (unfenced) or with another service's token (foreign): neither is kept apart.
        let overlaps = |other: &String| {
            !other.is_empty() && (keys.starts_with(other.as_str()) || other.starts_with(keys.as_str()))
        };
        if overlaps(&self.unfenced_prefix) || overlaps(&self.foreign_token_prefix) {
            return bad("signed_key_prefix must not overlap unfenced_prefix or foreign_token_prefix");
        }
        Ok(())
    }
}
