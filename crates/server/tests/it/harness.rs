//! Shared test machinery: addresses of a test's own, child processes
//! killed on drop, a real DNS server (pebble-challtestsrv) that answers
//! every name with one loopback address, BIND with a static or a TSIG-updatable zone, an http-01
//! responder, and servers started in-process or as the `acme-proxy` binary.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acme_proxy::clock::SystemClock;
use acme_proxy::config::Config;
use acme_proxy::server::Running;
use axum::extract::{Path as AxPath, State};
use axum::routing::get;

/// A temporary directory only its owner can enter (0700), as the server
/// wants its data directory: tempfile makes them 0777 less the umask.
pub fn tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .expect("tempdir")
}

/// A TCP port that was free a moment ago (and whose UDP twin was too).
///
/// Only for a port number that nothing binds (a test that needs some
/// `http_port` but never validates over it), and for named, which listens
/// only on the addresses of the machine's interfaces (127.0.0.1, not an
/// [`own_host`]) and so is retried when it finds its port taken
/// ([`PORT_ATTEMPTS`], [`address_in_use`]). A port that any other program
/// must be told and then binds is an [`own_addr`], which no parallel test
/// can take.
pub fn free_port() -> u16 {
    loop {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = tcp.local_addr().expect("addr").port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// This test process's own loopback address, 127.A.B.C made from its
/// process id (A ≥ 1, so never 127.0.0.x, where the shared listeners are).
/// Two processes alive at once never share it: nextest runs each test in a
/// process of its own, and the programs a test starts bind only addresses
/// that test gave them.
pub fn own_host() -> std::net::Ipv4Addr {
    let pid = std::process::id();
    std::net::Ipv4Addr::new(
        127,
        1 + ((pid >> 16) & 0x7f) as u8,
        (pid >> 8) as u8,
        pid as u8,
    )
}

/// First port handed out on [`own_host`]: below the kernel's ephemeral
/// range (32768 and up by default), so a socket bound to port 0 is never
/// given it.
const OWN_PORTS_FROM: u16 = 20_000;

/// A fresh address on [`own_host`] for a program that must be told where
/// to listen and cannot report a port of its own choosing (certbot's and
/// lego's standalone servers, a listener that must keep its address across
/// restarts): each call gives the next port of this process, so no other
/// test can take it between the pick and the bind.
pub fn own_addr() -> SocketAddr {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(OWN_PORTS_FROM);
    let port = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    assert!(
        port < 32_768,
        "own_addr ran out of ports below the ephemeral range"
    );
    SocketAddr::from((own_host(), port))
}

/// Which database the suite's servers use: SQLite files (the default), or
/// with `TEST_DB_BACKEND=postgres` a database of their own on the
/// PostgreSQL server `TEST_POSTGRES_URL` names (scripts/test starts
/// a throwaway one and runs the suite on each engine).
pub fn on_postgres() -> bool {
    match std::env::var("TEST_DB_BACKEND").as_deref() {
        Ok("postgres") => true,
        Ok("sqlite") | Err(_) => false,
        Ok(other) => panic!("TEST_DB_BACKEND={other}: write sqlite or postgres"),
    }
}

/// A new, empty PostgreSQL database for one server of a test, its URL.
///
/// Named `t_PID_N` after the test's process (nextest runs each test in a
/// process of its own). The first one a process makes sweeps away the
/// databases of processes that have ended, and any of an earlier process
/// that had the same PID: a suite of several hundred tests would otherwise
/// leave gigabytes behind on the server's disk.
pub fn fresh_postgres_database() -> String {
    postgres_database_copying(None)
}

/// [`fresh_postgres_database`], made as a copy of database `template`
/// when one is named (PostgreSQL's `CREATE DATABASE ... TEMPLATE`).
pub fn postgres_database_copying(template: Option<&str>) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let server = std::env::var("TEST_POSTGRES_URL").expect(
        "TEST_POSTGRES_URL names the PostgreSQL server of the suite (scripts/test starts one)",
    );
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    if n == 0 {
        drop_databases_of_ended_tests(&server);
    }
    let name = format!("t_{}_{n}", std::process::id());
    let template = template
        .map(|t| format!(" TEMPLATE {t}"))
        .unwrap_or_default();
    psql_scalar(&server, &format!("CREATE DATABASE {name}{template}"));
    // The same server and options, another database.
    let (base, query) = server.split_once('?').unwrap_or((&server, ""));
    let (base, _) = base
        .rsplit_once('/')
        .expect("TEST_POSTGRES_URL is postgres://USER@HOST/DATABASE");
    format!("{base}/{name}?{query}")
}

/// Runs `sql` with psql on `url`: its output, unaligned and without
/// headers, if it succeeded, else psql's error.
fn psql(url: &str, sql: &str) -> Result<String, String> {
    let out = Command::new("psql")
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .arg(url)
        .output()
        .expect("run psql");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Makes `server`'s database refuse every new audit row from now on (a
/// trigger), so that a test can show which changes are only ever written
/// together with theirs.
pub fn refuse_audit_rows(server: &TestServer) {
    let url = server.running().generations.current().config.database_url();
    if let Some(path) = url.strip_prefix("sqlite:") {
        rusqlite::Connection::open(path)
            .expect("open the database")
            .execute_batch(
                "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_log
                 BEGIN SELECT RAISE(ABORT, 'audit rows refused by the test'); END;",
            )
            .expect("the trigger");
    } else {
        psql(
            &url,
            "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'audit rows refused by the test'; END $$;
             CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_log
               FOR EACH ROW EXECUTE FUNCTION refuse_audit();",
        )
        .expect("the trigger");
    }
}

/// Runs `sql` on `server`'s database, on either engine, behind the
/// server's back: for a test that shows what the server does not read.
pub fn change_behind(server: &TestServer, sql: &str) {
    let url = server.running().generations.current().config.database_url();
    if let Some(path) = url.strip_prefix("sqlite:") {
        rusqlite::Connection::open(path)
            .expect("open the database")
            .execute_batch(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    } else {
        psql_scalar(&url, sql);
    }
}

/// One SQL answer from a PostgreSQL database (psql), for what the store's
/// API does not say: sessions, locks, leases, counts.
pub fn psql_scalar(url: &str, sql: &str) -> String {
    psql(url, sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// [`psql_scalar`] for a count.
pub fn psql_count(url: &str, sql: &str) -> u64 {
    psql_scalar(url, sql).parse().expect("a count")
}

/// Drops the test databases on `server` whose process has ended or whose
/// PID is this process's (so made by an earlier process with that PID).
fn drop_databases_of_ended_tests(server: &str) {
    let listed = psql_scalar(
        server,
        "SELECT datname FROM pg_database WHERE datname LIKE 't\\_%\\_%'",
    );
    let me = std::process::id();
    for name in listed.lines() {
        let Some(pid) = name
            .strip_prefix("t_")
            .and_then(|rest| rest.split_once('_'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != me && Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // Another test may be sweeping the same one: IF EXISTS. FORCE ends
        // the sessions of a server that outlived its test.
        // Only disk is at stake: a failure is reported, not fatal.
        if let Err(e) = psql(
            server,
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        ) {
            eprintln!("could not drop the test database {name}: {e}");
        }
    }
}

/// A PostgreSQL cluster of a test's own (Debian's `postgresql`), on a Unix
/// socket in its temporary directory, trusting local connections: for
/// what the suite's shared server cannot show, such as the database going
/// away under a running server. Stopped and removed on drop.
pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
    /// With TLS: its TCP port on 127.0.0.1, and `hostnossl` refused.
    tls_port: Option<u16>,
    /// Whether it syncs its WAL as a production server does (off by
    /// default: the suite's clusters are thrown away).
    fsync: bool,
}

impl PgCluster {
    pub fn start() -> PgCluster {
        let cluster = Self::init();
        cluster.start_again();
        cluster
    }

    /// A cluster that syncs its WAL to disk at each commit that asks for
    /// it, as Debian's defaults do.
    pub fn start_durable() -> PgCluster {
        let mut cluster = Self::init();
        cluster.fsync = true;
        cluster.start_again();
        cluster
    }

    /// A cluster that also listens on 127.0.0.1 (a free port), serving TLS
    /// with the certificate and key files given and refusing every
    /// connection over TCP without TLS; and its port.
    pub fn start_tls(cert: &Path, key: &Path) -> (PgCluster, u16) {
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let mut cluster = Self::init();
            let data = cluster.dir.path().join("data");
            for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
                let dest = data.join(to);
                std::fs::copy(from, &dest).expect("copy a TLS file");
                std::fs::set_permissions(
                    &dest,
                    std::os::unix::fs::PermissionsExt::from_mode(0o600),
                )
                .expect("chmod");
                if Self::as_root() {
                    std::os::unix::fs::chown(&dest, Some(Self::postgres_uid()), None)
                        .expect("chown a TLS file");
                }
            }
            let hba = data.join("pg_hba.conf");
            let rules = std::fs::read_to_string(&hba).expect("pg_hba.conf");
            std::fs::write(
                &hba,
                format!("hostnossl all all 0.0.0.0/0 reject\nhostssl all all 127.0.0.1/32 trust\n{rules}"),
            )
            .expect("pg_hba.conf");
            let port = free_port();
            cluster.tls_port = Some(port);
            match cluster.try_start() {
                Ok(()) => return (cluster, port),
                Err(e) => last = e,
            }
        }
        panic!("PostgreSQL with TLS did not start: {last}");
    }

    fn init() -> PgCluster {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's programs in /usr/lib/postgresql (package postgresql; scripts/test installs it)")
            .filter_map(|e| Some(e.ok()?.path().join("bin")))
            .filter(|b| b.join("initdb").exists())
            .max()
            .expect("an initdb under /usr/lib/postgresql/*/bin");
        let dir = tempdir();
        // initdb refuses to run as root: the cluster is then the postgres
        // user's.
        if Self::as_root() {
            std::os::unix::fs::chown(dir.path(), Some(Self::postgres_uid()), None)
                .expect("chown the cluster's directory");
        }
        let cluster = PgCluster {
            dir,
            bin,
            tls_port: None,
            fsync: false,
        };
        let data = cluster.dir.path().join("data");
        cluster.run(
            "initdb",
            &[
                "-D",
                data.to_str().expect("utf-8"),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
            ],
        );
        cluster
    }

    fn as_root() -> bool {
        Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false)
    }

    fn postgres_uid() -> u32 {
        let out = Command::new("id")
            .args(["-u", "postgres"])
            .output()
            .expect("id");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("Debian's postgres user")
    }

    /// One of PostgreSQL's programs, to run as the cluster's owner.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if Self::as_root() {
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid",
                "postgres",
                "--regid",
                "postgres",
                "--init-groups",
            ])
            .arg(&path);
            c
        } else {
            Command::new(&path)
        }
    }

    /// Runs one of PostgreSQL's programs as the cluster's owner.
    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            .output()
            .expect("run a PostgreSQL program");
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@localhost/postgres?host={}",
            self.dir.path().display()
        )
    }

    /// Starts the server (again), waiting until it accepts connections.
    pub fn start_again(&self) {
        if let Err(e) = self.try_start() {
            panic!("{e}");
        }
    }

    fn try_start(&self) -> Result<(), String> {
        let d = self.dir.path().display().to_string();
        let listen = match self.tls_port {
            Some(port) => format!(
                "-c listen_addresses=127.0.0.1 -c port={port} -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key"
            ),
            None => "-c listen_addresses=''".to_owned(),
        };
        let out = self
            .command("pg_ctl")
            .args([
                "-D",
                &format!("{d}/data"),
                "-l",
                &format!("{d}/server.log"),
                "-w",
                "-o",
                &format!(
                    "{listen} -c unix_socket_directories='{d}' -c fsync={}",
                    if self.fsync { "on" } else { "off" }
                ),
                "start",
            ])
            .output()
            .expect("run pg_ctl");
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl start: {}{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(format!("{d}/server.log")).unwrap_or_default()
            ))
        }
    }

    /// Stops the server at once, as a crash or a power cut would.
    pub fn stop(&self) {
        let data = format!("{}/data", self.dir.path().display());
        self.run("pg_ctl", &["-D", &data, "-m", "immediate", "stop"]);
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = format!("{}/data", self.dir.path().display());
        let _ = self
            .command("pg_ctl")
            .args(["-D", &data, "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The `database_url` line of a test configuration for `data_dir`: none
/// on SQLite (the default file in the data directory); on PostgreSQL a
/// database of that data directory's own, the same for each
/// configuration a test writes for it (a server restarted on it).
pub fn database_url_line(data_dir: &Path) -> String {
    static MADE: Mutex<Option<HashMap<std::path::PathBuf, String>>> = Mutex::new(None);
    if !on_postgres() {
        return String::new();
    }
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    let url = made
        .get_or_insert_with(HashMap::new)
        .entry(data_dir.to_owned())
        .or_insert_with(fresh_postgres_database)
        .clone();
    format!("database_url = \"{url}\"\n")
}

/// The `allow_networks` line of the test configurations: validation may
/// reach the shared loopback listeners and this process's [`own_host`].
pub fn allow_networks_line() -> String {
    format!("allow_networks = [\"127.0.0.1\", \"{}\"]", own_host())
}

/// How many times named, given a port picked by [`free_port`], is started
/// with a fresh port when it finds the port taken.
pub const PORT_ATTEMPTS: usize = 3;

/// Whether a program's output says that its address was in use (BIND:
/// "address in use").
pub fn address_in_use(output: &str) -> bool {
    let output = output.to_ascii_lowercase();
    output.contains("address already in use") || output.contains("address in use")
}

/// A loopback port held by a bound socket that does not listen yet:
/// connections to it are refused, as by a host that is down, until the
/// socket listens (`TcpSocket::listen`). Unlike a number from
/// [`free_port`], no one else can take the port in between.
pub fn reserve_port() -> tokio::net::TcpSocket {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind a loopback port");
    socket
}

/// Fails (under CI) or skips (elsewhere) when an external program is
/// missing. Returns false when the test should skip.
pub fn require_program(name: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    required(found, name)
}

/// Like [`require_program`], for a module of Debian's Python
/// (`/usr/bin/python3`, where Debian's python3-* packages install).
pub fn require_python_module(module: &str) -> bool {
    let found = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(format!("import {module}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    required(found, &format!("the Python module {module}"))
}

/// The current certbot (5.x, from PyPI), which speaks ACME Renewal
/// Information and certificate profiles: `$ACME_PROXY_CERTBOT5`, or where
/// scripts/test installs it (`target/test-tools/certbot5`). None (after
/// failing under CI) when it is not there.
pub fn certbot5() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("ACME_PROXY_CERTBOT5")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/test-tools/certbot5/bin/certbot")
        });
    let found = Command::new(&path)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).starts_with("certbot 5."))
        .unwrap_or(false);
    required(found, "certbot 5 (from PyPI)").then_some(path)
}

