//! External Account Binding credentials (RFC 8555 §7.3.4), minted by the
//! operator and named by accounts at registration.

use crate::db::{Row, args};
use crate::{NewAuditRow, Result, Store, StoreError};

/// A credential as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct EabRow {
    pub kid: String,
    /// The raw HMAC key. Never logged, never printed after creation.
    pub hmac_key: Vec<u8>,
    pub label: Option<String>,
    /// The one profile it may be used at; none: any.
    pub profile: Option<String>,
    /// Name globs its accounts may order; none: any name.
    pub names: Option<Vec<String>>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    /// Accounts registered with it.
    pub accounts: i64,
}

impl std::fmt::Debug for EabRow {
    // Never the HMAC key, whatever logs a row.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EabRow")
            .field("kid", &self.kid)
            .field("hmac_key", &"<redacted>")
            .field("label", &self.label)
            .field("profile", &self.profile)
            .field("names", &self.names)
            .field("created_at", &self.created_at)
            .field("revoked_at", &self.revoked_at)
            .field("accounts", &self.accounts)
            .finish()
    }
}

/// What [`Store::insert_eab`] needs.
#[derive(Clone)]
pub struct NewEab<'a> {
    pub kid: &'a str,
    pub hmac_key: &'a [u8],
    pub label: Option<&'a str>,
    pub profile: Option<&'a str>,
    pub names: Option<&'a [String]>,
    pub now: i64,
}

macro_rules! eab_columns {
    () => {
        "kid, hmac_key, label, profile, names, created_at, revoked_at, \
         (SELECT COUNT(*) FROM accounts a WHERE a.eab_kid = eab_credentials.kid) AS accounts"
    };
}

fn from_row(row: Row<'_>) -> Result<EabRow> {
    let names = row
        .get::<Option<String>>("names")?
        .map(|s| {
            serde_json::from_str(&s)
                .map_err(|e| StoreError::Corrupt(format!("eab_credentials.names: {e}")))
        })
        .transpose()?;
    Ok(EabRow {
        kid: row.get("kid")?,
        hmac_key: row.get("hmac_key")?,
        label: row.get("label")?,
        profile: row.get("profile")?,
        names,
        created_at: row.get("created_at")?,
        revoked_at: row.get("revoked_at")?,
        accounts: row.get("accounts")?,
    })
}

impl Store {
    /// Stores a new credential with its `eab.created` row, in one
    /// transaction: no credential exists that the audit trail does not
    /// show.
    pub async fn insert_eab(&self, new: &NewEab<'_>, audit: &NewAuditRow<'_>) -> Result<()> {
        self.change_audited(
            "INSERT INTO eab_credentials (kid, hmac_key, label, profile, names, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            args![
                new.kid,
                new.hmac_key,
                new.label,
                new.profile,
                new.names.map(crate::to_json),
                new.now,
            ],
            Some(audit),
        )
        .await?;
        Ok(())
    }

    pub async fn eab(&self, kid: &str) -> Result<Option<EabRow>> {
        self.reader()
            .await?
            .one(
                concat!(
                    "SELECT ",
                    eab_columns!(),
                    " FROM eab_credentials WHERE kid = ?1"
                ),
                args![kid],
                from_row,
            )
            .await
    }

    /// Credentials, newest first, `limit` of them older than `before`
    /// (created_at, kid) when given: a page.
    pub async fn list_eab(&self, before: Option<(i64, &str)>, limit: i64) -> Result<Vec<EabRow>> {
        let (before_at, before_kid) = before.unzip();
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    eab_columns!(),
                    " FROM eab_credentials
                     WHERE (?1 IS NULL OR created_at < ?1 OR (created_at = ?1 AND kid < ?2))
                     ORDER BY created_at DESC, kid DESC LIMIT ?3"
                ),
                args![before_at, before_kid, limit],
                from_row,
            )
            .await
    }

    /// Marks a credential revoked; false if it does not exist or already was.
    /// Revokes a credential with its audit row, in one transaction; false
    /// (nothing written) when it is unknown or already revoked.
    pub async fn revoke_eab(&self, kid: &str, now: i64, audit: &NewAuditRow<'_>) -> Result<bool> {
        self.change_audited(
            "UPDATE eab_credentials SET revoked_at = ?2 WHERE kid = ?1 AND revoked_at IS NULL",
            args![kid, now],
            Some(audit),
        )
        .await
    }
}
