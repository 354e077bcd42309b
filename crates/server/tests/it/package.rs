//! The Debian package as an operator installs it. `scripts/package` builds
//! it from the suite's own build of the binary, `dpkg -i` installs it on
//! this machine, and `systemd-analyze verify` accepts its unit. Then the
//! unit's ExecStart runs without systemd, the way systemd would run it: as a
//! transient unprivileged user (DynamicUser), in its state directory
//! (WorkingDirectory), under its umask, with the configuration handed over
//! as a credential (LoadCredential). certbot obtains a certificate from the
//! installed binary. The package is purged at the end.
//!
//! As in `zero_config`, only what a shared test machine needs is
//! overridden, through the environment: the listener's port, the http-01
//! port, the DNS server and the loopback address allowed to validation.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::clients::{certbot_certonly_standalone, certbot_log_tail, leaf, run};
use crate::harness::{self, Dns, not_private};

/// Where DynamicUser takes its users from (61184–65519): a uid no file on
/// the machine belongs to.
const TRANSIENT_UID: u32 = 61_873;

/// Runs `program` as root: directly when we are root, through `sudo -n`
/// otherwise.
fn as_root(program: &str) -> Command {
    if rustix::process::geteuid().is_root() {
        Command::new(program)
    } else {
        let mut sudo = Command::new("sudo");
        sudo.args(["-n", program]);
        sudo
    }
}

fn output(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Purges the package when dropped, however the test ends.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = as_root("dpkg")
            .args(["--purge", "acme-proxy"])
            .stdout(Stdio::null())
            .status();
    }
}

/// The `[Service]` settings of a unit file: name → values in order.
fn service_section(unit: &str) -> HashMap<String, Vec<String>> {
    let mut settings: HashMap<String, Vec<String>> = HashMap::new();
    let mut in_service = false;
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service
            && !line.starts_with('#')
            && let Some((k, v)) = line.split_once('=')
        {
            settings.entry(k.to_owned()).or_default().push(v.to_owned());
        }
    }
    settings
}