/// A Python with pyacmedns (the acme-dns project's client library, from
/// PyPI): the certbot 5 virtualenv's, where scripts/test installs it. None
/// (after failing under CI) when it is not there.
pub fn acme_dns_client() -> Option<std::path::PathBuf> {
    let python = certbot5()?.with_file_name("python3");
    let found = Command::new(&python)
        .args(["-c", "import pyacmedns"])
        .output()
        .is_ok_and(|o| o.status.success());
    required(found, "pyacmedns (from PyPI, in the certbot 5 virtualenv)").then_some(python)
}

fn required(found: bool, what: &str) -> bool {
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!(
                "{what} is required by this test and is not installed (scripts/test installs it)"
            );
        }
        eprintln!("SKIPPED: {what} is not installed (run ./scripts/test, which installs it)");
    }
    found
}

/// A child process killed when dropped.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// pebble-challtestsrv as a DNS server: every A query is answered with
/// 127.0.0.1 (or this process's [`own_host`]), so any test name reaches
/// the local responders.
pub struct Dns {
    pub addr: SocketAddr,
    /// The HTTP management API (`/set-txt`, `/set-cname`, …).
    pub management: SocketAddr,
    _child: ChildGuard,
}

impl Dns {
    pub fn start() -> Option<Dns> {
        Self::start_with(
            std::net::Ipv4Addr::LOCALHOST,
            None,
            std::net::Ipv4Addr::LOCALHOST,
        )
    }

