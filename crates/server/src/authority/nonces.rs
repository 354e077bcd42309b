//! Replay nonces (RFC 8555 §6.5). Issuing and consuming one is on every
//! request's path, so neither may cost more than it must.
//!
//! - `memory` (the default on SQLite): nonces live in this process. No
//!   disk write per request. Replay stays impossible — a nonce is removed
//!   under a lock when it is used, so only one request can use it — and a
//!   restart forgets every nonce, so old ones are refused with `badNonce`
//!   (clients take the fresh one from that error and retry, §6.5).
//! - `database` (the default on PostgreSQL): for replicas behind a
//!   balancer that does not keep a client on one. A nonce carries its
//!   expiry and an HMAC-SHA256 under a key every process on the database
//!   shares, so issuing one writes nothing and any replica can tell one it
//!   did not issue from a forgery; using one records it in the database
//!   (one `INSERT`, whose row count says whether it was fresh), so it is
//!   accepted once whichever replica sees it first.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use acme_proxy_store::{Store, StoreError};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;

use crate::config::NonceStore;

/// Outstanding nonces kept at most; past this the oldest are forgotten
/// (their clients get `badNonce` and retry).
const MEMORY_CAP: usize = 100_000;

/// A signed nonce: its expiry (Unix seconds, 8 octets big-endian), 16
/// random octets, then the HMAC-SHA256 of those 24 octets.
const SIGNED_BODY: usize = 24;
const SIGNED_LEN: usize = SIGNED_BODY + 32;
/// The base64url characters that encode exactly the body (24 octets are 32
/// characters): what names a used nonce in the database.
const SIGNED_NAME_CHARS: usize = SIGNED_BODY / 3 * 4;

/// A nonce found issued and unexpired ([`Nonces::check`]).
#[derive(Debug)]
pub enum Checked {
    /// Used now (a memory nonce).
    Spent,
    /// Its use is still to be recorded, under `name` (the database's key
    /// for it) until `expires_at`.
    Due { name: String, expires_at: i64 },
}

#[derive(Debug)]
pub struct Nonces {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Memory(Mutex<Book>),
    /// The key is read from (or first written to) the database on first
    /// use, so that building the authority needs no database round trip.
    Signed(tokio::sync::OnceCell<hmac::Key>),
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

/// The number a memory nonce's text encodes; `None` for text that
/// `ids::nonce` cannot have made (such a nonce was never issued).
fn key(nonce: &str) -> Option<u128> {
    let mut raw = [0u8; 16];
    match URL_SAFE_NO_PAD.decode_slice(nonce, &mut raw) {
        Ok(16) => Some(u128::from_be_bytes(raw)),
        _ => None,
    }
}

impl Nonces {
    pub fn new(kind: NonceStore) -> Self {
        Self {
            kind: match kind {
                NonceStore::Memory => Kind::Memory(Mutex::new(Book::default())),
                NonceStore::Database => Kind::Signed(tokio::sync::OnceCell::new()),
            },
        }
    }

    /// Issues a fresh nonce valid until `expires_at` (Unix seconds).
    pub async fn issue(&self, store: &Store, expires_at: i64) -> Result<String, StoreError> {
        match &self.kind {
            Kind::Signed(key) => {
                let key = signing_key(key, store).await?;
                let mut raw = [0u8; SIGNED_LEN];
                raw[..8].copy_from_slice(&expires_at.to_be_bytes());
                raw[8..SIGNED_BODY].copy_from_slice(&crate::ids::nonce_octets());
                let tag = hmac::sign(key, &raw[..SIGNED_BODY]);
                raw[SIGNED_BODY..].copy_from_slice(tag.as_ref());
                Ok(URL_SAFE_NO_PAD.encode(raw))
            }
            Kind::Memory(book) => {
                let raw = crate::ids::nonce_octets();
                let key = u128::from_be_bytes(raw);
                let mut book = lock(book);
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
                Ok(URL_SAFE_NO_PAD.encode(raw))
            }
        }
    }

    /// Uses a nonce: true exactly once per issued, unexpired nonce.
    pub async fn consume(&self, store: &Store, nonce: &str, now: i64) -> Result<bool, StoreError> {
        match self.check(store, nonce, now).await? {
            Some(Checked::Spent) => Ok(true),
            Some(Checked::Due { name, expires_at }) => store.use_nonce(&name, expires_at).await,
            None => Ok(false),
        }
    }

