//! Every operator command × {a bad value, no database where the
//! configuration points, a read-only data directory, run from `/` with no
//! configuration}: the documented exit code, a message that says what to
//! do, and no file created anywhere.
//!
//! Always on SQLite: the cases are about files and directories.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::harness::{self, CliOutput};

/// Exit codes docs/operating/cli.md documents.
const FAILED: i32 = 1;
const USAGE: i32 = 2;

/// Every command that opens the database, with made-up ids; `{backup}`
/// stands for a file the backup would write.
const COMMANDS: &[&[&str]] = &[
    &["job", "list"],
    &["job", "show", "1"],
    &["job", "retry", "1"],
    &["job", "cancel", "1"],
    &["audit", "list"],
    &["audit", "show", "1"],
    &["account", "list"],
    &["account", "show", "acct"],
    &["account", "deactivate", "acct", "--yes"],
    &["account", "delete", "acct", "--yes"],
    &["order", "list"],
    &["order", "show", "ord"],
    &["order", "revoke", "ord", "--yes"],
    &["order", "delete", "ord", "--yes"],
    &["cert", "expiring"],
    &["status"],
    &["nonce", "cleanup"],
    &["eab", "create"],
    &["eab", "list"],
    &["eab", "revoke", "kid", "--yes"],
    &["db", "backup", "{backup}"],
    &["upstream", "orders"],
];

/// Runs the binary `bin` (or the built one) in `cwd`, as `user` when
/// given, with stdin closed and no configuration from the environment.
fn run(bin: &Path, cwd: &Path, args: &[String], user: Option<u32>) -> CliOutput {
    let mut cmd = match user {
        Some(uid) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let out = cmd
        .args(args)
        .current_dir(cwd)
        .env_remove("ACME_PROXY_CONFIG")
        .env_remove("ACME_PROXY_DATA_DIR")
        .env_remove("ACME_PROXY_DATABASE_URL")
        .env("USER", "alice")
        .stdin(Stdio::null())
        .output()
        .expect("run acme-proxy");
    CliOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `command` with `{backup}` replaced and `--config FILE` added.
fn argv(command: &[&str], backup: &Path, config: Option<&Path>) -> Vec<String> {
    let mut args: Vec<String> = command
        .iter()
        .map(|a| match *a {
            "{backup}" => backup.display().to_string(),
            other => other.to_owned(),
        })
        .collect();
    if let Some(config) = config {
        args.push("--config".into());
        args.push(config.display().to_string());
    }
    args
}

/// Every path under `root`, sorted (root's own absence is an empty list).
fn tree(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![root.to_owned()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                todo.push(path.clone());
            }
            found.push(path);
        }
    }
    found.sort();
    found
}

fn config_for(data_dir: &Path) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[profiles.default]\n",
        data_dir.display()
    )
}

#[test]
fn a_bad_value_exits_2_naming_what_is_allowed_and_touches_nothing() {
    let root = harness::tempdir();
    let data = root.path().join("data");
    let (_etc, config) = harness::config_file(&config_for(&data));
    let bin = Path::new(harness::binary());
    // (arguments, words the message must contain)
    let table: &[(&[&str], &[&str])] = &[
        (&["job", "list", "--kind", "nonsense"], &["notify_delivery"]),
        (&["job", "list", "--status", "stuck"], &["queued"]),
        (&["job", "show", "seven"], &["invalid digit"]),
        (&["job", "retry", "x"], &["invalid digit"]),
        (&["job", "cancel", "x"], &["invalid digit"]),
        (
            &["audit", "list", "--outcome", "maybe"],
            &["success", "refused", "failure"],
        ),
        (
            &["audit", "list", "--event", "cert.issued"],
            &["certificate.issued", "config.reload"],
        ),
        (&["audit", "list", "--since", "2x"], &["RFC 3339", "7d"]),
        (&["audit", "list", "--serial", "0G:12"], &["hex"]),
        (
            &["audit", "list", "--limit", "-1"],
            &["--limit", "1..=100000"],
        ),
        (&["audit", "list", "--limit", "0"], &["--limit"]),
        (&["audit", "show", "one"], &["invalid digit"]),
        (&["account", "list", "--status", "gone"], &["deactivated"]),
        (&["account", "deactivate"], &["<ID>"]),
        (&["order", "list", "--status", "done"], &["processing"]),
        (
            &["order", "revoke", "ord", "--reason", "2", "--yes"],
            &["1 (keyCompromise)", "5 (cessationOfOperation)"],
        ),
        (&["order", "delete"], &["<ID>"]),
        (&["cert", "expiring", "--within", "soon"], &["--within"]),
        (&["upstream", "orders", "--status", "late"], &["processing"]),
        (&["eab", "create", "--bogus"], &["--bogus"]),
        (&["eab", "revoke"], &["<KID>"]),
        (&["db", "backup"], &["<FILE>"]),
        (&["db", "copy", "--from", "mysql://db/acme"], &["sqlite:"]),
        (&["nonce", "cleanup", "now"], &["now"]),
        (&["config", "check", "--strict"], &["--strict"]),
    ];
    for (command, words) in table {
        let out = run(
            bin,
            root.path(),
            &argv(command, Path::new("-"), Some(&config)),
            None,
        );
        assert_eq!(out.code, USAGE, "{command:?}: {out:?}");
        for word in *words {
            assert!(
                out.stderr.contains(word),
                "{command:?} should say {word:?}: {out:?}"
            );
        }
        assert!(
            tree(root.path()).is_empty(),
            "{command:?} created {:?}",
            tree(root.path())
        );
    }
}