/// A directory of the transient user only, as systemd makes the state
/// directory (`StateDirectoryMode=0700`) and the credentials directory.
fn owned_by_transient_user(dir: &Path) {
    std::os::unix::fs::chown(dir, Some(TRANSIENT_UID), Some(TRANSIENT_UID)).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debian_package_installs_and_its_unit_serves_certbot_as_a_transient_user() {
    for program in [
        "cargo-deb",
        "dpkg",
        "dpkg-deb",
        "systemd-analyze",
        "setpriv",
        "certbot",
    ] {
        assert!(harness::require_program(program), "{program} is needed");
    }
    assert!(
        rustix::process::geteuid().is_root()
            || Command::new("sudo")
                .args(["-n", "true"])
                .status()
                .is_ok_and(|s| s.success()),
        "installing a package needs root (or sudo without a password)"
    );
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };

    // Build the package from the binary this suite built.
    let exe = Path::new(env!("CARGO_BIN_EXE_acme-proxy"));
    let target_dir = exe.parent().and_then(Path::parent).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = output(
        Command::new(repo.join("scripts/package"))
            .current_dir(&repo)
            .env("PROFILE", "dev")
            .env("CARGO_TARGET_DIR", target_dir),
    );
    let deb = PathBuf::from(built.lines().last().unwrap_or_default().trim());
    assert!(
        deb.extension().is_some_and(|e| e == "deb") && deb.exists(),
        "scripts/package prints the package's path last: {built}"
    );
    let contents = output(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    for path in [
        "./usr/bin/acme-proxy",
        "./etc/acme-proxy/acme-proxy.toml",
        "./usr/share/man/man1/acme-proxy.1.gz",
        "./usr/share/man/man1/acme-proxy-serve.1.gz",
        "./usr/share/bash-completion/completions/acme-proxy",
        "./usr/share/zsh/vendor-completions/_acme-proxy",
        "./usr/share/fish/vendor_completions.d/acme-proxy.fish",
        "./usr/share/doc/acme-proxy/examples/low-port.conf",
        "/acme-proxy.service",
    ] {
        assert!(
            contents.contains(path),
            "{path} in the package:\n{contents}"
        );
    }
    let conffiles = output(
        Command::new("dpkg-deb")
            .arg("--info")
            .arg(&deb)
            .arg("conffiles"),
    );
    assert!(
        conffiles.contains("/etc/acme-proxy/acme-proxy.toml"),
        "an upgrade keeps the operator's configuration: {conffiles}"
    );
    let config_line = contents
        .lines()
        .find(|l| l.ends_with("./etc/acme-proxy/acme-proxy.toml"))
        .unwrap();
    assert!(
        config_line.starts_with("-rw-r-----"),
        "the configuration may hold secrets: root only ({config_line})"
    );

    // Install it.
    let _installed = Installed;
    output(as_root("dpkg").arg("-i").arg(&deb));
    let version = output(Command::new("/usr/bin/acme-proxy").arg("--version"));
    assert_eq!(
        version,
        output(Command::new(exe).arg("--version")),
        "the installed binary is the one built"
    );
    assert!(
        version.starts_with(&format!(
            "acme-proxy {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "{version}"
    );
    let unit_path = output(Command::new("dpkg").args(["-L", "acme-proxy"]))
        .lines()
        .find(|l| l.ends_with("/systemd/system/acme-proxy.service"))
        .map(PathBuf::from)
        .expect("the package installs a systemd unit");
    output(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(&unit_path),
    );
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let service = service_section(&unit);
    let one = |key: &str| -> String {
        let values = service
            .get(key)
            .unwrap_or_else(|| panic!("{key}= in\n{unit}"));
        values.last().unwrap().clone()
    };
    assert_eq!(one("DynamicUser"), "yes");
    assert_eq!(one("StateDirectory"), "acme-proxy");
    assert_eq!(one("WorkingDirectory"), "/var/lib/acme-proxy");
    assert_eq!(one("NoNewPrivileges"), "yes");
    assert_eq!(one("ProtectSystem"), "strict");
    assert_eq!(one("AmbientCapabilities"), "", "no capability by default");
    assert_eq!(one("ExecReload"), "/bin/kill -HUP $MAINPID");

    // Run ExecStart as systemd would.
    let state = harness::tempdir();
    owned_by_transient_user(state.path());
    let credentials = harness::tempdir();
    let (name, source) = one("LoadCredential")
        .split_once(':')
        .map(|(n, s)| (n.to_owned(), s.to_owned()))
        .unwrap();
    let credential = credentials.path().join(&name);
    std::fs::copy(&source, &credential).unwrap();
    std::os::unix::fs::chown(&credential, Some(TRANSIENT_UID), Some(TRANSIENT_UID)).unwrap();
    owned_by_transient_user(credentials.path());
    let exec_start = one("ExecStart").replace(
        "${CREDENTIALS_DIRECTORY}",
        credentials.path().to_str().unwrap(),
    );
    let argv: Vec<&str> = exec_start.split_whitespace().collect();
    let umask = one("UMask");
    let at = harness::own_addr();
    let uid = TRANSIENT_UID.to_string();
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid", &uid, "--regid", &uid, "--clear-groups"])
        .args(["--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"])
        .args(["sh", "-c", &format!("umask {umask} && exec \"$@\""), "sh"])
        .args(&argv)
        .current_dir(state.path())
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("CREDENTIALS_DIRECTORY", credentials.path())
        .env("ACME_PROXY_LISTEN", "127.0.0.1:0")
        .env("ACME_PROXY_VALIDATION__HTTP_PORT", at.port().to_string())
        .env(
            "ACME_PROXY_VALIDATION__DNS_RESOLVERS",
            format!("[\"{}\"]", dns.addr),
        )
        .env(
            "ACME_PROXY_VALIDATION__ALLOW_NETWORKS",
            format!("[\"{}\"]", at.ip()),
        );
    let logs = harness::tempdir();
    let log = logs.path().join("acme-proxy.log");
    let (_server, directory) = harness::spawn_serving(command, &log);

    let client = harness::tempdir();
    let d = client.path().to_path_buf();
    let name = "installed.example.test";
    let ran = run(
        "certbot",
        certbot_certonly_standalone(&d, &directory, at, name),
        d.clone(),
    )
    .await;
    assert!(
        ran.success(),
        "certbot failed\n{}\n--- letsencrypt.log (tail) ---\n{}\n--- acme-proxy ---\n{}",
        ran.report(),
        certbot_log_tail(&d),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let issued = leaf(&d.join("conf/live/t/cert.pem"), &|| ran.report());
    assert_eq!(issued.sans, vec![name.to_owned()]);

    // The data landed in the state directory, the transient user's and
    // private, and the certificate was signed by the CA it made there.
    let data = state.path().join("acme-proxy-data");
    let ca = std::fs::read(data.join("ca/default/ca.pem")).unwrap();
    let (_, ca) = x509_parser::pem::parse_x509_pem(&ca).unwrap();
    let ca = ca.parse_x509().unwrap();
    assert_eq!(issued.issuer, ca.subject().as_raw().to_vec());
    let key = std::fs::metadata(data.join("ca/default/ca.key")).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&key),
        TRANSIENT_UID,
        "the CA key belongs to the service's user"
    );
    assert_eq!(not_private(&data), vec![]);
}
