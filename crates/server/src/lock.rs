//! One server per SQLite database. SQLite is the single-process engine:
//! a second `serve` on the same file would keep its own nonces, caches and
//! CRL state beside the first's, and two started at once on an empty
//! directory would race to create the schema. So `serve` holds an exclusive
//! lock (`flock`) on a file beside the database for as long as it runs,
//! with its pid written in it for the one it turns away. The kernel drops
//! the lock when the process ends, however it ends. Admin commands do not
//! take it: they work beside a running server. PostgreSQL needs no such
//! lock: replicas share its database on purpose.

use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

/// Held while the server runs; dropping it releases the lock.
#[derive(Debug)]
pub struct DatabaseLock {
    _file: std::fs::File,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "another acme-proxy server{} is serving the database {database}: stop it first, or \
         give this server its own data_dir (several servers share one database only on \
         PostgreSQL)",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Held { database: String, pid: Option<u32> },
    #[error("locking the database with {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Takes the lock of the SQLite database `database_url` names (none for
/// any other engine), or says which server holds it.
pub fn acquire(database_url: &str) -> Result<Option<DatabaseLock>, LockError> {
    let Some(database) = acme_proxy_store::sqlite_file(database_url) else {
        return Ok(None);
    };
    let mut path = database.clone().into_os_string();
    path.push(".lock");
    let path = PathBuf::from(path);
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {
            file.set_len(0).map_err(io)?;
            file.rewind().map_err(io)?;
            writeln!(file, "{}", std::process::id()).map_err(io)?;
            Ok(Some(DatabaseLock { _file: file }))
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            // The holder may not have written its pid yet.
            let _ = file.read_to_string(&mut text);
            Err(LockError::Held {
                database: database.display().to_string(),
                pid: text.trim().parse().ok(),
            })
        }
        Err(std::fs::TryLockError::Error(e)) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;

    #[test]
    fn a_second_lock_on_one_database_is_refused_naming_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("acme-proxy.db").display());
        let first = acquire(&url).unwrap().expect("a SQLite lock");
        match acquire(&url) {
            Err(LockError::Held { pid, database }) => {
                assert_eq!(pid, Some(std::process::id()));
                assert!(database.ends_with("acme-proxy.db"), "{database}");
            }
            other => panic!("{other:?}"),
        }
        drop(first);
        assert!(acquire(&url).unwrap().is_some(), "free once released");
        assert!(acquire("postgres://db/acme").unwrap().is_none());
    }
}
