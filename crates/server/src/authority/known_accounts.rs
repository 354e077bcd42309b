//! Accounts that signed recent requests, kept in memory with their parsed
//! keys (`account_cache_ttl`). Seven of an issuance's eight requests are
//! signed with a `kid` (RFC 8555 §6.2); reading the account and parsing its
//! key for each was 6 % of the server's CPU (docs/performance.md).
//!
//! What a copy may decide is bounded three ways:
//!
//! - every change this process makes to an account forgets its copy once
//!   committed (a client's own deactivation, key rollover or contact
//!   update, §7.3.2, §7.3.5, §7.3.6), and a copy read before that change
//!   is not kept (see [`KnownAccounts::generation`]);
//! - only POST-as-GET requests and the resources whose writes carry an
//!   [`AccountGuard`] (newOrder, challenge, finalize: `KeyMode::KidGuarded`)
//!   are verified from a copy; the store checks, in each such write's own
//!   transaction, that the account is still valid with the key that
//!   signed, since another process (the admin CLI, another replica on the
//!   same database) may have deactivated, deleted or rekeyed it. The
//!   account's other requests read it;
//! - so a copy another process made stale answers, for at most the TTL,
//!   only what writes nothing on the account's behalf: a POST-as-GET of its
//!   own resources, a trigger of a challenge no longer pending, or a
//!   refusal decided before the guarded write (the refusal's audit row is
//!   written, as for any refusal).
//!
//! [`AccountGuard`]: acme_proxy_store::AccountGuard

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use acme_proxy_protocol::Jwk;
use acme_proxy_store::AccountRow;

/// Copies kept at most; past this the expired ones go, and if that is not
/// enough, all of them (a burst of new accounts only costs reads).
const CAPACITY: usize = 10_000;

#[derive(Debug)]
pub(crate) struct KnownAccounts {
    ttl_ms: i64,
    book: Mutex<Book>,
}

#[derive(Debug, Default)]
struct Book {
    copies: HashMap<String, Entry>,
    /// Moves with every [`KnownAccounts::forget`].
    generation: u64,
}

#[derive(Clone, Debug)]
struct Entry {
    account: AccountRow,
    key: Jwk,
    /// Unix milliseconds when the account was read.
    read_ms: i64,
}

impl KnownAccounts {
    /// A TTL of zero keeps nothing.
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            ttl_ms: ttl.as_millis().try_into().unwrap_or(i64::MAX),
            book: Mutex::new(Book::default()),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fresh(&self, entry: &Entry, now_ms: i64) -> bool {
        // A clock stepped back does not lengthen a copy's life.
        entry.read_ms <= now_ms && now_ms - entry.read_ms < self.ttl_ms
    }

    /// The copy of account `id`, if it was read less than the TTL before
    /// `now_ms`.
    pub(crate) fn get(&self, id: &str, now_ms: i64) -> Option<(AccountRow, Jwk)> {
        let book = self.book();
        let entry = book.copies.get(id).filter(|e| self.fresh(e, now_ms))?;
        Some((entry.account.clone(), entry.key.clone()))
    }

    /// To be taken before reading an account from the store and handed to
    /// [`KnownAccounts::put`]: a change committed and forgotten while the
    /// read was under way moves it, and the read's copy is then not kept —
    /// it may be of the account before the change.
    pub(crate) fn generation(&self) -> u64 {
        self.book().generation
    }

    /// Keeps a copy of `account`, read from the store at `read_ms`, unless
    /// an account was forgotten since `generation` was taken.
    pub(crate) fn put(&self, account: &AccountRow, key: &Jwk, read_ms: i64, generation: u64) {
        if self.ttl_ms == 0 {
            return;
        }
        let mut book = self.book();
        if book.generation != generation {
            return;
        }
        if book.copies.len() >= CAPACITY && !book.copies.contains_key(&account.id) {
            book.copies.retain(|_, e| self.fresh(e, read_ms));
            if book.copies.len() >= CAPACITY {
                book.copies.clear();
            }
        }
        book.copies.insert(
            account.id.clone(),
            Entry {
                account: account.clone(),
                key: key.clone(),
                read_ms,
            },
        );
    }

    /// Drops the copy of account `id`: this process changed it, or a
    /// guarded write found it changed.
    pub(crate) fn forget(&self, id: &str) {
        let mut book = self.book();
        book.generation = book.generation.wrapping_add(1);
        book.copies.remove(id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn account(id: &str) -> AccountRow {
        AccountRow {
            id: id.to_owned(),
            profile: "default".to_owned(),
            key_thumbprint: "thumb".to_owned(),
            jwk: "{}".to_owned(),
            status: acme_proxy_protocol::types::AccountStatus::Valid,
            contact: Vec::new(),
            tos_agreed: true,
            created_at: 1,
            eab_kid: None,
        }
    }

    fn key() -> Jwk {
        Jwk::Ed25519 { x: vec![7; 32] }
    }

    #[test]
    fn a_copy_is_used_until_its_ttl_ends_and_never_after_it_is_forgotten() {
        let known = KnownAccounts::new(Duration::from_millis(1_000));
        known.put(&account("a"), &key(), 10_000, known.generation());
        assert_eq!(known.get("a", 10_999).unwrap().0, account("a"));
        assert!(known.get("a", 11_000).is_none(), "expired at the TTL");
        assert!(known.get("a", 9_000).is_none(), "a clock stepped back");
        assert!(known.get("b", 10_000).is_none());
        known.put(&account("a"), &key(), 20_000, known.generation());
        known.forget("a");
        assert!(known.get("a", 20_001).is_none(), "forgotten");
    }

    #[test]
    fn a_copy_read_before_a_change_was_forgotten_is_not_kept() {
        let known = KnownAccounts::new(Duration::from_millis(1_000));
        // A request takes the generation and reads the account; meanwhile
        // another commits a change to an account and forgets its copy.
        let before = known.generation();
        known.forget("a");
        known.put(&account("a"), &key(), 10_000, before);
        assert!(known.get("a", 10_000).is_none());
        known.put(&account("a"), &key(), 10_000, known.generation());
        assert!(known.get("a", 10_000).is_some());
    }

    #[test]
    fn a_zero_ttl_keeps_nothing() {
        let known = KnownAccounts::new(Duration::ZERO);
        known.put(&account("a"), &key(), 10_000, known.generation());
        assert!(known.book().copies.is_empty());
    }

    #[test]
    fn past_its_capacity_the_cache_drops_expired_copies_first_and_else_all() {
        let known = KnownAccounts::new(Duration::from_millis(1_000));
        for i in 0..CAPACITY - 1 {
            known.put(&account(&format!("old{i}")), &key(), 0, 0);
        }
        known.put(&account("live"), &key(), 500, 0);
        // Full: the next copy makes room by dropping the expired ones.
        known.put(&account("new"), &key(), 1_200, 0);
        assert!(known.get("live", 1_200).is_some());
        assert!(known.get("new", 1_200).is_some());
        assert_eq!(known.book().copies.len(), 2);
        // Full of live copies: all go for the next one.
        for i in 0..CAPACITY - 2 {
            known.put(&account(&format!("young{i}")), &key(), 1_300, 0);
        }
        assert_eq!(known.book().copies.len(), CAPACITY);
        known.put(&account("last"), &key(), 1_300, 0);
        assert!(known.get("young0", 1_300).is_none());
        assert!(known.get("last", 1_300).is_some());
        assert_eq!(known.book().copies.len(), 1);
    }
}
