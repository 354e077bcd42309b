//! Issued certificates, revocation (RFC 8555 §7.6) and CRLs (RFC 5280 §5).

use acme_proxy_protocol::types::Identifier;
use sqlx::sqlite::SqliteRow;
use sqlx::{Connection, Row};

use crate::audit::{NewAuditRow, insert_audit_in};
use crate::jobs::insert_jobs_in;
use crate::{NewJob, Result, Store, StoreError, to_json};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateRow {
    pub id: String,
    pub profile: String,
    pub order_id: String,
    pub account_id: String,
    /// Lowercase hex, no separators.
    pub serial: String,
    pub chain_pem: String,
    pub key_thumbprint: Option<String>,
    pub identifiers: Vec<Identifier>,
    pub not_before: i64,
    pub not_after: i64,
    pub revoked_at: Option<i64>,
    pub revocation_reason: Option<i64>,
    pub created_at: i64,
}

#[derive(Clone, Debug)]
pub struct NewCertificateRow<'a> {
    pub id: &'a str,
    pub profile: &'a str,
    pub order_id: &'a str,
    pub account_id: &'a str,
    pub serial: &'a str,
    pub chain_pem: &'a str,
    pub key_thumbprint: Option<&'a str>,
    pub identifiers: &'a [Identifier],
    pub not_before: i64,
    pub not_after: i64,
    pub now: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RevokeOutcome {
    Revoked,
    AlreadyRevoked,
    NotFound,
}

/// One line of a CRL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevokedEntry {
    pub serial: String,
    pub revoked_at: i64,
    pub reason: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrlRow {
    pub number: i64,
    pub this_update: i64,
    pub next_update: i64,
    pub der: Vec<u8>,
}

macro_rules! cert_columns {
    () => {
        "id, profile, order_id, account_id, serial, chain_pem, key_thumbprint, \
     identifiers, not_before, not_after, revoked_at, revocation_reason, created_at"
    };
}

fn cert_from_row(row: &SqliteRow) -> Result<CertificateRow> {
    let identifiers: String = row.try_get("identifiers")?;
    Ok(CertificateRow {
        id: row.try_get("id")?,
        profile: row.try_get("profile")?,
        order_id: row.try_get("order_id")?,
        account_id: row.try_get("account_id")?,
        serial: row.try_get("serial")?,
        chain_pem: row.try_get("chain_pem")?,
        key_thumbprint: row.try_get("key_thumbprint")?,
        identifiers: serde_json::from_str(&identifiers)
            .map_err(|e| StoreError::Corrupt(format!("identifiers: {e}")))?,
        not_before: row.try_get("not_before")?,
        not_after: row.try_get("not_after")?,
        revoked_at: row.try_get("revoked_at")?,
        revocation_reason: row.try_get("revocation_reason")?,
        created_at: row.try_get("created_at")?,
    })
}

impl Store {
    /// Stores the certificate and moves its order processing → valid, in one
    /// transaction. False (nothing written) if the order was not processing:
    /// with the `UNIQUE (order_id)` constraint this makes "exactly one
    /// certificate per order" hold whatever the callers do. `notices` are
    /// queued, and the issuance's `audit` row written, with it.
    pub async fn complete_order(
        &self,
        cert: &NewCertificateRow<'_>,
        audit: &NewAuditRow<'_>,
        notices: &[NewJob<'_>],
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        if !complete_order_in(&mut tx, cert).await? {
            return Ok(false);
        }
        insert_audit_in(&mut *tx, audit).await?;
        insert_jobs_in(&mut tx, notices).await?;
        tx.commit().await?;
        Ok(true)
    }

    pub async fn certificate(&self, id: &str) -> Result<Option<CertificateRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            cert_columns!(),
            " FROM certificates WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.as_ref().map(cert_from_row).transpose()
    }

