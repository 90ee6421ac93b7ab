//! Arguments shared by every subcommand: the output format, the endpoint, durations.

use std::fmt;

use clap::{Args, ValueEnum};

#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Shorthand for --output json.
    #[arg(long, global = true)]
    pub json: bool,
    /// The server to talk to; the members of a cluster separated by commas (a call
    /// moves to the next when one is down or not the leader).
    #[arg(long, global = true, env = "FENCED_ENDPOINT", default_value = "http://127.0.0.1:7400")]
    pub endpoint: String,
    /// With several endpoints: how long a member may answer neither a request nor a
    /// probe of its liveness before the call moves to the next (a parked acquire on a
    /// live leader is not cut). Like 500ms or 2s.
    #[arg(long, global = true, env = "FENCED_ATTEMPT_TIMEOUT", default_value = "750ms", value_parser = duration_ms)]
    pub attempt_timeout: u64,
}

impl Global {
    pub fn json(&self) -> bool {
        self.json || self.output == Output::Json
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

/// An argument that parsed but makes no sense; exits with status 2.
#[derive(Debug)]
pub struct BadArgument {
    pub arg: &'static str,
    pub message: String,
}

impl BadArgument {
    pub fn error(arg: &'static str, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(BadArgument { arg, message: message.into() })
    }
}

impl fmt::Display for BadArgument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.arg, self.message)
    }
}

impl std::error::Error for BadArgument {}

/// Parses `on`/`off` (or `true`/`false`), as `--fencing` takes it.
pub fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("'{s}' is neither on nor off")),
    }
}

pub use fenced_core::duration_ms;

#[cfg(test)]
mod tests {
    use super::duration_ms;

    #[test]
    fn durations() {
        assert_eq!(duration_ms("750ms"), Ok(750));
        assert_eq!(duration_ms("90s"), Ok(90_000));
        assert_eq!(duration_ms("10m"), Ok(600_000));
        assert_eq!(duration_ms("1h"), Ok(3_600_000));
        assert_eq!(duration_ms("250"), Ok(250));
        assert!(duration_ms("s").is_err());
        assert!(duration_ms("5d").is_err());
        assert!(duration_ms("99999999999999999999s").is_err());
    }
}
