//! The SQLite database failing under the real binary. Each fault is met
//! with a clean refusal (503 `serverInternal` with Retry-After: nothing
//! was written, the client may retry), a log line saying what happened,
//! nothing half-written, and normal service once the fault is gone:
//!
//! | fault                                   | answer                    | after the fault                        |
//! |-----------------------------------------|---------------------------|----------------------------------------|
//! | the file system full                    | 503 serverInternal, R-A 5 | space freed: serves, no restart        |
//! | a lock held past the 5 s busy timeout   | 503 serverInternal, R-A 5 | lock released: serves, no restart      |
//! | the database file moved away            | 503 serverInternal, R-A 5 | moved back: serves, no restart         |
//! | the database file removed               | 503 serverInternal, R-A 5 | restored and restarted: nothing lost   |
//! | the database file read-only at start    | start-up refused: chmod   | made writable: starts, nothing lost    |
//!
//! A file cannot turn read-only under a running server: its open
//! descriptors keep their write access (Linux even refuses to remount a
//! file system read-only while they are open), so that row is start-up.
//! "Nothing half-written": the account's order list holds exactly the
//! orders that were answered 201, every one of them readable.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{self, ChildGuard, spawn_binary};
use crate::raw::{self, Acct, Key};

/// A tmpfs of `size` mounted on `dir` for one test, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "mounting a small tmpfs (the tests run as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A server over `data` (its own configuration in `work`), and its
/// directory document.
async fn serve(work: &Path, data: &Path) -> (ChildGuard, Value) {
    let config = work.join("acme-proxy.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n[profiles.default]\n",
            data.display()
        ),
    )
    .unwrap();
    let (child, url) = spawn_binary(
        work,
        &["serve", "--config", config.to_str().unwrap()],
        &[("RUST_LOG", "info".to_owned())],
    );
    let directory = raw::directory(&url).await;
    (child, directory)
}

async fn new_order(acct: &Acct, directory: &Value, name: &str) -> raw::Resp {
    let url = directory["newOrder"].as_str().unwrap();
    let payload = json!({"identifiers": [{"type": "dns", "value": name}]});
    acct.post(directory, url, Some(&payload)).await
}

/// `http://127.0.0.1:PORT`, from a directory document.
fn base_of(directory: &Value) -> String {
    let url = directory["newNonce"].as_str().unwrap();
    url[..url.find("/profile/").unwrap()].to_owned()
}

/// A server over `data`, an account, and one order made before the fault.
async fn serving_with_an_order(work: &Path, data: &Path) -> (ChildGuard, Value, Acct) {
    let (server, directory) = serve(work, data).await;
    let acct = Acct::create(&directory, Key::p256()).await;
    order_made(&acct, &directory, "before.example.test").await;
    (server, directory, acct)
}

/// A new order, which must be made (201).
async fn order_made(acct: &Acct, directory: &Value, name: &str) {
    let r = new_order(acct, directory, name).await;
    assert_eq!(
        r.status,
        201,
        "newOrder {name}: {}",
        String::from_utf8_lossy(&r.body)
    );
}

/// The refusal every row expects: nothing written, retry later.
fn assert_unavailable(r: &raw::Resp, what: &str) {
    r.assert_refused(503, "serverInternal", what);
    let retry_after = r
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("{what}: a 503 without Retry-After"));
    assert!(
        retry_after.parse::<u64>().is_ok_and(|s| s > 0),
        "{what}: Retry-After {retry_after}"
    );
}

