//! The `ipam` policy check against a real NetBox (the `netbox` package
//! from PyPI, which scripts/test installs under target/test-tools/netbox,
//! on the suite's PostgreSQL and a Redis of its own), populated through
//! its REST API. Client addresses in 10.20.0.0/24 come through HAProxy
//! (Debian's) as a trusted proxy's `X-Forwarded-For`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::clients::{leaf, lego_http_run, run};
use crate::harness::{self, ChildGuard, Dns, TestServer};
use crate::raw::{self, Acct, Key, Resp};

/// A NetBox of this test's own: its configuration module, Redis and
/// database in temporary places, served by Django's server on `addr`.
/// (Fields drop in order: the processes before their directory.)
struct NetBox {
    server: Option<ChildGuard>,
    _redis: ChildGuard,
    venv: PathBuf,
    addr: SocketAddr,
    /// `nbt_KEY.TOKEN`, a superuser's v2 API token.
    token: String,
    root: tempfile::TempDir,
}

/// Where scripts/test installs NetBox (it needs Python 3.12 or later,
/// which Debian 12 does not have), or the virtualenv `TEST_NETBOX_VENV`
/// names.
fn netbox_venv() -> Option<PathBuf> {
    let venv = std::env::var_os("TEST_NETBOX_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-tools/netbox")
        });
    let found = Command::new(venv.join("bin/netbox"))
        .arg("version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).starts_with("4."))
        .unwrap_or(false);
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "NetBox 4 (from PyPI) is required by this test and is not installed at {} (scripts/test installs it)",
            venv.display()
        );
        eprintln!("SKIPPED: NetBox is not installed (run ./scripts/test, which installs it)");
        return None;
    }
    Some(venv)
}

/// The parts of a `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?host=DIR]`
/// URL that Django's settings take.
fn django_database(url: &str) -> String {
    let rest = url.strip_prefix("postgres://").expect("a postgres:// URL");
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (userinfo, rest) = rest.split_once('@').expect("USER@HOST");
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let (hostport, name) = rest.split_once('/').expect("HOST/DATABASE");
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, ""));
    let socket_dir = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("host="))
        .unwrap_or(host);
    format!(
        "{{'default': {{'ENGINE': 'django.db.backends.postgresql', 'NAME': '{name}', 'USER': '{user}', \
         'PASSWORD': '{password}', 'HOST': '{socket_dir}', 'PORT': '{port}'}}}}"
    )
}