    /// Checks a nonce without recording its use in the database: `None`
    /// for one never issued, expired or (in memory) used;
    /// [`Checked::Due`] for a signed nonce whose use is still to be
    /// recorded (`Store::spending_nonce` records it with the request's
    /// first statement); [`Checked::Spent`] for a memory nonce, used here.
    pub async fn check(
        &self,
        store: &Store,
        nonce: &str,
        now: i64,
    ) -> Result<Option<Checked>, StoreError> {
        match &self.kind {
            Kind::Signed(key) => {
                // The base64 decoder refuses non-canonical text, so one
                // nonce has one spelling, and its first characters name it.
                let mut raw = [0u8; SIGNED_LEN];
                if URL_SAFE_NO_PAD.decode_slice(nonce, &mut raw) != Ok(SIGNED_LEN) {
                    return Ok(None);
                }
                let key = signing_key(key, store).await?;
                // Constant time: a forger learns nothing from how long the
                // refusal took.
                if hmac::verify(key, &raw[..SIGNED_BODY], &raw[SIGNED_BODY..]).is_err() {
                    return Ok(None);
                }
                let mut expiry = [0u8; 8];
                expiry.copy_from_slice(&raw[..8]);
                let expires_at = i64::from_be_bytes(expiry);
                if expires_at <= now {
                    return Ok(None);
                }
                Ok(Some(Checked::Due {
                    name: nonce[..SIGNED_NAME_CHARS].to_owned(),
                    expires_at,
                }))
            }
            Kind::Memory(book) => Ok(key(nonce)
                .is_some_and(|key| {
                    lock(book)
                        .live
                        .remove(&key)
                        .is_some_and(|expires_at| expires_at > now)
                })
                .then_some(Checked::Spent)),
        }
    }

