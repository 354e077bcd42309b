//! Accounts (RFC 8555 §7.1.2, §7.3).

use acme_proxy_protocol::types::AccountStatus;

use crate::audit::insert_audit_in;
use crate::db::{Conn, Row, args, col, col_enum};
use crate::jobs::insert_jobs_in;
use crate::{NewAuditRow, NewJob, Result, Store, StoreError, json_vec, to_json};

/// An account as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountRow {
    pub id: String,
    pub profile: String,
    pub key_thumbprint: String,
    /// The account's public JWK, canonical JSON.
    pub jwk: String,
    pub status: AccountStatus,
    pub contact: Vec<String>,
    pub tos_agreed: bool,
    pub created_at: i64,
    /// The External Account Binding credential it registered with (§7.3.4).
    pub eab_kid: Option<String>,
}

/// What [`Store::insert_account`] needs.
#[derive(Clone, Debug)]
pub struct NewAccountRow<'a> {
    pub id: &'a str,
    pub profile: &'a str,
    pub key_thumbprint: &'a str,
    pub jwk: &'a str,
    pub contact: &'a [String],
    pub tos_agreed: bool,
    pub eab_kid: Option<&'a str>,
    pub now: i64,
}

/// The outcome of a key rollover (RFC 8555 §7.3.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyChangeOutcome {
    Changed,
    /// The new key already belongs to this account (same profile).
    NewKeyInUse {
        account_id: String,
    },
    /// The account's key was not `old_thumbprint` any more, or it is not valid.
    Stale,
}

// Read by position in `account_from_row`: a column added goes at the end.
macro_rules! account_columns {
    () => {
        "id, profile, key_thumbprint, jwk, status, contact, tos_agreed, created_at, eab_kid"
    };
}

/// A row of `account_columns!`, read by position (one per request).
fn account_from_row(row: Row<'_>) -> Result<AccountRow> {
    Ok(AccountRow {
        id: col(row, 0, "id")?,
        profile: col(row, 1, "profile")?,
        key_thumbprint: col(row, 2, "key_thumbprint")?,
        jwk: col(row, 3, "jwk")?,
        status: col_enum(row, 4, "status", "accounts.status")?,
        contact: json_vec(&col::<String>(row, 5, "contact")?)?,
        tos_agreed: col(row, 6, "tos_agreed")?,
        created_at: col(row, 7, "created_at")?,
        eab_kid: col(row, 8, "eab_kid")?,
    })
}

/// The account a request was verified as — its id and the thumbprint of
/// the key that signed — for a write to check, inside its own transaction,
/// that the account is still valid with that key.
///
/// The front end may verify a request with a copy of the account it keeps
/// in memory (`account_cache_ttl`); another process (the admin CLI) can
/// deactivate, delete or rekey the account meanwhile. A write that carries
/// the guard refuses with [`StoreError::AccountChanged`] and writes nothing
/// then, so what a request changes is decided on the account as it is when
/// the change is made (RFC 8555 §7.3.6: a deactivated account's requests
/// are not accepted).
#[derive(Clone, Copy, Debug)]
pub struct AccountGuard<'a> {
    pub id: &'a str,
    pub key_thumbprint: &'a str,
}

macro_rules! account_is_valid_with_key {
    () => {
        "SELECT 1 FROM accounts WHERE id = ?1 AND key_thumbprint = ?2 AND status = 'valid'"
    };
}

/// Whether `e` is a store PostgreSQL function's refusal with SQLSTATE
/// `code` (migration 0022), which undid everything the function wrote.
pub(crate) fn raised(e: &StoreError, code: &str) -> bool {
    matches!(e, StoreError::Pg(sqlx::Error::Database(db)) if db.code().as_deref() == Some(code))
}

/// `e`, or [`StoreError::AccountChanged`] when `e` is a PostgreSQL
/// function's refusal of the account (SQLSTATE AP001).
pub(crate) fn account_changed_raised(e: StoreError) -> StoreError {
    if raised(&e, "AP001") {
        StoreError::AccountChanged
    } else {
        e
    }
}

