//! What the store's tests share: a fresh store in a directory, and the
//! rows and guard of the account their hand-written rows belong to.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use crate::{AccountGuard, NewAuditRow, NewCertificateRow, Store, StoreOptions};

/// The account the tests' hand-written rows belong to.
pub(crate) const ACCOUNT: &str =
    "INSERT INTO accounts (id, profile, key_thumbprint, jwk, status, created_at)
             VALUES ('acct', 'default', 'thumb', '{}', 'valid', 1);";

/// A certificate of [`ACCOUNT`]'s for `order_id`.
pub(crate) fn cert_row(
    id: &'static str,
    order_id: &'static str,
    serial: &'static str,
) -> NewCertificateRow<'static> {
    NewCertificateRow {
        id,
        profile: "default",
        order_id,
        account_id: "acct",
        serial,
        chain_pem: "PEM",
        key_thumbprint: None,
        identifiers: &[],
        not_before: 1,
        not_after: 2,
        now: 1,
    }
}

/// The audit row of an issuance for `order_id`.
pub(crate) fn issued_row(order_id: &'static str) -> NewAuditRow<'static> {
    NewAuditRow {
        at: 1,
        event: "certificate.issued",
        outcome: "success",
        actor: "account:acct",
        order_id: Some(order_id),
        ..Default::default()
    }
}

/// [`ACCOUNT`] as a request signed with its key carries it.
pub(crate) const GUARD: AccountGuard<'static> = AccountGuard {
    id: "acct",
    key_thumbprint: "thumb",
};

/// A store on a fresh `t.db` in `dir`, and the file's path.
pub(crate) async fn open_in(dir: &Path) -> (std::path::PathBuf, Store) {
    let path = dir.join("t.db");
    let url = format!("sqlite:{}", path.display());
    let store = Store::open(&url, &StoreOptions::default()).await.unwrap();
    (path, store)
}
