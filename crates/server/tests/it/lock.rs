//! One server per SQLite database: a second `serve` on it refuses, naming
//! the first's pid; ten started at once on an empty directory leave exactly
//! one serving, none of them tripping over the schema, and the database
//! intact. Admin commands still work beside the one that serves.
//!
//! Always on SQLite: on PostgreSQL several servers share one database on
//! purpose (`replicas.rs`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{self, ChildGuard};

fn config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("acme-proxy.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[profiles.default]\n",
            dir.join("data").display()
        ),
    )
    .unwrap();
    path
}

/// `acme-proxy serve --config FILE`, stdout and stderr to files in `dir`
/// named after `name`.
fn spawn(dir: &Path, config: &Path, name: &str) -> Child {
    harness::under_umask_022()
        .args(["serve", "--config"])
        .arg(config)
        .current_dir(dir)
        .env_remove("ACME_PROXY_CONFIG")
        .env_remove("ACME_PROXY_DATABASE_URL")
        .stdout(std::fs::File::create(dir.join(format!("{name}.out"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{name}.err"))).unwrap())
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn acme-proxy")
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_default()
}

#[test]
fn a_second_server_on_one_data_directory_refuses_naming_the_pid_of_the_first() {
    let dir = harness::tempdir();
    let config = config(dir.path());
    let (first, _) = harness::spawn_binary(
        dir.path(),
        &["serve", "--config", config.to_str().unwrap()],
        &[],
    );
    let out = Command::new(harness::binary())
        .args(["serve", "--config"])
        .arg(&config)
        .env_remove("ACME_PROXY_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "another acme-proxy server (pid {}) is serving the database",
            first.0.id()
        )),
        "{stderr}"
    );
    // Admin commands work beside it.
    let listed = harness::run_cli(&config, &["audit", "list", "--json"], &[]);
    assert_eq!(listed.code, 0, "{listed:?}");
    drop(first);
}

#[test]
fn ten_servers_started_at_once_on_an_empty_directory_leave_one_serving_and_an_intact_database() {
    let dir = harness::tempdir();
    let config = config(dir.path());
    let children: Vec<Child> = (0..10)
        .map(|i| spawn(dir.path(), &config, &format!("s{i}")))
        .collect();
    let mut guards: Vec<ChildGuard> = children.into_iter().map(ChildGuard).collect();
    // Nine exit; one keeps serving.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut exited: Vec<(usize, i32)> = Vec::new();
    while exited.len() < 9 {
        assert!(
            Instant::now() < deadline,
            "only {} of ten exited: {exited:?}",
            exited.len()
        );
        for (i, g) in guards.iter_mut().enumerate() {
            if exited.iter().all(|(j, _)| *j != i)
                && let Some(status) = g.0.try_wait().unwrap()
            {
                exited.push((i, status.code().unwrap_or(-1)));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, code) in &exited {
        let err = read(dir.path(), &format!("s{i}.err"));
        assert_eq!(*code, 1, "s{i}: {err}");
        assert!(err.contains("is serving the database"), "s{i}: {err}");
        assert!(
            !err.contains("migrat") && !err.contains("already exists"),
            "s{i}: {err}"
        );
    }
    let serving: Vec<usize> = (0..10)
        .filter(|i| exited.iter().all(|(j, _)| j != i))
        .collect();
    assert_eq!(serving.len(), 1);
    let server = serving[0];
    let deadline = Instant::now() + Duration::from_secs(30);
    while !read(dir.path(), &format!("s{server}.out")).contains("ACME directory (default)") {
        assert!(
            Instant::now() < deadline,
            "the one left never served: {}",
            read(dir.path(), &format!("s{server}.err"))
        );
        assert!(guards[server].0.try_wait().unwrap().is_none(), "it exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The database it made is whole and usable.
    for command in [&["audit", "list", "--json"][..], &["job", "list", "--json"]] {
        let out = harness::run_cli(&config, command, &[]);
        assert_eq!(out.code, 0, "{command:?}: {out:?}");
    }
    drop(guards);
}