    /// Answers every name with [`own_host`], where a client's standalone
    /// server listens on an [`own_addr`].
    pub fn start_answering_own_host() -> Option<Dns> {
        Self::start_with(std::net::Ipv4Addr::LOCALHOST, None, own_host())
    }

    /// Listens for DNS on `ip:port` (port 53 on an address of its own, for
    /// a resolver configuration file, which cannot name a port: that needs
    /// root, which the suite has).
    pub fn start_at(ip: std::net::Ipv4Addr, port: u16) -> Option<Dns> {
        Self::start_with(ip, Some(port), std::net::Ipv4Addr::LOCALHOST)
    }

    /// challtestsrv must be given its ports and cannot report them: they
    /// are [`own_addr`]s (the DNS address unless `ip` and `port` are given).
    fn start_with(
        ip: std::net::Ipv4Addr,
        port: Option<u16>,
        answer: std::net::Ipv4Addr,
    ) -> Option<Dns> {
        if !require_program("pebble-challtestsrv") {
            return None;
        }
        let addr = match port {
            Some(port) => SocketAddr::from((ip, port)),
            None => own_addr(),
        };
        let management = own_addr();
        let log = tempfile::NamedTempFile::new().expect("log file");
        let child = Command::new("pebble-challtestsrv")
            .args(["-defaultIPv4", &answer.to_string(), "-defaultIPv6", ""])
            .args(["-dns01", &addr.to_string()])
            .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
            .args(["-management", &management.to_string()])
            .stdout(log.reopen().expect("log"))
            .stderr(log.reopen().expect("log"))
            .spawn()
            .expect("start pebble-challtestsrv");
        let mut guard = ChildGuard(child);
        let read_log = || std::fs::read_to_string(log.path()).unwrap_or_default();
        // Both listeners up (the DNS listener also serves TCP).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let up = [management, addr]
                .iter()
                .all(|a| TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok());
            let exited = guard.0.try_wait().expect("try_wait").is_some();
            assert!(
                !exited,
                "pebble-challtestsrv exited at start:\n{}",
                read_log()
            );
            if up {
                return Some(Dns {
                    addr,
                    management,
                    _child: guard,
                });
            }
            assert!(
                Instant::now() < deadline,
                "pebble-challtestsrv did not listen on {management} and {addr} within 10s:\n{}",
                read_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Dns {
    /// POSTs `body` to a management endpoint, e.g. `("set-txt", {"host": "_acme-challenge.a.test.", "value": "x"})`.
    pub async fn manage(&self, endpoint: &str, body: serde_json::Value) {
        let r = crate::raw::request(
            "POST",
            &format!("http://{}/{endpoint}", self.management),
            Some("application/json"),
            body.to_string().into_bytes(),
        )
        .await;
        assert_eq!(
            r.status,
            200,
            "challtestsrv /{endpoint}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }

    /// The DNS questions received for `host` (written without the trailing
    /// dot, as challtestsrv keys its history), as challtestsrv recorded them.
    pub async fn questions_for(&self, host: &str) -> Vec<serde_json::Value> {
        let r = crate::raw::request(
            "POST",
            &format!("http://{}/dns-request-history", self.management),
            Some("application/json"),
            serde_json::json!({ "host": host }).to_string().into_bytes(),
        )
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        match serde_json::from_slice(&r.body).expect("JSON") {
            serde_json::Value::Array(questions) => questions,
            serde_json::Value::Null => Vec::new(),
            other => panic!("dns-request-history: {other}"),
        }
    }

    /// Makes `host` resolve to `ip` (IPv4).
    pub async fn add_a(&self, host: &str, ip: &str) {
        self.manage(
            "add-a",
            serde_json::json!({"host": host, "addresses": [ip]}),
        )
        .await;
    }

    /// Adds a TXT record (several for one name accumulate).
    pub async fn add_txt(&self, host: &str, value: &str) {
        self.manage("set-txt", serde_json::json!({"host": host, "value": value}))
            .await;
    }
}

/// BIND (`named`) serving one zone: from records the test writes, for what
/// pebble-challtestsrv cannot express (CAA flags, real zone data), or as a
/// dynamic zone taking TSIG-signed RFC 2136 updates (the relay's dns01
/// strategy; pebble-challtestsrv does not accept updates).
pub struct Bind {
    pub addr: SocketAddr,
    _child: ChildGuard,
    dir: tempfile::TempDir,
}

impl Bind {
    /// Serves `zone` with `records` (zone-file lines relative to the
    /// origin); an SOA and NS are added.
    pub fn start(zone: &str, records: &str) -> Option<Bind> {
        Self::launch(zone, records, "", "", "")
    }

    /// Serves `zone` with `records` and, beside it, each (zone, records)
    /// of `more`: a reverse zone and the zone its PTR names point into.
    pub fn start_zones(zone: &str, records: &str, more: &[(&str, &str)]) -> Option<Bind> {
        Self::launch_zones(zone, records, "", "", "", more)
    }

    /// Serves `zone` with `records` as [`Self::start`] does, and resolves
    /// names of `delegated` by asking `server` (a forward zone: how a
    /// resolver reaches a delegated zone, short of a real parent), so that
    /// a CNAME from `zone` into `delegated` is followed to its TXT values.
    pub fn start_delegating(
        zone: &str,
        records: &str,
        delegated: &str,
        server: SocketAddr,
    ) -> Option<Bind> {
        Self::launch(
            zone,
            records,
            "",
            "",
            &format!(
                "zone \"{delegated}\" {{ type forward; forward only; forwarders {{ {} port {}; }}; }};\n",
                server.ip(),
                server.port()
            ),
        )
    }

    /// [`Self::start_delegating`], with a zone that also takes TSIG-signed
    /// updates of any record, so that a test adds a CNAME with
    /// [`Self::update`] as the DNS team would, after the server started.
    pub fn start_delegating_dynamic(
        zone: &str,
        delegated: &str,
        server: SocketAddr,
    ) -> Option<Bind> {
        let secret = tsig_secret();
        let bind = Self::launch(
            zone,
            "",
            &format!("key \"dns-team\" {{ algorithm hmac-sha256; secret \"{secret}\"; }};\n"),
            " update-policy { grant dns-team zonesub ANY; };",
            &format!(
                "zone \"{delegated}\" {{ type forward; forward only; forwarders {{ {} port {}; }}; }};\n",
                server.ip(),
                server.port()
            ),
        )?;
        // nsupdate reads the key from a file, not its command line.
        std::fs::write(
            bind.dir.path().join("update.key"),
            format!("key \"dns-team\" {{ algorithm hmac-sha256; secret \"{secret}\"; }};\n"),
        )
        .expect("the key file");
        Some(bind)
    }

    /// Sends `lines` (nsupdate's `update add …` commands) to the zone
    /// `zone` of a [`Self::start_delegating_dynamic`] server.
    pub fn update(&self, zone: &str, lines: &[String]) {
        assert!(
            require_program("nsupdate"),
            "nsupdate (package bind9-dnsutils) is needed to change BIND's zone"
        );
        let script = format!(
            "server {} {}\nzone {zone}\n{}\nsend\n",
            self.addr.ip(),
            self.addr.port(),
            lines.join("\n")
        );
        let mut child = Command::new("nsupdate")
            .arg("-k")
            .arg(self.dir.path().join("update.key"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run nsupdate");
        std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), script.as_bytes())
            .expect("nsupdate's input");
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("nsupdate");
        assert!(
            out.status.success(),
            "nsupdate {script}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// Serves `zone` as a dynamic primary zone that accepts updates of TXT
    /// records anywhere in it, signed with the TSIG key `key_name`
    /// (`algorithm` as BIND spells it, e.g. `hmac-sha256`; `secret_b64` as
    /// [`tsig_secret`] makes it). The zone starts with only its SOA and NS;
    /// named keeps the journal (`db.jnl`) in the temporary directory, which
    /// is why the zone file lives there and not in a read-only place.
    pub fn start_dynamic(
        zone: &str,
        key_name: &str,
        algorithm: &str,
        secret_b64: &str,
    ) -> Option<Bind> {
        Self::launch(
            zone,
            "",
            &format!("key \"{key_name}\" {{ algorithm {algorithm}; secret \"{secret_b64}\"; }};\n"),
            &format!(" update-policy {{ grant {key_name} zonesub TXT; }};"),
            "",
        )
    }

    /// The TXT strings served for the absolute `name` right now, one per
    /// record (a record split into several character-strings is joined), as
    /// an authoritative answer (`+norecurse`), in dig's order.
    pub fn txt(&self, name: &str) -> Vec<String> {
        assert!(
            require_program("dig"),
            "dig (package bind9-dnsutils) is needed to read BIND's answers"
        );
        let out = Command::new("dig")
            .arg(format!("@{}", self.addr.ip()))
            .args(["-p", &self.addr.port().to_string()])
            .args(["TXT", name, "+short", "+norecurse", "+time=2", "+tries=2"])
            .output()
            .expect("run dig");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "dig TXT {name}: {}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                // `"abc" "def"` → `abcdef`; ACME values are base64url, so no
                // escapes to undo.
                l.split('"')
                    .enumerate()
                    .filter(|(i, _)| i % 2 == 1)
                    .map(|(_, s)| s)
                    .collect()
            })
            .collect()
    }

    /// named's log so far, for assertion messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("named.log")).unwrap_or_default()
    }

    /// Writes the configuration (with `keys` before the zone and
    /// `zone_extra` inside its stanza) and a zone file with the SOA, NS and
    /// the name server's A record plus `records`, then starts named in the
    /// foreground and waits for its TCP listener.
    /// `forward`: forward zones; with any, named recurses (for loopback
    /// clients) to follow names into them.
    fn launch(
        zone: &str,
        records: &str,
        keys: &str,
        zone_extra: &str,
        forward: &str,
    ) -> Option<Bind> {
        Self::launch_zones(zone, records, keys, zone_extra, forward, &[])
    }

    /// [`Self::launch`], serving the primary zones `more` (name, records)
    /// beside `zone`.
    fn launch_zones(
        zone: &str,
        records: &str,
        keys: &str,
        zone_extra: &str,
        forward: &str,
        more: &[(&str, &str)],
    ) -> Option<Bind> {
        if !require_program("named") {
            return None;
        }
        // named must be given its port in named.conf and cannot report it:
        // a start that finds the port taken by a parallel test is retried
        // with a fresh one.
        let mut lost = Vec::new();
        for _ in 0..PORT_ATTEMPTS {
            match Self::launch_on(free_port(), zone, records, keys, zone_extra, forward, more) {
                Ok(bind) => return Some(bind),
                Err(log) => lost.push(log),
            }
        }
        panic!(
            "named found its port in use (taken by parallel tests between picking and binding) {PORT_ATTEMPTS} times; its logs:\n{}",
            lost.join("\n---\n")
        );
    }

    /// One start of named on `port`; its log when the port was in use.
    fn launch_on(
        port: u16,
        zone: &str,
        records: &str,
        keys: &str,
        zone_extra: &str,
        forward: &str,
        more: &[(&str, &str)],
    ) -> Result<Bind, String> {
        let dir = tempdir();
        let d = dir.path().display().to_string();
        let mut more_zones = String::new();
        for (i, (name, records)) in more.iter().enumerate() {
            std::fs::write(
                dir.path().join(format!("db{i}")),
                format!("$TTL 60\n@ IN SOA ns.{zone}. admin.{zone}. 1 60 60 600 60\n@ IN NS ns.{zone}.\n{records}\n"),
            )
            .expect("zone file");
            more_zones.push_str(&format!(
                "zone \"{name}\" {{ type primary; file \"{d}/db{i}\"; }};\n"
            ));
        }
        let recursion = if forward.is_empty() { "no" } else { "yes" };
        std::fs::write(
            dir.path().join("named.conf"),
            format!(
                "options {{ directory \"{d}\"; listen-on port {port} {{ 127.0.0.1; }}; listen-on-v6 {{ none; }};\n  pid-file \"{d}/named.pid\"; recursion {recursion}; dnssec-validation no; }};\ncontrols {{ }};\n{keys}zone \"{zone}\" {{ type primary; file \"{d}/db\";{zone_extra} }};\n{more_zones}{forward}"
            ),
        )
        .expect("named.conf");
        std::fs::write(
            dir.path().join("db"),
            format!("$TTL 60\n@ IN SOA ns.{zone}. admin.{zone}. 1 60 60 600 60\n@ IN NS ns.{zone}.\nns IN A 127.0.0.1\n{records}\n"),
        )
        .expect("zone file");
        let child = Command::new("named")
            .args(["-g", "-c"])
            .arg(dir.path().join("named.conf"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("named.log")).expect("log"))
            .spawn()
            .expect("start named");
        let mut guard = ChildGuard(child);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = || std::fs::read_to_string(dir.path().join("named.log")).unwrap_or_default();
        // Listening, and on its own port: named logs a port it could not
        // bind (and may run on without it), while a connection would reach
        // whoever holds the port; a line ending "running" ends its start-up.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let text = log();
            if address_in_use(&text) {
                return Err(text);
            }
            assert!(
                guard.0.try_wait().expect("try_wait").is_none(),
                "named exited at start:\n{text}"
            );
            if text.lines().any(|l| l.trim_end().ends_with(" running"))
                && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(Bind {
                    addr,
                    _child: guard,
                    dir,
                });
            }
            assert!(
                Instant::now() < deadline,
                "named did not listen on {addr} within 15s:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Debian's HAProxy on `front`, in HTTP mode, logging each request to
/// `dir/haproxy.log` (as `BACKEND/SERVER` among its words), sending
/// everything to the backend named `backend` whose lines (servers,
/// balancing, health checks) are `lines`; once it listens.
pub fn start_haproxy(dir: &Path, front: SocketAddr, backend: &str, lines: &str) -> ChildGuard {
    assert!(
        require_program("haproxy"),
        "haproxy is not installed (scripts/test installs Debian's)"
    );
    let config = format!(
        "global\n    log stdout format raw local0 info\n\n\
         defaults\n    mode http\n    log global\n    option httplog\n    \
         timeout connect 2s\n    timeout client 60s\n    timeout server 60s\n\n\
         frontend acme\n    bind {front}\n    default_backend {backend}\n\n\
         backend {backend}\n{lines}"
    );
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, config).expect("write haproxy.cfg");
    let log = std::fs::File::create(dir.join("haproxy.log")).expect("log file");
    let child = Command::new("haproxy")
        .arg("-db")
        .arg("-f")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn()
        .expect("start haproxy");
    let mut guard = ChildGuard(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect_timeout(&front, Duration::from_millis(200)).is_err() {
        if let Ok(Some(status)) = guard.0.try_wait() {
            panic!(
                "haproxy exited ({status}):\n{}",
                std::fs::read_to_string(dir.join("haproxy.log")).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "haproxy did not listen on {front}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    guard
}

/// A fresh TSIG secret: 32 random bytes in standard base64, the form
/// `tsig-keygen -a hmac-sha256` prints and `nsupdate -y` takes.
pub fn tsig_secret() -> String {
    use base64::Engine;
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("random bytes");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// An http-01 responder: serves `/.well-known/acme-challenge/{token}` from a
/// map the test fills, or redirects a token elsewhere. It can be told to
/// hang the next requests (hold the connection without answering), and
/// counts the requests it got.
#[derive(Clone)]
pub struct Responder {
    pub port: u16,
    tokens: Arc<Mutex<HashMap<String, String>>>,
    redirects: Arc<Mutex<HashMap<String, String>>>,
    hang_next: Arc<std::sync::atomic::AtomicUsize>,
    hits: Arc<std::sync::atomic::AtomicUsize>,
}

impl Responder {
    pub async fn start() -> Responder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        Self::serve(listener)
    }

    /// A responder on `ip` at `port` (another loopback address beside the
    /// first responder's, on its port).
    pub async fn start_at(ip: std::net::IpAddr, port: u16) -> Responder {
        let listener = tokio::net::TcpListener::bind((ip, port))
            .await
            .unwrap_or_else(|e| panic!("bind {ip}:{port}: {e}"));
        Self::serve(listener)
    }

    fn serve(listener: tokio::net::TcpListener) -> Responder {
        use std::sync::atomic::{AtomicUsize, Ordering};
        type Map = Arc<Mutex<HashMap<String, String>>>;
        type St = (Map, Map, Arc<AtomicUsize>, Arc<AtomicUsize>);
        let tokens: Map = Arc::default();
        let redirects: Map = Arc::default();
        let hang_next: Arc<AtomicUsize> = Arc::default();
        let hits: Arc<AtomicUsize> = Arc::default();
        let port = listener.local_addr().expect("addr").port();
        let app = axum::Router::new()
            .route(
                "/.well-known/acme-challenge/{token}",
                get(
                    |State((t, redirects, hang, hits)): State<St>,
                     AxPath(token): AxPath<String>| async move {
                        hits.fetch_add(1, Ordering::SeqCst);
                        if hang
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok()
                        {
                            // Hold the connection like a host that never answers.
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                        }
                        let mut headers = http::HeaderMap::new();
                        if let Some(to) = redirects.lock().expect("lock").get(&token) {
                            headers.insert(
                                http::header::LOCATION,
                                to.parse().expect("a Location value"),
                            );
                            return (http::StatusCode::FOUND, headers, String::new());
                        }
                        match t.lock().expect("lock").get(&token) {
                            Some(v) => (http::StatusCode::OK, headers, v.clone()),
                            None => (http::StatusCode::NOT_FOUND, headers, String::new()),
                        }
                    },
                ),
            )
            .with_state((
                Arc::clone(&tokens),
                Arc::clone(&redirects),
                Arc::clone(&hang_next),
                Arc::clone(&hits),
            ));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Responder {
            port,
            tokens,
            redirects,
            hang_next,
            hits,
        }
    }

    /// Answers `token` with a 302 to `location`.
    pub fn redirect(&self, token: &str, location: &str) {
        self.redirects
            .lock()
            .expect("lock")
            .insert(token.to_owned(), location.to_owned());
    }

    /// The next `n` requests hang instead of answering.
    pub fn hang_next(&self, n: usize) {
        self.hang_next.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Requests received so far.
    pub fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn publish(&self, token: &str, key_authorization: &str) {
        self.tokens
            .lock()
            .expect("lock")
            .insert(token.to_owned(), key_authorization.to_owned());
    }
}

/// An acme-proxy started in this process.
pub struct TestServer {
    pub running: Option<Running>,
    /// Holds the data directory until the server is dropped.
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// Starts a server whose http-01 validation goes to `http_port` and
    /// resolves names through `dns`; `extra` is appended to the config.
    pub async fn start(http_port: u16, dns: Option<&Dns>, extra: &str) -> TestServer {
        let dir = tempdir();
        let toml = Self::config_text(dir.path(), http_port, dns, extra);
        Self::start_in(dir, &toml).await
    }

    /// Starts a server from complete configuration text; `{data_dir}` in it
    /// is replaced by a fresh temporary directory.
    pub async fn start_with_toml(toml: &str) -> TestServer {
        let dir = tempdir();
        let toml = toml.replace("{data_dir}", &dir.path().display().to_string());
        Self::start_in(dir, &toml).await
    }

    pub async fn start_in(dir: tempfile::TempDir, toml: &str) -> TestServer {
        Self::start_in_with(dir, toml, Default::default()).await
    }

    /// [`Self::start`], with signers plugged in by profile name
    /// (`server::start_with`).
    pub async fn start_plugged(
        http_port: u16,
        extra: &str,
        plugged: acme_proxy::server::Signers,
    ) -> TestServer {
        let dir = tempdir();
        let toml = Self::config_text(dir.path(), http_port, None, extra);
        Self::start_in_with(dir, &toml, plugged).await
    }

    pub async fn start_in_with(
        dir: tempfile::TempDir,
        toml: &str,
        plugged: acme_proxy::server::Signers,
    ) -> TestServer {
        Self::start_in_on(dir, toml, plugged, Arc::new(SystemClock)).await
    }

    /// [`Self::start_in_with`] on `clock`.
    pub async fn start_in_on(
        dir: tempfile::TempDir,
        toml: &str,
        plugged: acme_proxy::server::Signers,
        clock: acme_proxy::clock::SharedClock,
    ) -> TestServer {
        let config = Config::from_toml(toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let running = acme_proxy::server::start_with(config, clock, plugged)
            .await
            .expect("server starts");
        TestServer {
            running: Some(running),
            _dir: dir,
        }
    }

    pub fn config_text(data_dir: &Path, http_port: u16, dns: Option<&Dns>, extra: &str) -> String {
        let resolvers = dns
            .map(|d| format!("dns_resolvers = [\"{}\"]", d.addr))
            .unwrap_or_default();
        let profiles = if extra.contains("[profiles.") {
            String::new()
        } else {
            "[profiles.default]\n".to_owned()
        };
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n{database}\n[validation]\nhttp_port = {http_port}\ntimeout = \"5s\"\n# The test responders listen on loopback, refused by default.\n{allow}\n{resolvers}\n\n{profiles}{extra}\n",
            data_dir.display(),
            allow = allow_networks_line(),
            database = database_url_line(data_dir)
        )
    }

    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("running")
    }

    pub fn directory(&self, profile: &str) -> String {
        self.running().directory_url(profile)
    }

    pub fn base(&self) -> &str {
        &self.running().base_url
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown(Duration::from_secs(5)).await;
        }
    }
}

/// The path of the built `acme-proxy` binary.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_acme-proxy")
}

/// Writes `toml` to `acme-proxy.toml` in a directory of its own, for the
/// operator commands run beside a test's server; returns the directory
/// (keep it alive) and the file.
pub fn config_file(toml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let etc = tempdir();
    let path = etc.path().join("acme-proxy.toml");
    std::fs::write(&path, toml).expect("write the configuration");
    (etc, path)
}

/// A command that runs the `acme-proxy` binary under `umask 022` (through
/// `sh`, which sets it and then replaces itself with the binary); add the
/// arguments.
pub fn under_umask_022() -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "umask 022 && exec \"$0\" \"$@\"", binary()]);
    cmd
}

/// Every file and directory under `root` whose mode is not 0600 (files)
/// or 0700 (directories), with its mode; `root` itself included.
pub fn not_private(root: &Path) -> Vec<(std::path::PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut found = Vec::new();
    let mut todo = vec![root.to_owned()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        let mode = meta.permissions().mode() & 0o777;
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).expect("read_dir") {
                todo.push(entry.expect("entry").path());
            }
        }
        let want = if meta.is_dir() { 0o700 } else { 0o600 };
        if mode != want {
            found.push((path, mode));
        }
    }
    found
}

/// What one run of an operator command printed, and its exit code.
#[derive(Debug)]
pub struct CliOutput {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `acme-proxy ARGS --config CONFIG` to completion with stdin closed
/// (not a terminal), as a script would.
pub fn run_cli(config: &Path, args: &[&str], env: &[(&str, &str)]) -> CliOutput {
    let out = Command::new(binary())
        .args(args)
        .arg("--config")
        .arg(config)
        .env_remove("ACME_PROXY_CONFIG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run acme-proxy");
    CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Starts the `acme-proxy` binary with `args` in `cwd`, with extra
/// environment, and waits until it prints its directory URL. Returns the
/// guard and that URL. Its log (stderr) goes to `cwd/acme-proxy.log`. It
/// runs under `umask 022`, the usual default, so that the modes of the
/// files it makes are its own choice, not the test runner's umask.
pub fn spawn_binary(cwd: &Path, args: &[&str], env: &[(&str, String)]) -> (ChildGuard, String) {
    let mut cmd = under_umask_022();
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("ACME_PROXY_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    spawn_serving(cmd, &cwd.join("acme-proxy.log"))
}

/// Spawns `cmd` (an `acme-proxy serve`), its stderr into the file `log`,
/// and waits for the default profile's directory URL it prints.
pub fn spawn_serving(cmd: Command, log: &Path) -> (ChildGuard, String) {
    let (guard, printed) = spawn_serving_printed(cmd, log);
    let url = printed
        .iter()
        .find_map(|line| line.split("ACME directory (default): ").nth(1))
        .expect("the directory line")
        .trim()
        .to_owned();
    (guard, url)
}

/// [`spawn_serving`], returning every line printed up to the default
/// profile's directory URL (the listeners' addresses among them).
pub fn spawn_serving_printed(mut cmd: Command, log: &Path) -> (ChildGuard, Vec<String>) {
    use std::io::{BufRead, BufReader};
    cmd.stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).expect("log file"));
    let mut child = cmd.spawn().expect("spawn acme-proxy");
    let stdout = child.stdout.take().expect("stdout");
    let guard = ChildGuard(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut printed = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let last = line.contains("ACME directory (default): ");
            printed.push(line);
            if last {
                let _ = tx.send(std::mem::take(&mut printed));
            }
        }
    });
    let printed = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| {
            panic!(
                "acme-proxy printed no directory URL ({e}); its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
    (guard, printed)
}

/// A webhook receiver: records every request (headers and body) and
/// answers with the status it is told to (200 by default).
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    got: Arc<Mutex<Vec<Received>>>,
    status: Arc<std::sync::atomic::AtomicU16>,
    /// Requests still to be answered 503 before `status` applies.
    unavailable: Arc<std::sync::atomic::AtomicUsize>,
    /// Hold every request without answering.
    hang: Arc<std::sync::atomic::AtomicBool>,
}

/// One request a [`Receiver`] got.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: serde_json::Value,
}

impl Receiver {
    /// Listens on a port of its own.
    pub async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the receiver");
        Self::serve(listener)
    }