impl AccountGuard<'_> {
    /// Errs with [`StoreError::AccountChanged`] unless the account is valid
    /// with the guard's key, as `conn`'s transaction sees it.
    pub(crate) async fn check_in(&self, conn: &mut Conn<'_>) -> Result<()> {
        // On PostgreSQL the row is locked until the transaction ends, so a
        // deactivation, deletion or rollover waits for this write (and
        // this write for one already under way), as SQLite's single
        // writer does by itself.
        let sql = if conn.is_postgres() {
            concat!(account_is_valid_with_key!(), " FOR SHARE")
        } else {
            account_is_valid_with_key!()
        };
        let valid = conn
            .exists(sql, args![self.id, self.key_thumbprint])
            .await?;
        if valid {
            Ok(())
        } else {
            Err(StoreError::AccountChanged)
        }
    }
}

const ACCOUNT_BY_KEY: &str = concat!(
    "SELECT ",
    account_columns!(),
    " FROM accounts WHERE profile = ?1 AND key_thumbprint = ?2"
);

impl Store {
    /// Creates an account, or finds the one that already holds this key at
    /// this profile; the flag is true when this call created it. Two
    /// concurrent newAccount requests with one key create one account.
    /// `notices` are queued in the same transaction, only if it created it.
    pub async fn insert_account(
        &self,
        new: &NewAccountRow<'_>,
        notices: &[NewJob<'_>],
    ) -> Result<(AccountRow, bool)> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let inserted = tx.exec(
            "INSERT INTO accounts (id, profile, key_thumbprint, jwk, status, contact, tos_agreed, created_at, eab_kid)
             VALUES (?1, ?2, ?3, ?4, 'valid', ?5, ?6, ?7, ?8)
             ON CONFLICT (profile, key_thumbprint) DO NOTHING",
            args![
                new.id,
                new.profile,
                new.key_thumbprint,
                new.jwk,
                to_json(new.contact),
                new.tos_agreed,
                new.now,
                new.eab_kid,
            ],
        ).await? == 1;
        if inserted {
            insert_jobs_in(&mut tx, notices).await?;
        }
        let row = tx
            .one(
                ACCOUNT_BY_KEY,
                args![new.profile, new.key_thumbprint],
                account_from_row,
            )
            .await?
            .ok_or(rusqlite::Error::QueryReturnedNoRows)?;
        tx.commit().await?;
        Ok((row, inserted))
    }

    pub async fn account_by_key(
        &self,
        profile: &str,
        thumbprint: &str,
    ) -> Result<Option<AccountRow>> {
        self.reader()
            .await?
            .one(ACCOUNT_BY_KEY, args![profile, thumbprint], account_from_row)
            .await
    }

    pub async fn account(&self, id: &str) -> Result<Option<AccountRow>> {
        self.point_reader()
            .await?
            .one(
                concat!(
                    "SELECT ",
                    account_columns!(),
                    " FROM accounts WHERE id = ?1"
                ),
                args![id],
                account_from_row,
            )
            .await
    }