/// The URL of a database for this test's NetBox. NetBox's migrations take
/// ten minutes or more of one core (Django renders its model states again
/// for each of several hundred), so a full run of scripts/test migrates one
/// database, `netbox_migrated`, in the background from its start, beside
/// its builds and its first run, and says so in `TEST_NETBOX_MIGRATED`:
/// a directory whose `status` becomes `ok` or `failed` (its output in
/// `migrate.log`). This waits for it and copies that database. Without
/// the variable, an empty database, which [`NetBox::start`]'s `migrate`
/// fills.
fn netbox_database() -> String {
    let Some(dir) = std::env::var_os("TEST_NETBOX_MIGRATED").map(PathBuf::from) else {
        return harness::fresh_postgres_database();
    };
    let deadline = Instant::now() + Duration::from_secs(15 * 60);
    loop {
        match std::fs::read_to_string(dir.join("status")) {
            Ok(status) if status.trim() == "ok" => {
                return harness::postgres_database_copying(Some("netbox_migrated"));
            }
            Ok(status) => panic!(
                "scripts/test's migration of NetBox ended {}:\n{}",
                status.trim(),
                std::fs::read_to_string(dir.join("migrate.log")).unwrap_or_default()
            ),
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "scripts/test's migration of NetBox did not end within 15 minutes (its output: {})",
            dir.join("migrate.log").display()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

impl NetBox {
    /// Configures, migrates (nothing left to do on a copy of
    /// [`netbox_database`]'s, ten minutes or more otherwise), makes a
    /// superuser's token and serves NetBox.
    fn start() -> Option<NetBox> {
        let venv = netbox_venv()?;
        assert!(
            harness::require_program("redis-server"),
            "redis-server is not installed (scripts/test installs Debian's)"
        );
        let root = harness::tempdir();
        let socket = root.path().join("redis.sock");
        let redis = Command::new("redis-server")
            .args(["--port", "0", "--save", "", "--appendonly", "no"])
            .arg("--unixsocket")
            .arg(&socket)
            .arg("--dir")
            .arg(root.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let redis = ChildGuard(redis);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "redis-server made no socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        let secret = |n: usize| -> String {
            let mut s = String::new();
            while s.len() < n {
                s.push_str(&harness::tsig_secret().replace(['+', '/', '='], "x"));
            }
            s
        };
        std::fs::create_dir_all(root.path().join("conf")).expect("conf");
        std::fs::write(
            root.path().join("conf/configuration.py"),
            format!(
                "ALLOWED_HOSTS = ['*']\nDATABASES = {}\n\
                 REDIS = {{'tasks': {{'URL': 'unix://{sock}?db=0'}}, 'caching': {{'URL': 'unix://{sock}?db=1'}}}}\n\
                 SECRET_KEY = '{}'\nAPI_TOKEN_PEPPERS = {{1: '{}'}}\n",
                django_database(&netbox_database()),
                secret(60),
                secret(60),
                sock = socket.display(),
            ),
        )
        .expect("configuration.py");
        let mut netbox = NetBox {
            addr: harness::own_addr(),
            root,
            venv,
            token: String::new(),
            server: None,
            _redis: redis,
        };
        let started = Instant::now();
        netbox.manage(&["migrate", "--no-input"]);
        eprintln!("NetBox migrated in {:.0?}", started.elapsed());
        let out = netbox.manage(&[
            "shell",
            "-c",
            "from users.models import User, Token\n\
             u = User.objects.create_superuser('acme', 'acme@lab.test', 'not-used-1234')\n\
             t = Token(user=u)\n\
             t.save()\n\
             print('HEADER=' + t.get_auth_header_prefix() + t.token)",
        ]);
        netbox.token = out
            .lines()
            .find_map(|l| l.strip_prefix("HEADER=Bearer "))
            .unwrap_or_else(|| panic!("no v2 token printed:\n{out}"))
            .to_owned();
        netbox.serve();
        Some(netbox)
    }

    /// A management command; its output, or a panic with it.
    fn manage(&self, args: &[&str]) -> String {
        let out = Command::new(self.venv.join("bin/netbox"))
            .args(args)
            .env("NETBOX_ROOT", self.root.path())
            .current_dir(self.root.path())
            .output()
            .expect("run netbox");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "netbox {args:?}:\n{text}");
        text
    }

    /// Serves the API on `addr` (again, after [`Self::stop`]) and waits
    /// until it answers an authenticated request (Django loads most of
    /// NetBox on the first one, which can take longer than the check's
    /// timeout).
    fn serve(&mut self) {
        let log = std::fs::File::create(self.root.path().join("server.log")).expect("log");
        let child = Command::new(self.venv.join("bin/netbox"))
            .args(["runserver", "--noreload", &self.addr.to_string()])
            .env("NETBOX_ROOT", self.root.path())
            .current_dir(self.root.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start netbox runserver");
        self.server = Some(ChildGuard(child));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.status("/api/ipam/ip-addresses/?limit=1") == Some(200) {
                return;
            }
            if let Some(Ok(Some(status))) = self.server.as_mut().map(|s| s.0.try_wait()) {
                panic!("NetBox exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "NetBox did not listen within 60 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The status of an authenticated HTTP/1.0 GET of `path` (blocking),
    /// or None when nothing answered.
    fn status(&self, path: &str) -> Option<u16> {
        use std::io::{Read, Write};
        let mut stream =
            std::net::TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\r\n",
            self.addr, self.token
        )
        .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        answer.split_whitespace().nth(1)?.parse().ok()
    }

    /// Stops serving (SIGKILL: connections are refused at once).
    fn stop(&mut self) {
        drop(self.server.take());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.root.path().join("server.log")).unwrap_or_default()
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Creates an object through the REST API; its JSON.
    async fn create(&self, path: &str, body: Value) -> Value {
        let auth = format!("Bearer {}", self.token);
        let r = raw::request_with(
            "POST",
            &format!("{}/api/{path}", self.url()),
            &[
                ("content-type", "application/json"),
                ("accept", "application/json"),
                ("authorization", &auth),
            ],
            body.to_string().into_bytes(),
        )
        .await;
        assert_eq!(
            r.status,
            201,
            "POST /api/{path} {body}: {}\n{}",
            String::from_utf8_lossy(&r.body),
            self.log()
        );
        r.json()
    }
}

/// A signed POST that a client at `client` sends through the proxy (which
/// keeps an `X-Forwarded-For` it is given).
async fn post_from(
    client: &str,
    acct: &Acct,
    dir: &Value,
    url: &str,
    payload: Option<&Value>,
) -> Resp {
    let protected =
        json!({"alg": acct.key.alg(), "kid": acct.url, "nonce": raw::nonce(dir).await, "url": url});
    raw::request_with(
        "POST",
        url,
        &[
            ("content-type", "application/jose+json"),
            ("x-forwarded-for", client),
        ],
        acct.key.sign(&protected, payload).to_string().into_bytes(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn netbox_gives_a_host_its_own_name_refuses_another_hosts_and_is_undecided_while_down() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("lego") || !harness::require_program("haproxy") {
        return;
    }
    let Some(mut netbox) = tokio::task::spawn_blocking(NetBox::start)
        .await
        .expect("NetBox started")
    else {
        return;
    };
    // host1 and host2 are addresses on their own; host3 is on a virtual
    // machine's interface.
    netbox
        .create(
            "ipam/ip-addresses/",
            json!({"address": "10.20.0.5/24", "dns_name": "host1.lab.test", "status": "active"}),
        )
        .await;
    netbox
        .create(
            "ipam/ip-addresses/",
            json!({"address": "10.20.0.6/24", "dns_name": "host2.lab.test", "status": "active"}),
        )
        .await;
    let site = netbox
        .create("dcim/sites/", json!({"name": "lab", "slug": "lab"}))
        .await;
    let vm = netbox
        .create(
            "virtualization/virtual-machines/",
            json!({"name": "host3", "site": site["id"]}),
        )
        .await;
    let eth0 = netbox
        .create(
            "virtualization/interfaces/",
            json!({"virtual_machine": vm["id"], "name": "eth0"}),
        )
        .await;
    netbox
        .create(
            "ipam/ip-addresses/",
            json!({
                "address": "10.20.0.7/24",
                "dns_name": "host3.lab.test",
                "assigned_object_type": "virtualization.vminterface",
                "assigned_object_id": eth0["id"],
            }),
        )
        .await;

    let etc = harness::tempdir();
    let token_file = etc.path().join("netbox-token");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token_file)
            .expect("token file");
        writeln!(f, "{}", netbox.token).expect("write token");
    }
    let at = harness::own_addr();
    let front = harness::own_addr();
    let listen = harness::own_addr();
    let data = harness::tempdir();
    // Every answer asked afresh (`cache_for = "0s"`), so that what NetBox
    // says at each step is what the server does; the cache has unit tests.
    let toml = TestServer::config_text(
        data.path(),
        at.port(),
        Some(&dns),
        &format!(
            r#"
[profiles.default]

[profiles.lab]
bypass = true

[policy.checks.netbox]
type = "ipam"
source = "netbox"
url = "{}"
token_file = "{}"
timeout = "10s"
cache_for = "0s"

[[policy.rules]]
name = "own-names-only"
when = "not netbox"
then = "deny"
message = "NetBox does not give this name to your address"
"#,
            netbox.url(),
            token_file.display()
        ),
    )
    .replacen(
        "listen = \"127.0.0.1:0\"",
        &format!(
            "public_url = \"http://{front}\"\ntrusted_proxies = [\"127.0.0.0/8\"]\nlisten = \"{listen}\""
        ),
        1,
    )
    .replacen("timeout = \"5s\"", "timeout = \"10s\"", 1);
    let (_conf, config) = harness::config_file(&toml);
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    // The lab's proxy: lego's requests are from host1 (10.20.0.5); the
    // test's own carry the address they are from, which it keeps.
    let _haproxy = harness::start_haproxy(
        etc.path(),
        front,
        "server",
        &format!(
            "    http-request set-header X-Forwarded-For 10.20.0.5 unless {{ req.hdr(x-forwarded-for) -m found }}\n    server s {listen}\n"
        ),
    );
    let directory = format!("http://{front}/profile/default/directory");
    let explain = |client: &str, name: &str| {
        harness::run_cli(
            &config,
            &[
                "policy",
                "explain",
                "--profile",
                "default",
                "--client-ip",
                client,
                "--identifier",
                name,
            ],
            &[],
        )
    };

    // host1 asks for its own name: issued.
    let home = harness::tempdir();
    let ran = run(
        "lego",
        lego_http_run(&directory, home.path(), at, "host1.lab.test"),
        home.path().to_path_buf(),
    )
    .await;
    assert!(ran.success(), "lego as host1\n{}", ran.report());
    let cert = leaf(
        &home.path().join("certificates/host1.lab.test.crt"),
        &|| ran.report(),
    );
    assert_eq!(cert.sans, vec!["host1.lab.test".to_owned()]);
    let out = explain("10.20.0.5", "host1.lab.test");
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains(
            "new_order host1.lab.test: allow (rule default)\n  rule  own-names-only = false\n  check netbox = true (NetBox: host1.lab.test is 10.20.0.5/24 (active))"
        ) && out.stdout.ends_with("decision: allowed\n"),
        "{}",
        out.stdout
    );

    // host1 asks for host2's name: refused with the rule's message.
    let other = harness::tempdir();
    let ran = run(
        "lego",
        lego_http_run(&directory, other.path(), at, "host2.lab.test"),
        other.path().to_path_buf(),
    )
    .await;
    assert!(
        !ran.success(),
        "lego as host1 got host2's name\n{}",
        ran.report()
    );
    let said = ran.report();
    assert!(
        said.contains("rejectedIdentifier")
            && said.contains("NetBox does not give this name to your address"),
        "lego reports the refusal\n{said}"
    );
    let store = server.running().authority().store().clone();
    let rows = store
        .audit_recent(Some("order.refused"), 1)
        .await
        .expect("audit");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].client_ip.as_deref(), Some("10.20.0.5"));
    let refusal = "host2.lab.test: policy deny at new_order: rule own-names-only; checks: netbox=false (NetBox gives host2.lab.test to 10.20.0.6/24, not to 10.20.0.5)";
    assert!(
        rows[0]
            .detail
            .as_deref()
            .is_some_and(|d| d.contains(refusal)),
        "{:?}",
        rows[0].detail
    );
    let out = explain("10.20.0.5", "host2.lab.test");
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains(
            "new_order host2.lab.test: deny: NetBox does not give this name to your address (rule own-names-only)\n  rule  own-names-only = true\n  check netbox = false (NetBox gives host2.lab.test to 10.20.0.6/24, not to 10.20.0.5)"
        ) && out.stdout.ends_with("decision: refused\n"),
        "{}",
        out.stdout
    );

    // host3 (an interface address of a virtual machine) orders its name
    // on the bypass profile; the order is ready.
    let lab: Value = raw::directory(&format!("http://{front}/profile/lab/directory")).await;
    let host3 = Acct::create(&lab, Key::p256()).await;
    let r = post_from(
        "10.20.0.7",
        &host3,
        &lab,
        lab["newOrder"].as_str().expect("newOrder"),
        Some(&json!({"identifiers": [{"type": "dns", "value": "host3.lab.test"}]})),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let order_url = r.location().expect("order URL");
    let finalize = r.json()["finalize"].as_str().expect("finalize").to_owned();
    for authz in r.json()["authorizations"]
        .as_array()
        .expect("authorizations")
    {
        let authz = host3
            .post(&lab, authz.as_str().expect("URL"), None)
            .await
            .json();
        let challenge = authz["challenges"][0]["url"].as_str().expect("challenge");
        let r = host3.post(&lab, challenge, Some(&json!({}))).await;
        assert_eq!(r.json()["status"], "valid", "bypass");
    }
    let csr = json!({"csr": crate::concurrency::csr_for("host3.lab.test")});

    // NetBox down: undecided, 503 with Retry-After, audited; the order
    // stays ready, and no order is made for a new request.
    netbox.stop();
    let r = post_from("10.20.0.7", &host3, &lab, &finalize, Some(&csr)).await;
    r.assert_refused(503, "serverInternal", "finalize while NetBox is down");
    assert!(r.headers.get("retry-after").is_some(), "{:?}", r.headers);
    let order = host3.post(&lab, &order_url, None).await.json();
    assert_eq!(order["status"], "ready", "{order}");
    let new_order = json!({"identifiers": [{"type": "dns", "value": "host3.lab.test"}]});
    let r = post_from(
        "10.20.0.7",
        &host3,
        &lab,
        lab["newOrder"].as_str().expect("newOrder"),
        Some(&new_order),
    )
    .await;
    r.assert_refused(503, "serverInternal", "newOrder while NetBox is down");
    assert!(r.headers.get("retry-after").is_some(), "{:?}", r.headers);
    let rows = store
        .audit_recent(Some("order.refused"), 1)
        .await
        .expect("audit");
    assert_eq!(rows[0].outcome, "failure");
    assert_eq!(rows[0].client_ip.as_deref(), Some("10.20.0.7"));
    let detail = rows[0].detail.clone().unwrap_or_default();
    assert!(
        detail.contains("host3.lab.test: policy undecided at new_order: rule own-names-only; checks: netbox=undecided (NetBox at http://"),
        "{detail}"
    );
    let out = explain("10.20.0.7", "host3.lab.test");
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("new_order host3.lab.test: undecided: ")
            && out
                .stdout
                .contains("  check netbox = undecided (NetBox at http://")
            && out.stdout.ends_with("decision: undecided\n"),
        "{}",
        out.stdout
    );
    let metrics = server.running().authority().render_metrics().await;
    for line in [
        "acme_proxy_policy_decisions_total{stage=\"new_order\",rule=\"own-names-only\",decision=\"deny\"} 1",
        "acme_proxy_policy_decisions_total{stage=\"new_order\",rule=\"own-names-only\",decision=\"undecided\"} 1",
        "acme_proxy_policy_decisions_total{stage=\"finalize\",rule=\"own-names-only\",decision=\"undecided\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }

    // NetBox back: the same requests pass.
    let _netbox = tokio::task::spawn_blocking(move || {
        netbox.serve();
        netbox
    })
    .await
    .expect("NetBox restarted");
    let r = post_from("10.20.0.7", &host3, &lab, &finalize, Some(&csr)).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["status"], "valid");
    let r = post_from(
        "10.20.0.7",
        &host3,
        &lab,
        lab["newOrder"].as_str().expect("newOrder"),
        Some(&new_order),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    server.stop().await;
}