    /// Listens on a port held since [`reserve_port`] (a receiver that was
    /// down comes up).
    pub fn start_reserved(socket: tokio::net::TcpSocket) -> Receiver {
        Self::serve(socket.listen(1024).expect("listen"))
    }

    fn serve(listener: tokio::net::TcpListener) -> Receiver {
        use axum::body::Bytes;
        use axum::http::{HeaderMap, StatusCode, Uri};
        type St = (
            Arc<Mutex<Vec<Received>>>,
            Arc<std::sync::atomic::AtomicU16>,
            Arc<std::sync::atomic::AtomicUsize>,
            Arc<std::sync::atomic::AtomicBool>,
        );
        async fn record(
            State((got, status, unavailable, hang)): State<St>,
            uri: Uri,
            headers: HeaderMap,
            body: Bytes,
        ) -> StatusCode {
            got.lock().expect("lock").push(Received {
                path: uri.path().to_owned(),
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                    .collect(),
                body: serde_json::from_slice(&body).unwrap_or_else(|_| {
                    serde_json::Value::String(String::from_utf8_lossy(&body).into_owned())
                }),
            });
            if hang.load(std::sync::atomic::Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            let before = unavailable.fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            );
            if before.is_ok() {
                return StatusCode::SERVICE_UNAVAILABLE;
            }
            StatusCode::from_u16(status.load(std::sync::atomic::Ordering::SeqCst))
                .unwrap_or(StatusCode::OK)
        }
        let got = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(std::sync::atomic::AtomicU16::new(200));
        let unavailable = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let hang = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let app = axum::Router::new().fallback(record).with_state((
            Arc::clone(&got),
            Arc::clone(&status),
            Arc::clone(&unavailable),
            Arc::clone(&hang),
        ));
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            addr,
            got,
            status,
            unavailable,
            hang,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Answer every later request with `status`.
    pub fn answer(&self, status: u16) {
        self.status
            .store(status, std::sync::atomic::Ordering::SeqCst);
    }

    /// Answer the next `n` requests 503 (each still recorded).
    pub fn unavailable_for(&self, n: usize) {
        self.unavailable
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Hold every later request without answering.
    pub fn hang(&self) {
        self.hang.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn received(&self) -> Vec<Received> {
        self.got.lock().expect("lock").clone()
    }

    /// Waits until `pred` holds for what was received, or panics.
    pub async fn wait_for(&self, what: &str, within: Duration, pred: impl Fn(&[Received]) -> bool) {
        let deadline = Instant::now() + within;
        loop {
            let got = self.received();
            if pred(&got) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what} not received within {within:?}; got {got:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