#[test]
fn every_command_pointed_at_no_database_names_where_it_looked_and_creates_nothing() {
    let root = harness::tempdir();
    let data = root.path().join("data");
    let (_etc, config) = harness::config_file(&config_for(&data));
    let bin = Path::new(harness::binary());
    let backup = root.path().join("backup.db");
    for command in COMMANDS {
        let out = run(
            bin,
            root.path(),
            &argv(command, &backup, Some(&config)),
            None,
        );
        assert_eq!(out.code, USAGE, "{command:?}: {out:?}");
        let looked = data.join("acme-proxy.db");
        assert!(
            out.stderr
                .contains(&format!("no database at {}", looked.display()))
                && out
                    .stderr
                    .contains("run from the server's directory or pass --config"),
            "{command:?}: {out:?}"
        );
        assert!(
            tree(root.path()).is_empty(),
            "{command:?} created {:?}",
            tree(root.path())
        );
    }
    // Registration may start a new installation, but only for a relay
    // profile this configuration has.
    let out = run(
        bin,
        root.path(),
        &argv(&["upstream", "register"], &backup, Some(&config)),
        None,
    );
    assert_eq!(out.code, FAILED, "{out:?}");
    assert!(out.stderr.contains("no relay profile"), "{out:?}");
    assert!(tree(root.path()).is_empty(), "{:?}", tree(root.path()));
}

#[test]
fn every_command_run_from_the_root_directory_without_configuration_creates_nothing_there() {
    let default_dir = Path::new("/acme-proxy-data");
    assert!(
        !default_dir.exists(),
        "{} exists before the test: remove it (a command run from / created it)",
        default_dir.display()
    );
    let scratch = harness::tempdir();
    let backup = scratch.path().join("backup.db");
    let bin = Path::new(harness::binary());
    for command in COMMANDS {
        let out = run(bin, Path::new("/"), &argv(command, &backup, None), None);
        assert_eq!(out.code, USAGE, "{command:?}: {out:?}");
        assert!(
            out.stderr
                .contains("no database at /acme-proxy-data/acme-proxy.db: run from the server's directory or pass --config"),
            "{command:?}: {out:?}"
        );
        assert!(
            !default_dir.exists(),
            "{command:?} created {}",
            default_dir.display()
        );
        assert!(tree(scratch.path()).is_empty(), "{command:?}");
    }
    // Registration needs a relay profile; before anything ran, no relay
    // profile is registered; a dry run creates nothing.
    for (command, code) in [
        (&["upstream", "register"][..], FAILED),
        (&["upstream", "show"], 0),
        (&["config", "check"], 0),
    ] {
        let out = run(bin, Path::new("/"), &argv(command, &backup, None), None);
        assert_eq!(out.code, code, "{command:?}: {out:?}");
        assert!(
            !default_dir.exists(),
            "{command:?} created {}",
            default_dir.display()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_work_in_a_read_only_data_directory_and_write_nothing_there() {
    use std::os::unix::fs::PermissionsExt;
    // Root ignores permissions: the commands then run as nobody, with a
    // copy of the binary that nobody can reach.
    let as_root = nix_uid() == 0;
    let user = as_root.then_some(65534);
    let root = harness::tempdir();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = root.path().join("acme-proxy");
    std::fs::copy(harness::binary(), &bin).unwrap();
    let data = root.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let db = data.join("acme-proxy.db");
    let store = acme_proxy_store::Store::open(
        &format!("sqlite:{}", db.display()),
        &acme_proxy_store::StoreOptions::default(),
    )
    .await
    .unwrap();
    store.close().await;
    assert_eq!(
        tree(&data),
        vec![db.clone()],
        "the closed database left files beside it"
    );
    let config = root.path().join("acme-proxy.toml");
    std::fs::write(&config, config_for(&data)).unwrap();
    for (path, mode) in [(&config, 0o644), (&db, 0o644), (&data, 0o555)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let reads: &[&[&str]] = &[
        &["job", "list"],
        &["audit", "list", "--json"],
        &["account", "list"],
        &["order", "list", "--json"],
        &["eab", "list"],
        &["upstream", "orders"],
    ];
    for command in reads {
        let out = run(&bin, root.path(), &argv(command, &db, Some(&config)), user);
        assert_eq!(out.code, 0, "{command:?}: {out:?}");
        assert_eq!(
            tree(&data),
            vec![db.clone()],
            "{command:?} wrote beside the database"
        );
    }
    // A change cannot be made there: it fails, and still writes nothing.
    let out = run(
        &bin,
        root.path(),
        &argv(&["job", "retry", "1"], &db, Some(&config)),
        user,
    );
    assert_eq!(out.code, FAILED, "{out:?}");
    assert_eq!(tree(&data), vec![db.clone()]);
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
}

/// This process's real user id (the owner of /proc/self).
fn nix_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").expect("/proc/self").uid()
}

#[test]
fn a_relative_data_dir_in_a_file_is_found_beside_the_file_from_any_directory() {
    let root = harness::tempdir();
    let etc = root.path().join("etc");
    std::fs::create_dir(&etc).unwrap();
    let config = etc.join("acme-proxy.toml");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\ndata_dir = \"state\"\n[profiles.default]\n",
    )
    .unwrap();
    let bin = Path::new(harness::binary());
    let out = run(
        bin,
        Path::new("/"),
        &argv(&["job", "list"], Path::new("-"), Some(&config)),
        None,
    );
    assert_eq!(out.code, USAGE, "{out:?}");
    let expected = format!(
        "no database at {}",
        etc.join("state/acme-proxy.db").display()
    );
    assert!(out.stderr.contains(&expected), "{out:?}");
    assert!(!Path::new("/state").exists());
}