    /// Forgets expired nonces (in the database: the records of used ones);
    /// returns how many.
    pub async fn sweep(&self, store: &Store, now: i64) -> Result<u64, StoreError> {
        match &self.kind {
            Kind::Signed(_) => store.sweep_nonces(now).await,
            Kind::Memory(book) => {
                let mut book = lock(book);
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

    /// The nonces kept (for the `nonces` gauge): outstanding ones in
    /// memory, or the records of used, unexpired ones in the database.
    pub async fn count(&self, store: &Store) -> Result<i64, StoreError> {
        match &self.kind {
            Kind::Signed(_) => store.used_nonce_count().await,
            Kind::Memory(book) => Ok(lock(book).live.len() as i64),
        }
    }
}

fn lock(book: &Mutex<Book>) -> std::sync::MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|p| p.into_inner())
}

/// The key every process on the database signs nonces with: the first one
/// stored, which this process may be the one to store.
async fn signing_key<'k>(
    key: &'k tokio::sync::OnceCell<hmac::Key>,
    store: &Store,
) -> Result<&'k hmac::Key, StoreError> {
    key.get_or_try_init(|| async {
        let stored = store.nonce_key(&crate::ids::secret_key()).await?;
        Ok(hmac::Key::new(hmac::HMAC_SHA256, &stored))
    })
    .await
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
        let a = n.issue(&store, 100).await.unwrap();
        let b = n.issue(&store, 100).await.unwrap();
        assert!(n.consume(&store, &a, 50).await.unwrap());
        assert!(!n.consume(&store, &a, 50).await.unwrap(), "replayed");
        assert!(!n.consume(&store, &crate::ids::nonce(), 50).await.unwrap());
        assert!(!n.consume(&store, "never-issued", 50).await.unwrap());
        assert!(!n.consume(&store, &b, 100).await.unwrap(), "expired");
        assert_eq!(store.used_nonce_count().await.unwrap(), 0, "no disk write");
    }

    #[tokio::test]
    async fn a_new_book_knows_no_nonce_of_the_previous_process() {
        let (_dir, store) = store().await;
        let before_restart = Nonces::new(NonceStore::Memory);
        let old = before_restart.issue(&store, i64::MAX).await.unwrap();
        let after_restart = Nonces::new(NonceStore::Memory);
        assert!(!after_restart.consume(&store, &old, 0).await.unwrap());
    }

    #[tokio::test]
    async fn the_sweep_forgets_expired_nonces_only() {
        let (_dir, store) = store().await;
        let n = Nonces::new(NonceStore::Memory);
        let soon = n.issue(&store, 10).await.unwrap();
        let later = n.issue(&store, 20).await.unwrap();
        let used = n.issue(&store, 20).await.unwrap();
        assert!(n.consume(&store, &used, 5).await.unwrap());
        assert_eq!(n.sweep(&store, 15).await.unwrap(), 1);
        assert_eq!(n.count(&store).await.unwrap(), 1);
        assert!(!n.consume(&store, &soon, 5).await.unwrap(), "swept");
        assert!(n.consume(&store, &later, 15).await.unwrap());
    }

    #[tokio::test]
    async fn a_signed_nonce_from_one_process_is_used_once_at_another_and_issuing_writes_nothing() {
        let (_dir, store) = store().await;
        let (a, b) = (
            Nonces::new(NonceStore::Database),
            Nonces::new(NonceStore::Database),
        );
        let nonce = a.issue(&store, 100).await.unwrap();
        let other = a.issue(&store, 100).await.unwrap();
        assert_eq!(
            store.used_nonce_count().await.unwrap(),
            0,
            "no write to issue"
        );
        assert!(b.consume(&store, &nonce, 50).await.unwrap());
        assert!(
            !a.consume(&store, &nonce, 50).await.unwrap(),
            "replayed at A"
        );
        assert!(
            !b.consume(&store, &nonce, 50).await.unwrap(),
            "replayed at B"
        );
        assert_eq!(
            store.used_nonce_count().await.unwrap(),
            1,
            "one write to use"
        );
        assert!(a.consume(&store, &other, 50).await.unwrap());
    }

    #[tokio::test]
    async fn a_signed_nonce_is_refused_once_expired_or_altered_and_without_the_shared_key() {
        let (_dir, store) = self::store().await;
        let n = Nonces::new(NonceStore::Database);
        let expired = n.issue(&store, 100).await.unwrap();
        assert!(!n.consume(&store, &expired, 100).await.unwrap(), "expired");

        // Pushing its expiry out breaks the MAC.
        let nonce = n.issue(&store, 100).await.unwrap();
        let mut raw = URL_SAFE_NO_PAD.decode(&nonce).unwrap();
        raw[7] ^= 1;
        let altered = URL_SAFE_NO_PAD.encode(&raw);
        assert!(!n.consume(&store, &altered, 50).await.unwrap(), "altered");
        // Another spelling of the same octets (the unused low bits of the
        // last character set) is not a second nonce.
        let last = nonce.chars().last().unwrap();
        let respelled = format!("{}{}", &nonce[..nonce.len() - 1], (last as u8 + 1) as char);
        assert!(
            !n.consume(&store, &respelled, 50).await.unwrap(),
            "respelled"
        );
        assert!(!n.consume(&store, &crate::ids::nonce(), 50).await.unwrap());
        assert!(!n.consume(&store, "", 50).await.unwrap());

        // A database with another key (another installation) refuses it.
        let (_other_dir, other_store) = self::store().await;
        let elsewhere = Nonces::new(NonceStore::Database);
        assert!(!elsewhere.consume(&other_store, &nonce, 50).await.unwrap());
        assert!(n.consume(&store, &nonce, 50).await.unwrap(), "still fresh");
    }

    #[tokio::test]
    async fn the_sweep_forgets_records_of_used_nonces_once_they_expire() {
        let (_dir, store) = store().await;
        let n = Nonces::new(NonceStore::Database);
        let soon = n.issue(&store, 10).await.unwrap();
        let later = n.issue(&store, 20).await.unwrap();
        assert!(n.consume(&store, &soon, 5).await.unwrap());
        assert!(n.consume(&store, &later, 5).await.unwrap());
        // Expired by the sweeper's clock, but not by that of a replica 6 s
        // behind it, which must still find it used.
        assert_eq!(n.sweep(&store, 15).await.unwrap(), 0);
        assert!(
            !n.consume(&store, &soon, 9).await.unwrap(),
            "replayed at a replica whose clock is behind"
        );
        let grace = acme_proxy_store::USED_NONCE_GRACE;
        assert_eq!(n.sweep(&store, 10 + grace - 1).await.unwrap(), 0);
        assert_eq!(n.sweep(&store, 10 + grace).await.unwrap(), 1);
        assert_eq!(n.count(&store).await.unwrap(), 1);
        assert!(!n.consume(&store, &later, 15).await.unwrap(), "still used");
    }
}
