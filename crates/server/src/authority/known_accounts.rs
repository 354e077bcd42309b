//! Accounts that signed recent requests, kept in memory with their parsed
//! keys (`account_cache_ttl`). Seven of an issuance's eight requests are
//! signed with a `kid` (RFC 8555 §6.2); reading the account and parsing its
//! key for each was 6 % of the server's CPU (docs/performance.md).
//!
//! What a copy may decide is bounded three ways:
//!
//! - every change this process makes to an account forgets its copy at once
//!   (a client's own deactivation or key rollover, §7.3.5–§7.3.6);
//! - every write a request makes carries an [`AccountGuard`]: the store
//!   checks, in the write's own transaction, that the account is still valid
//!   with the key that signed, since another process (the admin CLI) may
//!   have deactivated, deleted or rekeyed it;
//! - so only a POST-as-GET of the account's own resources can be answered
//!   from a copy another process made stale, and for at most the TTL.
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
    copies: Mutex<HashMap<String, Copy>>,
}

#[derive(Clone, Debug)]
struct Copy {
    account: AccountRow,
    key: Jwk,
    /// Unix milliseconds past which the copy is not used.
    until_ms: i64,
}

impl KnownAccounts {
    /// A TTL of zero keeps nothing.
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            ttl_ms: ttl.as_millis().try_into().unwrap_or(i64::MAX),
            copies: Mutex::new(HashMap::new()),
        }
    }

    fn copies(&self) -> std::sync::MutexGuard<'_, HashMap<String, Copy>> {
        self.copies.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The copy of account `id`, if one was made less than the TTL before
    /// `now_ms`.
    pub(crate) fn get(&self, id: &str, now_ms: i64) -> Option<(AccountRow, Jwk)> {
        let copies = self.copies();
        let copy = copies.get(id).filter(|c| now_ms < c.until_ms)?;
        Some((copy.account.clone(), copy.key.clone()))
    }

    /// Keeps a copy of `account`, read from the store at `now_ms`.
    pub(crate) fn put(&self, account: &AccountRow, key: &Jwk, now_ms: i64) {
        if self.ttl_ms == 0 {
            return;
        }
        let mut copies = self.copies();
        if copies.len() >= CAPACITY && !copies.contains_key(&account.id) {
            copies.retain(|_, c| now_ms < c.until_ms);
            if copies.len() >= CAPACITY {
                copies.clear();
            }
        }
        copies.insert(
            account.id.clone(),
            Copy {
                account: account.clone(),
                key: key.clone(),
                until_ms: now_ms.saturating_add(self.ttl_ms),
            },
        );
    }

    /// Drops the copy of account `id`: it changed, or a guarded write found
    /// it changed.
    pub(crate) fn forget(&self, id: &str) {
        self.copies().remove(id);
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
            status: "valid".to_owned(),
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
        known.put(&account("a"), &key(), 10_000);
        assert_eq!(known.get("a", 10_999).unwrap().0, account("a"));
        assert!(known.get("a", 11_000).is_none(), "expired at the TTL");
        assert!(known.get("b", 10_000).is_none());
        known.put(&account("a"), &key(), 20_000);
        known.forget("a");
        assert!(known.get("a", 20_001).is_none(), "forgotten");
    }

    #[test]
    fn a_zero_ttl_keeps_nothing() {
        let known = KnownAccounts::new(Duration::ZERO);
        known.put(&account("a"), &key(), 10_000);
        assert!(known.get("a", 10_000).is_none());
    }

    #[test]
    fn past_its_capacity_the_cache_drops_expired_copies_first() {
        let known = KnownAccounts::new(Duration::from_millis(1_000));
        for i in 0..CAPACITY - 1 {
            known.put(&account(&format!("old{i}")), &key(), 0);
        }
        known.put(&account("live"), &key(), 500);
        // Full: the next copy makes room by dropping the expired ones.
        known.put(&account("new"), &key(), 1_200);
        assert!(known.get("live", 1_200).is_some());
        assert!(known.get("new", 1_200).is_some());
        assert_eq!(known.copies().len(), 2);
    }
}