    pub async fn certificate_by_serial(
        &self,
        profile: &str,
        serial: &str,
    ) -> Result<Option<CertificateRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            cert_columns!(),
            " FROM certificates WHERE profile = $1 AND serial = $2"
        ))
        .bind(profile)
        .bind(serial)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.as_ref().map(cert_from_row).transpose()
    }

    /// Revokes once: a second revocation of one serial is `AlreadyRevoked`
    /// even when both race. `notices` are queued with the revocation.
    pub async fn revoke_certificate(
        &self,
        profile: &str,
        serial: &str,
        reason: Option<i64>,
        now: i64,
        notices: &[NewJob<'_>],
    ) -> Result<RevokeOutcome> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let changed = sqlx::query(
            "UPDATE certificates SET revoked_at = $1, revocation_reason = $2
             WHERE profile = $3 AND serial = $4 AND revoked_at IS NULL",
        )
        .bind(now)
        .bind(reason)
        .bind(profile)
        .bind(serial)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if changed == 1 {
            insert_jobs_in(&mut tx, notices).await?;
            tx.commit().await?;
            return Ok(RevokeOutcome::Revoked);
        }
        let exists: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM certificates WHERE profile = $1 AND serial = $2")
                .bind(profile)
                .bind(serial)
                .fetch_optional(&mut *tx)
                .await?;
        Ok(if exists.is_some() {
            RevokeOutcome::AlreadyRevoked
        } else {
            RevokeOutcome::NotFound
        })
    }

    /// Every revoked, not yet expired certificate of a profile, for its CRL.
    pub async fn revoked_entries(&self, profile: &str, now: i64) -> Result<Vec<RevokedEntry>> {
        let rows = sqlx::query(
            "SELECT serial, revoked_at, revocation_reason FROM certificates
             WHERE profile = $1 AND revoked_at IS NOT NULL AND not_after > $2 ORDER BY revoked_at, serial",
        )
        .bind(profile)
        .bind(now)
        .fetch_all(&mut *self.reader().await?)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(RevokedEntry {
                    serial: row.try_get("serial")?,
                    revoked_at: row.try_get("revoked_at")?,
                    reason: row.try_get("revocation_reason")?,
                })
            })
            .collect()
    }

    /// When the most recent revocation of a profile happened.
    pub async fn latest_revocation(&self, profile: &str) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT MAX(revoked_at) FROM certificates WHERE profile = $1 AND revoked_at IS NOT NULL",
        )
        .bind(profile)
        .fetch_one(&mut *self.reader().await?)
        .await?)
    }

    /// The newest CRL of a profile.
    pub async fn crl(&self, profile: &str) -> Result<Option<CrlRow>> {
        let row = sqlx::query(
            "SELECT number, this_update, next_update, der FROM crls WHERE profile = $1",
        )
        .bind(profile)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.map(|row| {
            Ok(CrlRow {
                number: row.try_get("number")?,
                this_update: row.try_get("this_update")?,
                next_update: row.try_get("next_update")?,
                der: row.try_get("der")?,
            })
        })
        .transpose()
    }

    /// The CRL number to use next: one more than the last stored, so CRL
    /// numbers only grow (RFC 5280 §5.2.3).
    pub async fn next_crl_number(&self, profile: &str) -> Result<i64> {
        let last: Option<i64> = sqlx::query_scalar("SELECT number FROM crls WHERE profile = $1")
            .bind(profile)
            .fetch_optional(&mut *self.writer().await?)
            .await?;
        Ok(last.unwrap_or(0) + 1)
    }

    /// Stores a CRL unless a newer one (higher number) is already stored;
    /// returns whether it was stored.
    pub async fn store_crl(&self, profile: &str, crl: &CrlRow) -> Result<bool> {
        Ok(sqlx::query(
            "INSERT INTO crls (profile, number, this_update, next_update, der) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (profile) DO UPDATE SET number = excluded.number, this_update = excluded.this_update,
                 next_update = excluded.next_update, der = excluded.der
             WHERE excluded.number > crls.number",
        )
        .bind(profile)
        .bind(crl.number)
        .bind(crl.this_update)
        .bind(crl.next_update)
        .bind(&crl.der)
        .execute(&mut *self.writer().await?)
        .await?
        .rows_affected()
            == 1)
    }
}

/// The certificate row and processing → valid, inside the caller's
/// transaction; false (nothing written) when the order is not processing.
pub(crate) async fn complete_order_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    cert: &NewCertificateRow<'_>,
) -> Result<bool> {
    // Written only while the order is processing (the guard and the insert
    // are one statement); the status change follows (a trigger wants the
    // certificate there first).
    let inserted = sqlx::query(
        "INSERT INTO certificates (id, profile, order_id, account_id, serial, chain_pem, key_thumbprint,
             identifiers, not_before, not_after, created_at)
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11
          WHERE EXISTS (SELECT 1 FROM orders WHERE id = $3 AND status = 'processing')",
    )
    .bind(cert.id)
    .bind(cert.profile)
    .bind(cert.order_id)
    .bind(cert.account_id)
    .bind(cert.serial)
    .bind(cert.chain_pem)
    .bind(cert.key_thumbprint)
    .bind(to_json(cert.identifiers))
    .bind(cert.not_before)
    .bind(cert.not_after)
    .bind(cert.now)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if inserted != 1 {
        return Ok(false);
    }
    sqlx::query("UPDATE orders SET status = 'valid' WHERE id = $1 AND status = 'processing'")
        .bind(cert.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(true)
}
