//! Accounts (RFC 8555 §7.1.2, §7.3).

use sqlx::{Connection, Row};

use crate::jobs::insert_jobs_in;
use crate::{NewJob, Result, Store, json_vec, to_json};

/// An account as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountRow {
    pub id: String,
    pub profile: String,
    pub key_thumbprint: String,
    /// The account's public JWK, canonical JSON.
    pub jwk: String,
    pub status: String,
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

macro_rules! account_columns {
    () => {
        "id, profile, key_thumbprint, jwk, status, contact, tos_agreed, created_at, eab_kid"
    };
}

fn account_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<AccountRow> {
    Ok(AccountRow {
        id: row.try_get("id")?,
        profile: row.try_get("profile")?,
        key_thumbprint: row.try_get("key_thumbprint")?,
        jwk: row.try_get("jwk")?,
        status: row.try_get("status")?,
        contact: json_vec(&row.try_get::<String, _>("contact")?)?,
        tos_agreed: row.try_get("tos_agreed")?,
        created_at: row.try_get("created_at")?,
        eab_kid: row.try_get("eab_kid")?,
    })
}

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
        let inserted = sqlx::query(
            "INSERT INTO accounts (id, profile, key_thumbprint, jwk, status, contact, tos_agreed, created_at, eab_kid)
             VALUES ($1, $2, $3, $4, 'valid', $5, $6, $7, $8)
             ON CONFLICT (profile, key_thumbprint) DO NOTHING",
        )
        .bind(new.id)
        .bind(new.profile)
        .bind(new.key_thumbprint)
        .bind(new.jwk)
        .bind(to_json(new.contact))
        .bind(new.tos_agreed)
        .bind(new.now)
        .bind(new.eab_kid)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if inserted {
            insert_jobs_in(&mut tx, notices).await?;
        }
        let row = sqlx::query(concat!(
            "SELECT ",
            account_columns!(),
            " FROM accounts WHERE profile = $1 AND key_thumbprint = $2"
        ))
        .bind(new.profile)
        .bind(new.key_thumbprint)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((account_from_row(&row)?, inserted))
    }

    pub async fn account_by_key(
        &self,
        profile: &str,
        thumbprint: &str,
    ) -> Result<Option<AccountRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            account_columns!(),
            " FROM accounts WHERE profile = $1 AND key_thumbprint = $2"
        ))
        .bind(profile)
        .bind(thumbprint)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.as_ref().map(account_from_row).transpose()
    }

    pub async fn account(&self, id: &str) -> Result<Option<AccountRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            account_columns!(),
            " FROM accounts WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.as_ref().map(account_from_row).transpose()
    }

    /// Replaces the contact list of a valid account. Returns false if the
    /// account is not valid (any more).
    pub async fn update_account_contact(&self, id: &str, contact: &[String]) -> Result<bool> {
        Ok(
            sqlx::query("UPDATE accounts SET contact = $1 WHERE id = $2 AND status = 'valid'")
                .bind(to_json(contact))
                .bind(id)
                .execute(&mut *self.writer().await?)
                .await?
                .rows_affected()
                == 1,
        )
    }

    /// Records agreement to the terms of service on a valid account.
    pub async fn agree_account_tos(&self, id: &str) -> Result<bool> {
        Ok(
            sqlx::query("UPDATE accounts SET tos_agreed = 1 WHERE id = $1 AND status = 'valid'")
                .bind(id)
                .execute(&mut *self.writer().await?)
                .await?
                .rows_affected()
                == 1,
        )
    }

    /// valid → deactivated (RFC 8555 §7.3.6), guarded. Also deactivates the
    /// account's pending and valid authorizations and invalidates its
    /// unfinished orders, in one transaction: nothing signed by a deactivated
    /// account may progress. `notices` are queued with the change.
    pub async fn deactivate_account(&self, id: &str, notices: &[NewJob<'_>]) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let changed = sqlx::query(
            "UPDATE accounts SET status = 'deactivated' WHERE id = $1 AND status = 'valid'",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if changed {
            sqlx::query(
                "UPDATE authorizations SET status = 'deactivated'
                 WHERE account_id = $1 AND status IN ('pending', 'valid')",
            )
            .bind(id)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE orders SET status = 'invalid' WHERE account_id = $1 AND status IN ('pending', 'ready')",
            )
            .bind(id)
            .execute(&mut *tx)
            .await?;
            insert_jobs_in(&mut tx, notices).await?;
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
        let holder: Option<String> = sqlx::query_scalar(
            "SELECT id FROM accounts WHERE profile = $1 AND key_thumbprint = $2",
        )
        .bind(profile)
        .bind(new_thumbprint)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(account_id) = holder {
            return Ok(KeyChangeOutcome::NewKeyInUse { account_id });
        }
        let changed = sqlx::query(
            "UPDATE accounts SET key_thumbprint = $1, jwk = $2
             WHERE id = $3 AND key_thumbprint = $4 AND status = 'valid'",
        )
        .bind(new_thumbprint)
        .bind(new_jwk)
        .bind(id)
        .bind(old_thumbprint)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        tx.commit().await?;
        Ok(if changed {
            KeyChangeOutcome::Changed
        } else {
            KeyChangeOutcome::Stale
        })
    }
}

impl Store {
    /// Accounts for operators, newest first.
    pub async fn list_accounts(
        &self,
        profile: Option<&str>,
        status: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AccountRow>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            account_columns!(),
            " FROM accounts WHERE ($1 IS NULL OR profile = $1) AND ($2 IS NULL OR status = $2)
              ORDER BY created_at DESC, id DESC LIMIT $3"
        ))
        .bind(profile)
        .bind(status)
        .bind(limit)
        .fetch_all(&mut *self.reader().await?)
        .await?;
        rows.iter().map(account_from_row).collect()
    }

    /// How many orders and certificates an account has.
    pub async fn account_counts(&self, id: &str) -> Result<(i64, i64)> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM orders WHERE account_id = $1) AS orders,
                    (SELECT COUNT(*) FROM certificates WHERE account_id = $1) AS certificates",
        )
        .bind(id)
        .fetch_one(&mut *self.reader().await?)
        .await?;
        Ok((row.try_get("orders")?, row.try_get("certificates")?))
    }
}
