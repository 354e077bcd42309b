//! Replay nonces (RFC 8555 §6.5). Issuing and consuming one is on every
//! request's path, so by default they live in memory (`nonce_store =
//! "memory"`): no disk write per request. Replay stays impossible — a nonce
//! is removed under a lock when it is used, so only one request can use it
//! — and a restart forgets every nonce, so old ones are refused with
//! `badNonce` (clients take the fresh one from that error and retry,
//! §6.5). `nonce_store = "database"` keeps them in the store instead, for
//! replicas behind a balancer that does not keep a client on one replica.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use acme_proxy_store::Store;

use crate::config::NonceStore;

/// Outstanding nonces kept at most; past this the oldest are forgotten
/// (their clients get `badNonce` and retry).
const MEMORY_CAP: usize = 100_000;

#[derive(Debug)]
pub struct Nonces {
    kind: NonceStore,
    book: Mutex<Book>,
}

/// Live nonces with their expiry, and the order they were issued in (for
/// the cap and the sweep; an entry already used is skipped there).
///
/// A nonce is kept as the 128-bit number it encodes (`ids::nonce`), not as
/// its text: clients drop most nonces they are given (each response brings
/// one), so the book sits at its cap under load, and a number instead of
/// a 22-character heap string in each of two places is a large part of the
/// server's memory there (docs/performance.md, the scale run).
#[derive(Debug, Default)]
struct Book {
    live: HashMap<u128, i64>,
    issued: VecDeque<(i64, u128)>,
}

/// The number a nonce's text encodes; `None` for text that `ids::nonce`
/// cannot have made (such a nonce was never issued).
fn key(nonce: &str) -> Option<u128> {
    use base64::Engine;
    let mut raw = [0u8; 16];
    match base64::engine::general_purpose::URL_SAFE_NO_PAD.decode_slice(nonce, &mut raw) {
        Ok(16) => Some(u128::from_be_bytes(raw)),
        _ => None,
    }
}

impl Nonces {
    pub fn new(kind: NonceStore) -> Self {
        Self {
            kind,
            book: Mutex::new(Book::default()),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a fresh nonce valid until `expires_at` (Unix seconds).
    pub async fn issue(
        &self,
        store: &Store,
        nonce: &str,
        expires_at: i64,
    ) -> Result<(), acme_proxy_store::StoreError> {
        match self.kind {
            NonceStore::Database => store.insert_nonce(nonce, expires_at).await,
            NonceStore::Memory => {
                let Some(key) = key(nonce) else {
                    // Only `ids::nonce` makes nonces: nothing else is issued.
                    return Err(acme_proxy_store::StoreError::Corrupt(format!(
                        "{nonce:?} is not a nonce of this server"
                    )));
                };
                let mut book = self.book();
                while book.live.len() >= MEMORY_CAP {
                    match book.issued.pop_front() {
                        Some((_, old)) => {
                            book.live.remove(&old);
                        }
                        None => break,
                    }
                }
                book.live.insert(key, expires_at);
                book.issued.push_back((expires_at, key));
                Ok(())
            }
        }
    }

    /// Uses a nonce: true exactly once per issued, unexpired nonce.
    pub async fn consume(
        &self,
        store: &Store,
        nonce: &str,
        now: i64,
    ) -> Result<bool, acme_proxy_store::StoreError> {
        match self.kind {
            NonceStore::Database => store.consume_nonce(nonce, now).await,
            NonceStore::Memory => Ok(key(nonce).is_some_and(|key| {
                self.book()
                    .live
                    .remove(&key)
                    .is_some_and(|expires_at| expires_at > now)
            })),
        }
    }

    /// Forgets expired nonces; returns how many.
    pub async fn sweep(
        &self,
        store: &Store,
        now: i64,
    ) -> Result<u64, acme_proxy_store::StoreError> {
        match self.kind {
            NonceStore::Database => store.sweep_nonces(now).await,
            NonceStore::Memory => {
                let mut book = self.book();
                let mut swept = 0;
                while book
                    .issued
                    .front()
                    .is_some_and(|(expires_at, _)| *expires_at <= now)
                {
                    if let Some((_, old)) = book.issued.pop_front()
                        && book.live.remove(&old).is_some()
                    {
                        swept += 1;
                    }
                }
                // Used nonces leave `issued` only here: keep it from
                // growing past the live ones when nothing expires for long.
                if book.issued.len() > 2 * book.live.len() + 1024 {
                    let Book { live, issued } = &mut *book;
                    issued.retain(|(_, n)| live.contains_key(n));
                }
                Ok(swept)
            }
        }
    }

    /// Outstanding nonces (for the `nonces` gauge).
    pub async fn count(&self, store: &Store) -> Result<i64, acme_proxy_store::StoreError> {
        match self.kind {
            NonceStore::Database => store.nonce_count().await,
            NonceStore::Memory => Ok(self.book().live.len() as i64),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("t.db").display());
        let store = Store::open(&url, &acme_proxy_store::StoreOptions::default())
            .await
            .unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn a_memory_nonce_is_used_once_and_never_after_it_expires() {
        let (_dir, store) = store().await;
        let n = Nonces::new(NonceStore::Memory);
        let (a, b) = (crate::ids::nonce(), crate::ids::nonce());
        n.issue(&store, &a, 100).await.unwrap();
        n.issue(&store, &b, 100).await.unwrap();
        assert!(n.consume(&store, &a, 50).await.unwrap());
        assert!(!n.consume(&store, &a, 50).await.unwrap(), "replayed");
        assert!(!n.consume(&store, &crate::ids::nonce(), 50).await.unwrap());
        assert!(!n.consume(&store, "never-issued", 50).await.unwrap());
        assert!(!n.consume(&store, &b, 100).await.unwrap(), "expired");
        assert_eq!(store.nonce_count().await.unwrap(), 0, "no disk write");
    }

    #[tokio::test]
    async fn a_new_book_knows_no_nonce_of_the_previous_process() {
        let (_dir, store) = store().await;
        let before_restart = Nonces::new(NonceStore::Memory);
        let old = crate::ids::nonce();
        before_restart.issue(&store, &old, i64::MAX).await.unwrap();
        let after_restart = Nonces::new(NonceStore::Memory);
        assert!(!after_restart.consume(&store, &old, 0).await.unwrap());
    }

    #[tokio::test]
    async fn the_sweep_forgets_expired_nonces_only() {
        let (_dir, store) = store().await;
        let n = Nonces::new(NonceStore::Memory);
        let (soon, later, used) = (
            crate::ids::nonce(),
            crate::ids::nonce(),
            crate::ids::nonce(),
        );
        n.issue(&store, &soon, 10).await.unwrap();
        n.issue(&store, &later, 20).await.unwrap();
        n.issue(&store, &used, 20).await.unwrap();
        assert!(n.consume(&store, &used, 5).await.unwrap());
        assert_eq!(n.sweep(&store, 15).await.unwrap(), 1);
        assert_eq!(n.count(&store).await.unwrap(), 1);
        assert!(!n.consume(&store, &soon, 5).await.unwrap(), "swept");
        assert!(n.consume(&store, &later, 15).await.unwrap());
    }

    #[tokio::test]
    async fn database_nonces_go_through_the_store() {
        let (_dir, store) = store().await;
        let n = Nonces::new(NonceStore::Database);
        n.issue(&store, "d", 100).await.unwrap();
        assert_eq!(store.nonce_count().await.unwrap(), 1);
        assert!(n.consume(&store, "d", 50).await.unwrap());
        assert!(!n.consume(&store, "d", 50).await.unwrap());
    }
}
