//! `config check` is a dry run of `serve`'s start-up, the same code: a
//! table of broken configurations goes through both, and each gets the same
//! verdict for the same reasons (every problem `config check` names, `serve`
//! names too); a sound configuration starts under both. The dry run leaves
//! the data directory as it found it: nothing created, nothing written.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use acme_proxy_store::{Store, StoreOptions, UpstreamAccountRow};

use crate::harness::{ChildGuard, binary};

/// What a command made of a configuration.
#[derive(Debug, PartialEq)]
enum Verdict {
    Starts,
    /// The exit code and the `acme-proxy: ` lines of stderr.
    Refused(Option<i32>, Vec<String>),
}

/// `acme-proxy config check --config FILE`.
fn check(dir: &Path, file: &Path) -> Verdict {
    let out = Command::new(binary())
        .args(["config", "check", "--config"])
        .arg(file)
        .current_dir(dir)
        .env_remove("ACME_PROXY_CONFIG")
        .output()
        .unwrap();
    if out.status.success() {
        return Verdict::Starts;
    }
    Verdict::Refused(
        out.status.code(),
        problems(&String::from_utf8_lossy(&out.stderr)),
    )
}

/// `acme-proxy serve --config FILE` on port 0: Starts once it prints its
/// directory URL (then it is stopped), Refused when it exits first.
fn serve(dir: &Path, file: &Path) -> Verdict {
    let mut child = Command::new(binary())
        .args(["serve", "--config"])
        .arg(file)
        .current_dir(dir)
        .env_remove("ACME_PROXY_CONFIG")
        .env("ACME_PROXY_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let guard = ChildGuard(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let started = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("ACME directory ("));
        let _ = tx.send(started);
    });
    // Both outcomes end the wait: the directory line, or stdout closed by
    // the process ending.
    let started = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("serve neither started nor stopped within a minute");
    let mut guard = guard;
    if started {
        return Verdict::Starts;
    }
    let status = guard.0.wait().unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut text).unwrap();
    Verdict::Refused(status.code(), problems(&text))
}

/// The problems a command printed on stderr: each starts a line with
/// `acme-proxy: ` and runs on over the lines after it; warnings and the log
/// lines before the first are left aside.
fn problems(stderr: &str) -> Vec<String> {
    let mut problems: Vec<String> = Vec::new();
    for line in stderr.lines() {
        match line.strip_prefix("acme-proxy: ") {
            Some(p) if p.starts_with("warning: ") => {}
            Some(p) => problems.push(p.to_owned()),
            None => {
                if let Some(last) = problems.last_mut() {
                    last.push('\n');
                    last.push_str(line);
                }
            }
        }
    }
    problems
}

/// Every file under `dir` with its length and modification time.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, std::time::SystemTime, u32)> {
    let mut seen = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            seen.insert(
                e.path(),
                (m.len(), m.modified().unwrap(), m.permissions().mode()),
            );
        }
    }
    seen
}

/// Creates `dir` (and its parents) 0700, as the server keeps its data.
fn private_dir(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
}

/// A PKCS#8 PEM key and a self-signed CA certificate of another key.
fn mismatched_ca(dir: &Path) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&other).unwrap();
    let cert_path = dir.join("ca.pem");
    let key_path = dir.join("ca.key");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (cert_path, key_path)
}

