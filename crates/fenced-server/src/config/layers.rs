//! A configuration from its layers: flags over the environment over the file over the defaults.

use super::*;

impl Config {
    /// Layers, lowest first: defaults, the TOML file `file_text`, the environment
    /// (`env` yields `(name, value)` pairs; only `FENCED_<FIELD>` names count), and
    /// `flags` (TOML key and value, as typed by the user).
    pub fn layered(
        file_text: Option<&str>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &[(&str, String)],
    ) -> Result<Config, ConfigError> {
        let mut table = toml::Table::try_from(Config::default()).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let keys: Vec<String> = Config::keys();
        let mut ignored = Vec::new();
        if let Some(text) = file_text {
            let file: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError::Invalid(e.to_string()))?;
            for (k, v) in file {
                if RETIRED_SETTINGS.contains(&k.as_str()) {
                    ignored.push(k);
                    continue;
                }
                if !keys.contains(&k) {
                    return Err(ConfigError::Invalid(format!("unknown setting '{k}' in the config file")));
                }
                table.insert(k, v);
            }
        }
        for (name, raw) in env {
            let Some(key) = name.strip_prefix("FENCED_").map(str::to_ascii_lowercase) else { continue };
            if keys.contains(&key) {
                table.insert(key.clone(), typed(&key, &raw)?);
            }
        }
        for (key, raw) in flags {
            table.insert(key.to_string(), typed(key, raw)?);
        }
        let mut config: Config =
            toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| ConfigError::Invalid(e.to_string()))?;
        config.ignored_settings = ignored;
        config.validate()?;
        Ok(config)
    }

    /// The TOML form, as `--print-config` shows it.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("the config serializes")
    }

    pub(super) fn keys() -> Vec<String> {
        // Optional paths are absent from the serialized defaults; list them by hand.
        let mut keys: Vec<String> =
            toml::Table::try_from(Config::default()).expect("serializes").keys().cloned().collect();
        keys.extend(
            [
                "wire_listen",
                "auth_token_file",
                "identities_file",
                "audit_log",
                "tls_cert",
                "tls_key",
                "client_ca",
                "grant_signing_key",
                "grant_retired_key",
                "peer_listen",
                "peer_cert",
                "peer_key",
                "peer_ca",
            ]
            .map(String::from),
        );
        keys
    }
}