    /// Replaces the contact list of a valid account. Returns false if the
    /// account is not valid (any more).
    pub async fn update_account_contact(&self, id: &str, contact: &[String]) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE accounts SET contact = ?1 WHERE id = ?2 AND status = 'valid'",
                args![to_json(contact), id],
            )
            .await?
            == 1)
    }

    /// Records agreement to the terms of service on a valid account.
    pub async fn agree_account_tos(&self, id: &str) -> Result<bool> {
        Ok(self
            .writer()
            .await?
            .exec(
                "UPDATE accounts SET tos_agreed = TRUE WHERE id = ?1 AND status = 'valid'",
                args![id],
            )
            .await?
            == 1)
    }

    /// valid → deactivated (RFC 8555 §7.3.6), guarded. Also deactivates the
    /// account's pending and valid authorizations and invalidates its
    /// unfinished orders, in one transaction: nothing signed by a deactivated
    /// account may progress. `notices` are queued, and `audit` (its
    /// `account.deactivated` row) written, with the change.
    pub async fn deactivate_account(
        &self,
        id: &str,
        notices: &[NewJob<'_>],
        audit: Option<&NewAuditRow<'_>>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let changed = tx
            .exec(
                "UPDATE accounts SET status = 'deactivated' WHERE id = ?1 AND status = 'valid'",
                args![id],
            )
            .await?
            == 1;
        if changed {
            tx.exec(
                "UPDATE authorizations SET status = 'deactivated'
                 WHERE account_id = ?1 AND status IN ('pending', 'valid')",
                args![id],
            )
            .await?;
            tx.exec(
                "UPDATE orders SET status = 'invalid' WHERE account_id = ?1 AND status IN ('pending', 'ready')",
                args![id],
            ).await?;
            insert_jobs_in(&mut tx, notices).await?;
            if let Some(audit) = audit {
                insert_audit_in(&mut tx, audit, self.audit_origin).await?;
            }
        }
        tx.commit().await?;
        Ok(changed)
    }

    /// Replaces an account's key (RFC 8555 §7.3.5), guarded on the old key so
    /// two concurrent rollovers cannot both win.
    pub async fn change_account_key(
        &self,
        id: &str,
        profile: &str,
        old_thumbprint: &str,
        new_thumbprint: &str,
        new_jwk: &str,
    ) -> Result<KeyChangeOutcome> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let holder: Option<String> = tx
            .scalar(
                "SELECT id FROM accounts WHERE profile = ?1 AND key_thumbprint = ?2",
                args![profile, new_thumbprint],
            )
            .await?;
        if let Some(account_id) = holder {
            return Ok(KeyChangeOutcome::NewKeyInUse { account_id });
        }
        let changed = tx
            .exec(
                "UPDATE accounts SET key_thumbprint = ?1, jwk = ?2
             WHERE id = ?3 AND key_thumbprint = ?4 AND status = 'valid'",
                args![new_thumbprint, new_jwk, id, old_thumbprint],
            )
            .await;
        let changed = match changed {
            // Another account took the key after the look-up (a rollover
            // committed meanwhile on PostgreSQL): that account holds it.
            Err(e) if e.is_unique_violation() => {
                drop(tx);
                let holder: Option<String> = conn
                    .scalar(
                        "SELECT id FROM accounts WHERE profile = ?1 AND key_thumbprint = ?2",
                        args![profile, new_thumbprint],
                    )
                    .await?;
                return Ok(match holder {
                    Some(account_id) => KeyChangeOutcome::NewKeyInUse { account_id },
                    None => KeyChangeOutcome::Stale,
                });
            }
            changed => changed? == 1,
        };
        tx.commit().await?;
        Ok(if changed {
            KeyChangeOutcome::Changed
        } else {
            KeyChangeOutcome::Stale
        })
    }
}

/// What the console's account search narrows by; none: every account.
#[derive(Clone, Debug, Default)]
pub struct AccountSearch<'a> {
    pub id: Option<&'a str>,
    /// A piece of a contact address.
    pub contact: Option<&'a str>,
    pub profile: Option<&'a str>,
    pub status: Option<AccountStatus>,
    /// Only accounts older than this one (created_at, id): the next page.
    pub before: Option<(i64, &'a str)>,
}

impl Store {
    /// Accounts for operators, newest first.
    pub async fn list_accounts(
        &self,
        profile: Option<&str>,
        status: Option<AccountStatus>,
        limit: i64,
    ) -> Result<Vec<AccountRow>> {
        self.reader()
            .await?
            .all(
                concat!(
                "SELECT ",
                account_columns!(),
                " FROM accounts WHERE (?1 IS NULL OR profile = ?1) AND (?2 IS NULL OR status = ?2)
                  ORDER BY created_at DESC, id DESC LIMIT ?3"
            ),
                args![profile, status.map(AccountStatus::as_str), limit],
                account_from_row,
            )
            .await
    }