/// Records an upstream account for profile `edge` in the database of
/// `data`, registered at `directory` with a key of thumbprint `thumbprint`,
/// and writes a key file (of another key) where the relay looks for it.
async fn registered(data: &Path, directory: &str, thumbprint: &str) {
    private_dir(data);
    let url = format!("sqlite:{}", data.join("acme-proxy.db").display());
    let store = Store::open(&url, &StoreOptions::default()).await.unwrap();
    store
        .save_upstream_account(&UpstreamAccountRow {
            profile: "edge".into(),
            upstream: "primary".into(),
            directory: directory.into(),
            account_url: "https://ca.example/acct/1".into(),
            key_thumbprint: thumbprint.into(),
            created_at: 1,
        })
        .await
        .unwrap();
    store.close().await;
    let upstream = data.join("upstream");
    private_dir(&upstream);
    let key = rcgen::KeyPair::generate().unwrap();
    let path = upstream.join("edge.key");
    std::fs::write(&path, key.serialize_pem()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

const RELAY: &str =
    "[profiles.edge.signer]\ntype = \"relay\"\ndirectory = \"https://ca.example/dir\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_check_and_serve_give_the_same_verdict_on_every_configuration_of_the_table() {
    // (name, what the refusal names, or None for a sound configuration)
    let cases: [(&str, Option<&str>); 12] = [
        ("zero configuration", None),
        ("a self-signed TLS certificate still to make", None),
        (
            "a CA key that is not its certificate's",
            Some("does not belong to the certificate"),
        ),
        (
            "a CA certificate that does not exist",
            Some("missing-ca.pem"),
        ),
        (
            "a relay profile without its upstream account",
            Some("acme-proxy upstream register --profile edge"),
        ),
        (
            "a relay key that is not the registered one",
            Some("is not the key registered for profile edge"),
        ),
        (
            "a relay account registered at another directory",
            Some("was registered at https://other.example/dir"),
        ),
        (
            "a custom signer program that is not absolute",
            Some("command"),
        ),
        ("a template that does not compile", Some("chat.json")),
        (
            "an email sender that is not an address",
            Some("profiles.default.notify.emails.pki.from"),
        ),
        ("a database others can read", Some("chmod")),
        (
            "a database of an engine this build does not open",
            Some("write sqlite:PATH (a file) or postgres://"),
        ),
    ];
    for (name, refusal) in cases {
        let dir = crate::harness::tempdir();
        let data = dir.path().join("data");
        let mut toml = format!("data_dir = \"{}\"\n", data.display());
        match name {
            "zero configuration" => {}
            "a self-signed TLS certificate still to make" => {
                toml.push_str("[tls]\nself_signed = true\n");
            }
            "a CA key that is not its certificate's" => {
                let (cert, key) = mismatched_ca(dir.path());
                toml.push_str(&format!(
                    "[profiles.default.signer]\ntype = \"local_ca\"\nca_cert = \"{}\"\nca_key = \"{}\"\n",
                    cert.display(),
                    key.display()
                ));
            }
            "a CA certificate that does not exist" => {
                let (_, key) = mismatched_ca(dir.path());
                toml.push_str(&format!(
                    "[profiles.default.signer]\ntype = \"local_ca\"\nca_cert = \"{}\"\nca_key = \"{}\"\n",
                    dir.path().join("missing-ca.pem").display(),
                    key.display()
                ));
            }
            "a relay profile without its upstream account" => toml.push_str(RELAY),
            "a relay key that is not the registered one" => {
                registered(&data, "https://ca.example/dir", "not-this-key").await;
                toml.push_str(RELAY);
            }
            "a relay account registered at another directory" => {
                registered(&data, "https://other.example/dir", "not-this-key").await;
                toml.push_str(RELAY);
            }
            "a custom signer program that is not absolute" => {
                toml.push_str(
                    "[profiles.default.signer]\ntype = \"custom\"\ncommand = \"bin/sign\"\n",
                );
            }
            "a template that does not compile" => {
                let templates = dir.path().join("templates");
                std::fs::create_dir_all(&templates).unwrap();
                std::fs::write(templates.join("chat.json"), "{\"text\": {{ notice.event }\n")
                    .unwrap();
                toml.push_str(&format!(
                    "[notify]\ntemplates_dir = \"{}\"\n[profiles.default.notify.webhooks.chat]\nurl = \"https://chat.example/hook\"\ntemplate = \"chat.json\"\n",
                    templates.display()
                ));
            }
            "an email sender that is not an address" => toml.push_str(
                "[profiles.default.notify.emails.pki]\nhost = \"smtp.example.test\"\nfrom = \"not an address\"\nto = [\"a@example.test\"]\n",
            ),
            "a database others can read" => {
                private_dir(&data);
                let url = format!("sqlite:{}", data.join("acme-proxy.db").display());
                Store::open(&url, &StoreOptions::default())
                    .await
                    .unwrap()
                    .close()
                    .await;
                std::fs::set_permissions(
                    data.join("acme-proxy.db"),
                    std::fs::Permissions::from_mode(0o644),
                )
                .unwrap();
            }
            "a database of an engine this build does not open" => {
                toml.insert_str(0, "database_url = \"mysql://acme@db.example/acme\"\n");
            }
            other => unreachable!("{other}"),
        }
        let file = dir.path().join("acme-proxy.toml");
        std::fs::write(&file, &toml).unwrap();

        let before = snapshot(dir.path());
        let checked = check(dir.path(), &file);
        assert_eq!(
            snapshot(dir.path()),
            before,
            "{name}: config check changed nothing on disk"
        );
        let served = serve(dir.path(), &file);
        match (refusal, &checked, &served) {
            (None, Verdict::Starts, Verdict::Starts) => {}
            (Some(reason), Verdict::Refused(c, check_says), Verdict::Refused(s, serve_says)) => {
                assert_eq!((c, s), (&Some(2), &Some(2)), "{name}: exit codes");
                assert!(
                    check_says.iter().any(|p| p.contains(reason)),
                    "{name}: config check names {reason:?}: {check_says:#?}"
                );
                for problem in check_says {
                    assert!(
                        serve_says.iter().any(|p| p.contains(problem.as_str())),
                        "{name}: serve names what config check named ({problem}): {serve_says:#?}"
                    );
                }
            }
            _ => panic!("{name}: config check said {checked:?}, serve {served:?}"),
        }
    }
}

#[test]
fn config_check_and_serve_name_all_five_mistakes_of_a_file_and_exit_2() {
    let dir = crate::harness::tempdir();
    let file = dir.path().join("acme-proxy.toml");
    std::fs::write(
        &file,
        format!(
            "data_dir = \"{}\"\nlisten = \"0.0.0.0:14000\"\ndatabase_url = \"mysql://acme@db.example/acme\"\n[metrics]\nlisten = \"127.0.0.1:14000\"\n[egress]\nproxy = \"socks5://proxy.example:1080\"\n[profiles.default]\nchallenges = []\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mistakes = [
        "public_url",
        "metrics.listen",
        "database_url",
        "egress.proxy",
        "profiles.default.challenges",
    ];
    let Verdict::Refused(code, said) = check(dir.path(), &file) else {
        panic!("config check passed a file with five mistakes");
    };
    assert_eq!(code, Some(2), "{said:#?}");
    assert_eq!(said.len(), 5, "one line per mistake: {said:#?}");
    for key in mistakes {
        assert!(said.iter().any(|l| l.contains(key)), "{key}: {said:#?}");
    }
    // serve refuses the same file the same way, before binding anything.
    let out = Command::new(binary())
        .args(["serve", "--config"])
        .arg(&file)
        .current_dir(dir.path())
        .env_remove("ACME_PROXY_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(problems(&String::from_utf8_lossy(&out.stderr)), said);
    assert!(!dir.path().join("data").exists(), "nothing was created");
}

#[test]
fn config_example_prints_the_annotated_example_anywhere_and_it_loads() {
    let dir = crate::harness::tempdir();
    // A configuration that does not load does not stop it.
    let out = Command::new(binary())
        .args(["config", "example"])
        .current_dir(dir.path())
        .env("ACME_PROXY_CONFIG", dir.path().join("missing.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, acme_proxy::config::reference::EXAMPLE);
    let file = dir.path().join("acme-proxy.toml");
    std::fs::write(&file, &text).unwrap();
    acme_proxy::config::Config::from_toml(&text).unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "config example wrote nothing beside the file written here"
    );
}

#[test]
fn a_value_that_does_not_load_names_the_variable_typed_or_the_key_and_its_file() {
    let dir = crate::harness::tempdir();
    let out = Command::new(binary())
        .args(["config", "check"])
        .current_dir(dir.path())
        .env_remove("ACME_PROXY_CONFIG")
        .env("ACME_PROXY_JOBS__LEASE", "soon")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let said = problems(&String::from_utf8_lossy(&out.stderr));
    assert!(
        said.len() == 1
            && said[0].starts_with("configuration: the variable ACME_PROXY_JOBS__LEASE: "),
        "{said:#?}"
    );

    let file = dir.path().join("acme-proxy.toml");
    std::fs::write(&file, "[jobs]\nlease = \"soon\"\n").unwrap();
    let Verdict::Refused(Some(2), said) = check(dir.path(), &file) else {
        panic!("a lease that is not a duration was accepted");
    };
    assert!(
        said.len() == 1
            && said[0].starts_with("configuration: jobs.lease: ")
            && said[0].ends_with(&format!("(in {})", file.display())),
        "{said:#?}"
    );
}

#[test]
fn config_show_names_where_each_value_comes_from_and_redacts_secrets() {
    let dir = crate::harness::tempdir();
    let file = dir.path().join("acme-proxy.toml");
    std::fs::write(
        &file,
        "data_dir = \"state\"\ndatabase_url = \"postgres://acme:hunter2@db.internal/acme\"\n\
         [profiles.default]\n[profiles.default.notify.webhooks.chat]\n\
         url = \"https://chat.example/hook\"\nheaders = { Authorization = \"Bearer s3cret\" }\n",
    )
    .unwrap();
    let run = |json: bool| {
        let mut cmd = Command::new(binary());
        cmd.args(["config", "show"]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd
            .arg("--config")
            .arg(&file)
            .env_remove("ACME_PROXY_CONFIG")
            .env("ACME_PROXY_JOBS__LEASE", "7s")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            !text.contains("hunter2") && !text.contains("s3cret"),
            "a secret shown:\n{text}"
        );
        text
    };
    let shown: Vec<serde_json::Value> = serde_json::from_str(&run(true)).unwrap();
    let of = |key: &str| {
        shown
            .iter()
            .find(|s| s["key"] == key)
            .map(|s| {
                (
                    s["value"].as_str().unwrap().to_owned(),
                    s["source"].as_str().unwrap().to_owned(),
                )
            })
            .unwrap_or_else(|| panic!("no {key} in {shown:#?}"))
    };
    assert_eq!(
        of("jobs.lease"),
        ("\"7s\"".into(), "environment ACME_PROXY_JOBS__LEASE".into())
    );
    assert_eq!(
        of("listen"),
        ("\"127.0.0.1:14000\"".into(), "default".into())
    );
    assert_eq!(
        of("profiles.default.bypass"),
        ("false".into(), "default".into())
    );
    let in_file = format!("file {}", file.display());
    assert_eq!(
        of("data_dir"),
        (
            format!("{:?}", dir.path().join("state").display().to_string()),
            in_file.clone()
        )
    );
    assert_eq!(
        of("database_url"),
        (
            "\"postgres://acme:***@db.internal/acme\"".into(),
            in_file.clone()
        )
    );
    assert_eq!(
        of("profiles.default.notify.webhooks.chat.headers.Authorization"),
        ("\"(redacted)\"".into(), in_file.clone())
    );
    assert_eq!(
        of("profiles.default.notify.webhooks.chat.url"),
        ("\"https://chat.example/(redacted)\"".into(), in_file)
    );
    let text = run(false);
    let lease = text
        .lines()
        .find(|l| l.starts_with("jobs.lease = "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        lease.starts_with("jobs.lease = \"7s\"")
            && lease.ends_with("# environment ACME_PROXY_JOBS__LEASE"),
        "{lease}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_data_dir_that_moved_with_the_file_is_refused_where_the_old_one_holds_the_data()
{
    let work = crate::harness::tempdir();
    let etc = crate::harness::tempdir();
    // An installation made when a relative data_dir followed the working
    // directory.
    let old = work.path().join("state");
    std::fs::create_dir(&old).unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o700)).unwrap();
    let store = Store::open(
        &format!("sqlite:{}", old.join("acme-proxy.db").display()),
        &StoreOptions::default(),
    )
    .await
    .unwrap();
    store.close().await;
    let file = etc.path().join("acme-proxy.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\ndata_dir = \"state\"\n[profiles.default]\n",
    )
    .unwrap();
    for command in [&["serve"][..], &["config", "check"]] {
        let out = Command::new(binary())
            .args(command)
            .arg("--config")
            .arg(&file)
            .current_dir(work.path())
            .env_remove("ACME_PROXY_CONFIG")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command:?}: {stderr}");
        assert!(
            stderr.contains(&format!("write data_dir = \"{}\"", old.display())),
            "{command:?}: {stderr}"
        );
        assert!(
            !etc.path().join("state").exists(),
            "{command:?} made a new one"
        );
    }
}