/// The orders the account lists, each read back whole.
async fn orders_of(acct: &Acct, directory: &Value) -> Vec<String> {
    let account = acct.post(directory, &acct.url, None).await.json();
    let list = acct
        .post(directory, account["orders"].as_str().unwrap(), None)
        .await
        .json();
    let orders: Vec<String> = list["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap().to_owned())
        .collect();
    for url in &orders {
        let doc = acct.post(directory, url, None).await.json();
        assert_eq!(doc["status"], "pending", "{url}: {doc}");
        assert_eq!(doc["authorizations"].as_array().unwrap().len(), 1, "{doc}");
    }
    orders
}

/// Waits until the server's log has the error line of a refused request
/// containing `text`.
fn wait_for_log(work: &Path, text: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(work.join("acme-proxy.log")).unwrap_or_default();
        let answered = |l: &&str| l.contains("event=\"acme.error\"") && l.contains("status=503");
        if let Some(line) = log.lines().filter(answered).find(|l| l.contains(text)) {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no log line with {text:?}:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_file_system_is_answered_503_writes_nothing_and_service_resumes_once_space_is_freed()
{
    let work = harness::tempdir();
    let data = work.path().join("data");
    let _tmpfs = Tmpfs::mount(&data, "8m");
    let (_server, directory, acct) = serving_with_an_order(work.path(), &data).await;
    let mut made = 1;

    // Every byte left taken.
    let filler = data.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }
    // The WAL may still have room for a few frames: order until the
    // database has to grow (bounded).
    let mut refused = None;
    for i in 0..500 {
        let r = new_order(&acct, &directory, &format!("o{i}.example.test")).await;
        match r.status {
            201 => made += 1,
            _ => {
                refused = Some(r);
                break;
            }
        }
    }
    let refused = refused.expect("500 orders fitted in a full file system");
    assert_unavailable(&refused, "newOrder on a full disk");
    let line = wait_for_log(work.path(), "database or disk is full");
    assert!(line.contains("ERROR"), "{line}");
    // Later requests are refused the same way, not with a 500. One may
    // still fit: once a checkpoint has copied the WAL into the database,
    // the WAL starts over in the space it already has (bounded).
    let mut again = None;
    for i in 0..500 {
        let r = new_order(&acct, &directory, &format!("again{i}.example.test")).await;
        match r.status {
            201 => made += 1,
            _ => {
                again = Some(r);
                break;
            }
        }
    }
    assert_unavailable(
        &again.expect("500 more orders fitted in a full file system"),
        "newOrder on a full disk, again",
    );

    std::fs::remove_file(&filler).unwrap();
    order_made(&acct, &directory, "after.example.test").await;
    made += 1;
    assert_eq!(orders_of(&acct, &directory).await.len(), made);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_by_another_process_past_the_busy_timeout_is_answered_503_and_service_resumes_when_it_is_released()
 {
    let work = harness::tempdir();
    let data = work.path().join("data");
    let (_server, directory, acct) = serving_with_an_order(work.path(), &data).await;

    // Another program (a backup tool, an operator's sqlite3 shell) takes
    // the write lock and keeps it.
    let other = rusqlite::Connection::open(data.join("acme-proxy.db")).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let started = Instant::now();
    let r = new_order(&acct, &directory, "locked.example.test").await;
    assert_unavailable(&r, "newOrder while another process holds the lock");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "answered after {:?}, before the busy timeout",
        started.elapsed()
    );
    let line = wait_for_log(work.path(), "database is locked");
    assert!(line.contains("ERROR"), "{line}");

    other.execute_batch("ROLLBACK").unwrap();
    drop(other);
    order_made(&acct, &directory, "after.example.test").await;
    assert_eq!(orders_of(&acct, &directory).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_file_moved_away_is_answered_503_with_nothing_written_and_service_resumes_when_it_is_back()
 {
    let work = harness::tempdir();
    let data = work.path().join("data");
    let (_server, directory, acct) = serving_with_an_order(work.path(), &data).await;

    let db = data.join("acme-proxy.db");
    let away = work.path().join("moved.db");
    std::fs::rename(&db, &away).unwrap();
    assert_unavailable(
        &new_order(&acct, &directory, "moved.example.test").await,
        "newOrder with the database file moved away",
    );
    let line = wait_for_log(work.path(), "was removed, moved or replaced");
    assert!(line.contains("ERROR"), "{line}");

    std::fs::rename(&away, &db).unwrap();
    order_made(&acct, &directory, "after.example.test").await;
    assert_eq!(orders_of(&acct, &directory).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_file_removed_under_the_server_takes_no_writes_and_a_restart_on_the_restored_file_loses_nothing()
 {
    let work = harness::tempdir();
    let data = work.path().join("data");
    let (server, directory, acct) = serving_with_an_order(work.path(), &data).await;

    // The operator's last backup, then the accident.
    let backup = work.path().join("backup.db");
    let out = Command::new(harness::binary())
        .args([
            "--config",
            work.path().join("acme-proxy.toml").to_str().unwrap(),
        ])
        .args(["db", "backup"])
        .arg(&backup)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let db = data.join("acme-proxy.db");
    std::fs::remove_file(&db).unwrap();
    for i in 0..3 {
        assert_unavailable(
            &new_order(&acct, &directory, &format!("gone{i}.example.test")).await,
            "newOrder with the database file removed",
        );
    }
    wait_for_log(work.path(), "was removed, moved or replaced");

    drop(server);
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(data.join(format!("acme-proxy.db{suffix}")));
    }
    std::fs::copy(&backup, &db).unwrap();
    let old_base = base_of(&directory);
    let (_server, directory) = serve(work.path(), &data).await;
    // The same account (at the new port), with exactly the order made
    // before the removal.
    let acct = Acct {
        url: acct.url.replace(&old_base, &base_of(&directory)),
        key: acct.key,
    };
    assert_eq!(orders_of(&acct, &directory).await.len(), 1);
    order_made(&acct, &directory, "after.example.test").await;
    assert_eq!(orders_of(&acct, &directory).await.len(), 2);
}

/// `acme-proxy serve` as the unprivileged user `nobody` (root writes any
/// file whatever its mode), from a link to the binary in `work`: the
/// build directory may be where `nobody` cannot go.
fn serve_as_nobody(work: &Path) -> Command {
    let binary = work.join("acme-proxy");
    if !binary.exists() {
        std::fs::hard_link(harness::binary(), &binary)
            .or_else(|_| std::fs::copy(harness::binary(), &binary).map(|_| ()))
            .unwrap();
    }
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(binary)
        .args(["serve", "--config"])
        .arg(work.join("acme-proxy.toml"))
        .current_dir(work)
        .env_remove("ACME_PROXY_CONFIG");
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_file_stops_start_up_saying_what_to_change_and_starts_once_writable() {
    use std::os::unix::fs::PermissionsExt;
    let work = harness::tempdir();
    // `nobody` must reach the configuration, the data and the log.
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = work.path().join("data");
    let (server, directory, acct) = serving_with_an_order(work.path(), &data).await;
    let old_base = base_of(&directory);
    drop(server);
    std::fs::set_permissions(
        work.path().join("acme-proxy.toml"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let out = Command::new("chown")
        .args(["-R", "nobody:nogroup"])
        .arg(&data)
        .arg(work.path().join("acme-proxy.log"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let db = data.join("acme-proxy.db");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o400)).unwrap();

    let refused = serve_as_nobody(work.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "started on a read-only database: {stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "the database file {} cannot be written by this user",
            db.display()
        )) && stderr.contains("chmod u+w"),
        "{stderr}"
    );

    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (_server, url) = harness::spawn_serving(
        serve_as_nobody(work.path()),
        &work.path().join("nobody.log"),
    );
    let directory = raw::directory(&url).await;
    let acct = Acct {
        url: acct.url.replace(&old_base, &base_of(&directory)),
        key: acct.key,
    };
    assert_eq!(orders_of(&acct, &directory).await.len(), 1);
    order_made(&acct, &directory, "after.example.test").await;
}