    /// Accounts for the console, newest first, a page at a time (keyset on
    /// created_at, id): those whose id is `id`, or whose contacts contain
    /// `contact` (any case), of a profile and status.
    pub async fn search_accounts(
        &self,
        search: &AccountSearch<'_>,
        limit: i64,
    ) -> Result<Vec<AccountRow>> {
        let contact = search
            .contact
            .map(|c| format!("%{}%", c.to_lowercase().replace(['%', '_', '\\'], "")));
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    account_columns!(),
                    " FROM accounts
                  WHERE (?1 IS NULL OR id = ?1) AND (?2 IS NULL OR LOWER(contact) LIKE ?2)
                    AND (?3 IS NULL OR profile = ?3) AND (?4 IS NULL OR status = ?4)
                    AND (?5 IS NULL OR created_at < ?5 OR (created_at = ?5 AND id < ?6))
                  ORDER BY created_at DESC, id DESC LIMIT ?7"
                ),
                args![
                    search.id,
                    contact,
                    search.profile,
                    search.status.map(AccountStatus::as_str),
                    search.before.map(|(at, _)| at),
                    search.before.map(|(_, id)| id),
                    limit
                ],
                account_from_row,
            )
            .await
    }

    /// How many orders and certificates an account has.
    pub async fn account_counts(&self, id: &str) -> Result<(i64, i64)> {
        Ok(self
            .reader()
            .await?
            .one(
                "SELECT (SELECT COUNT(*) FROM orders WHERE account_id = ?1),
                    (SELECT COUNT(*) FROM certificates WHERE account_id = ?1)",
                args![id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .await?
            .unwrap_or((0, 0)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::test_support::{ACCOUNT, GUARD, TestDb, cert_row, issued_row};
    use crate::{
        AuditFilter, InsertOrder, NewAuthorization, NewChallenge, NewJob, NewOrderRow,
        NewUpstreamOrder, Result, StoreError,
    };

    #[tokio::test]
    async fn a_guarded_write_refuses_an_account_deactivated_deleted_or_rekeyed_since_and_writes_nothing()
     {
        use acme_proxy_protocol::types::Identifier;

        let (db, store) = TestDb::open().await;
        db.exec(&format!(
            "{ACCOUNT}
             INSERT INTO accounts (id, profile, key_thumbprint, jwk, status, created_at)
                 VALUES ('gone', 'default', 'gone-thumb', '{{}}', 'deactivated', 1);
             INSERT INTO orders (id, profile, account_id, status, identifiers, expires_at, created_at)
                 VALUES ('ready', 'default', 'acct', 'ready', '[]', 2, 1);"
        ))
        .await;
        let order = |id: &str| NewOrderRow {
            id: id.to_owned(),
            profile: "default".to_owned(),
            account_id: "acct".to_owned(),
            identifiers: vec![Identifier {
                kind: "dns".parse().unwrap(),
                value: "a.example".to_owned(),
            }],
            not_before: None,
            not_after: None,
            expires_at: 100,
            now: 1,
            authorizations: vec![NewAuthorization {
                id: format!("{id}-authz"),
                identifier: Identifier {
                    kind: "dns".parse().unwrap(),
                    value: "a.example".to_owned(),
                },
                wildcard: false,
                expires_at: 100,
                challenges: vec![NewChallenge {
                    id: format!("{id}-ch"),
                    kind: "http-01".parse().unwrap(),
                    token: "token".to_owned(),
                }],
            }],
            reuse_validated_since: None,
            certificate_profile: None,
            replaces: None,
            max_pending_authorizations: i64::MAX,
        };
        let changed = |r: Result<bool>| matches!(r, Err(StoreError::AccountChanged));
        // The account as the request was verified, and three ways it may
        // have changed since: another key, deactivated, deleted.
        let rekeyed = AccountGuard {
            id: "acct",
            key_thumbprint: "old-thumb",
        };
        let deactivated = AccountGuard {
            id: "gone",
            key_thumbprint: "gone-thumb",
        };
        let deleted = AccountGuard {
            id: "nobody",
            key_thumbprint: "thumb",
        };
        let cert = cert_row("c1", "ready", "c1");
        let audit = issued_row("ready");
        for stale in [rekeyed, deactivated, deleted] {
            let refused = store.insert_order(&order("o-stale"), stale).await;
            assert!(
                matches!(refused, Err(StoreError::AccountChanged)),
                "{refused:?}"
            );
        }
        assert!(store.order("o-stale").await.unwrap().is_none());
        assert!(matches!(
            store.insert_order(&order("o1"), GUARD).await.unwrap(),
            InsertOrder::Inserted(_)
        ));
        let job = NewJob {
            kind: "challenge_validation",
            key: "o1-ch",
            payload: "{}",
            run_at: 1,
            deadline: None,
            max_attempts: 1,
            fair_key: None,
        };
        let relayed = NewUpstreamOrder {
            order_id: "ready",
            profile: "default",
            account_id: "acct",
            csr_der: b"csr",
            client_ip: None,
            reverse_name: None,
            user_agent: None,
            request_id: None,
            now: 1,
        };
        for stale in [rekeyed, deactivated, deleted] {
            // The bypass checks the account once its update found the
            // challenge to move: one of `acct`'s, so only `acct` rekeyed is
            // refused as changed; for the other ids it is not theirs.
            let bypassed = store
                .bypass_challenge("o1-ch", "default", &["http-01"], 1, 50, stale)
                .await;
            if stale.id == "acct" {
                assert!(
                    matches!(bypassed, Err(StoreError::AccountChanged)),
                    "{bypassed:?}"
                );
            } else {
                assert!(matches!(bypassed, Ok(None)), "{bypassed:?}");
            }
            assert!(changed(
                store
                    .start_challenge_with_job("o1-ch", 1, &job, 1, stale)
                    .await
            ));
            assert!(changed(store.begin_finalize("ready", 1, &job, stale).await));
            assert!(changed(
                store.complete_ready_order(&cert, &audit, &[], stale).await
            ));
            // Refused as changed even where the order is not ready (`o1`
            // is pending), which alone would be answered "not ready".
            assert!(changed(
                store
                    .complete_ready_order(
                        &cert_row("c2", "o1", "c2"),
                        &issued_row("o1"),
                        &[],
                        stale
                    )
                    .await
            ));
            assert!(changed(store.begin_relay(&relayed, &job, 1, stale).await));
        }
        // `acct` itself deactivated (by hand, without the cascade): the
        // bypass that would move its challenge is refused.
        db.exec("UPDATE accounts SET status = 'deactivated' WHERE id = 'acct'")
            .await;
        let bypassed = store
            .bypass_challenge("o1-ch", "default", &["http-01"], 1, 50, GUARD)
            .await;
        assert!(
            matches!(bypassed, Err(StoreError::AccountChanged)),
            "{bypassed:?}"
        );
        db.exec("UPDATE accounts SET status = 'valid' WHERE id = 'acct'")
            .await;
        // Nothing of the refused writes: the challenge is pending, the
        // order ready without a certificate or upstream mapping, no job,
        // nothing audited.
        assert!(store.upstream_order("ready").await.unwrap().is_none());
        assert!(
            store
                .job_counts()
                .await
                .unwrap()
                .by_kind_and_status
                .is_empty()
        );
        let challenge = store.challenge("o1-ch").await.unwrap().unwrap();
        assert_eq!(challenge.status.as_str(), "pending");
        assert_eq!(
            store.order("o1").await.unwrap().unwrap().status.as_str(),
            "pending"
        );
        assert_eq!(
            store.order("ready").await.unwrap().unwrap().status.as_str(),
            "ready"
        );
        assert!(store.certificate("c1").await.unwrap().is_none());
        let audited = store.audit_list(&AuditFilter::default(), 10).await.unwrap();
        assert!(audited.is_empty(), "{audited:?}");
        // With the account as it is, the same writes go through.
        // Not at another profile, nor for another account.
        let other = AccountGuard {
            id: "gone",
            key_thumbprint: "gone-thumb",
        };
        db.exec("UPDATE accounts SET status = 'valid' WHERE id = 'gone'")
            .await;
        // Nor once the profile no longer offers the challenge's type.
        for (profile, offered, account) in [
            ("other", &["http-01"][..], GUARD),
            ("default", &["http-01"][..], other),
            ("default", &["dns-01", "tls-alpn-01"][..], GUARD),
            ("default", &[][..], GUARD),
        ] {
            let refused = store
                .bypass_challenge("o1-ch", profile, offered, 1, 50, account)
                .await
                .unwrap();
            assert!(refused.is_none(), "{profile} {offered:?}: {refused:?}");
        }
        let (challenge, authz) = store
            .bypass_challenge("o1-ch", "default", &["http-01"], 1, 50, GUARD)
            .await
            .unwrap()
            .unwrap();
        // As the transaction left them.
        assert_eq!(
            (challenge.status.as_str(), challenge.validated_at),
            ("valid", Some(1))
        );
        assert_eq!((authz.status.as_str(), authz.expires_at), ("valid", 50));
        // A second trigger finds it valid: nothing to do.
        assert!(
            store
                .bypass_challenge("o1-ch", "default", &["http-01"], 1, 50, GUARD)
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(
            store.order("o1").await.unwrap().unwrap().status.as_str(),
            "ready"
        );
        let watch = NewJob {
            kind: "finalize_watch",
            key: "ready",
            payload: "{}",
            run_at: 1,
            deadline: None,
            max_attempts: 1,
            fair_key: None,
        };
        assert!(
            store
                .begin_finalize("ready", 1, &watch, GUARD)
                .await
                .unwrap()
        );
        assert_eq!(
            store.order("ready").await.unwrap().unwrap().status.as_str(),
            "processing"
        );
        store.close().await;
    }
}
