//! Secrets at rest: the data directory holds the database (with the EAB
//! MAC keys and every account's key), the embedded CAs' keys, the relay's
//! upstream account keys and the TLS key. Whatever command creates them,
//! directories are made 0700 and files 0600 — by mode at creation, not by
//! the process's umask, so an operator's `umask 022` changes nothing —
//! and `serve` refuses to start when one of them is open to others,
//! saying which `chmod` to run.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The subdirectories of the data directory that the server writes keys
/// into (embedded CAs, relay accounts, the self-signed TLS certificate).
const KEY_DIRS: &[&str] = &["ca", "upstream", "tls"];

/// Creates `dir` (and missing parents) 0700. An existing directory is left
/// as it is: [`check`] refuses it at start-up if it is open to others.
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes `bytes` to a file that does not exist yet, 0600 from its
/// creation (never world-readable, even for a moment), and syncs it.
pub fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Writes `bytes` to `path`, 0600, replacing what was there.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // A file that existed keeps its mode through open(2): narrow it.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// One path open to others, and the command that closes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooOpen {
    pub path: PathBuf,
    pub mode: u32,
    pub fix: String,
}

/// The SQLite file of `database_url` and the WAL and shared-memory files
/// SQLite keeps beside it (they take the database file's mode when SQLite
/// creates them).
pub fn database_files(database_url: &str) -> Vec<PathBuf> {
    let Some(rest) = database_url.strip_prefix("sqlite:") else {
        return Vec::new();
    };
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let file = rest.split('?').next().unwrap_or(rest);
    if file.is_empty() || file.contains(":memory:") {
        return Vec::new();
    }
    ["", "-wal", "-shm"]
        .iter()
        .map(|suffix| PathBuf::from(format!("{file}{suffix}")))
        .collect()
}

/// Everything secret that exists now and is open to group or others: the
/// data directory and its key directories (with their subdirectories and
/// files), the database files, and `extra` (key files kept elsewhere).
pub fn check(data_dir: &Path, database_url: &str, extra: &[PathBuf]) -> Vec<TooOpen> {
    let mut found = Vec::new();
    let mut paths: Vec<PathBuf> = vec![data_dir.to_owned()];
    for sub in KEY_DIRS {
        walk(&data_dir.join(sub), 3, &mut paths);
    }
    paths.extend(database_files(database_url));
    paths.extend(extra.iter().cloned());
    for path in paths {
        // Not following links: a link's own mode means nothing, and what
        // it points at is checked where it lives if it is ours.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 == 0 {
            continue;
        }
        let want = if meta.is_dir() { "700" } else { "600" };
        found.push(TooOpen {
            fix: format!("chmod {want} '{}'", path.display()),
            path,
            mode,
        });
    }
    found
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    out.push(dir.to_owned());
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() && depth > 0 => walk(&path, depth - 1, out),
            Ok(t) if t.is_file() => out.push(path),
            _ => {}
        }
    }
}

/// [`check`] as a start-up refusal: one line per path, each with its
/// `chmod`.
pub fn refuse_open(data_dir: &Path, database_url: &str, extra: &[PathBuf]) -> Result<(), String> {
    let open = check(data_dir, database_url, extra);
    if open.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = open
        .iter()
        .map(|o| {
            format!(
                "  {} is mode {:o}, readable beyond its owner; run: {}",
                o.path.display(),
                o.mode,
                o.fix
            )
        })
        .collect();
    Err(format!(
        "the data directory holds keys and the database, which must be private to the server's user:\n{}",
        lines.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn files_and_directories_are_private_whatever_the_umask_allows() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        create_dir(&dir).unwrap();
        assert_eq!(mode(&root.path().join("a")), 0o700);
        assert_eq!(mode(&dir), 0o700);
        let f = dir.join("k");
        write_new(&f, b"x").unwrap();
        assert_eq!(mode(&f), 0o600);
        assert!(write_new(&f, b"y").is_err(), "never overwrites");
        let g = dir.join("g");
        std::fs::write(&g, b"old").unwrap();
        std::fs::set_permissions(&g, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&g, b"new").unwrap();
        assert_eq!(mode(&g), 0o600);
        assert_eq!(std::fs::read(&g).unwrap(), b"new");
    }

    #[test]
    fn the_database_files_are_the_file_and_its_wal_and_shm() {
        assert_eq!(
            database_files("sqlite:/d/x.db?mode=rwc"),
            ["/d/x.db", "/d/x.db-wal", "/d/x.db-shm"].map(PathBuf::from)
        );
        assert_eq!(database_files("sqlite:///d/x.db").len(), 3);
        assert!(database_files("sqlite::memory:").is_empty());
        assert!(database_files("postgres://h/db").is_empty());
    }

    #[test]
    fn an_open_key_or_database_is_named_with_the_chmod_that_closes_it() {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("data");
        create_dir(&data.join("ca/default")).unwrap();
        let key = data.join("ca/default/ca.key");
        write_new(&key, b"k").unwrap();
        let db = data.join("acme-proxy.db");
        write_new(&db, b"").unwrap();
        let url = format!("sqlite:{}", db.display());
        assert_eq!(check(&data, &url, &[]), vec![]);

        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
        let open = check(&data, &url, &[]);
        let fixes: Vec<&str> = open.iter().map(|o| o.fix.as_str()).collect();
        assert!(fixes.contains(&format!("chmod 700 '{}'", data.display()).as_str()));
        assert!(fixes.contains(&format!("chmod 600 '{}'", db.display()).as_str()));
        assert!(fixes.contains(&format!("chmod 600 '{}'", key.display()).as_str()));
        assert_eq!(open.len(), 3, "{open:?}");
        let e = refuse_open(&data, &url, &[]).unwrap_err();
        assert!(
            e.contains("mode 644") && e.contains("run: chmod 600"),
            "{e}"
        );
    }
}
