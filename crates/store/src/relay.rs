//! The relay's rows: each relay profile's upstream account, and the mapping
//! from a local order to the order placed at the upstream CA
//! (SYSTEM.md "The relay, step by step").

use acme_proxy_protocol::Problem;
use sqlx::sqlite::SqliteRow;
use sqlx::{Connection, Row};

use crate::audit::{NewAuditRow, insert_audit_in};
use crate::certificates::{NewCertificateRow, complete_order_in};
use crate::jobs::insert_jobs_in;
use crate::{NewJob, Result, Store, to_json};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamAccountRow {
    pub profile: String,
    pub directory: String,
    pub account_url: String,
    pub key_thumbprint: String,
    pub created_at: i64,
}

/// The mapping row of one relayed order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamOrderRow {
    pub order_id: String,
    pub profile: String,
    pub account_id: String,
    pub csr_der: Vec<u8>,
    pub upstream_url: Option<String>,
    pub status: String,
    pub certificate_url: Option<String>,
    pub error: Option<String>,
    pub client_ip: Option<String>,
    pub reverse_name: Option<String>,
    pub user_agent: Option<String>,
    pub request_id: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// What the finalize request records before answering `processing`.
#[derive(Clone, Debug)]
pub struct NewUpstreamOrder<'a> {
    pub order_id: &'a str,
    pub profile: &'a str,
    pub account_id: &'a str,
    pub csr_der: &'a [u8],
    pub client_ip: Option<&'a str>,
    pub reverse_name: Option<&'a str>,
    pub user_agent: Option<&'a str>,
    pub request_id: Option<&'a str>,
    pub now: i64,
}

macro_rules! upstream_order_columns {
    () => {
        "order_id, profile, account_id, csr_der, upstream_url, status, certificate_url, error, \
         client_ip, reverse_name, user_agent, request_id, created_at, updated_at"
    };
}

fn upstream_order_from_row(row: &SqliteRow) -> Result<UpstreamOrderRow> {
    Ok(UpstreamOrderRow {
        order_id: row.try_get("order_id")?,
        profile: row.try_get("profile")?,
        account_id: row.try_get("account_id")?,
        csr_der: row.try_get("csr_der")?,
        upstream_url: row.try_get("upstream_url")?,
        status: row.try_get("status")?,
        certificate_url: row.try_get("certificate_url")?,
        error: row.try_get("error")?,
        client_ip: row.try_get("client_ip")?,
        reverse_name: row.try_get("reverse_name")?,
        user_agent: row.try_get("user_agent")?,
        request_id: row.try_get("request_id")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

impl Store {
    pub async fn upstream_account(&self, profile: &str) -> Result<Option<UpstreamAccountRow>> {
        let row = sqlx::query(
            "SELECT profile, directory, account_url, key_thumbprint, created_at
             FROM upstream_accounts WHERE profile = $1",
        )
        .bind(profile)
        .fetch_optional(&mut *self.reader().await?)
        .await?;
        row.map(|r| {
            Ok(UpstreamAccountRow {
                profile: r.try_get("profile")?,
                directory: r.try_get("directory")?,
                account_url: r.try_get("account_url")?,
                key_thumbprint: r.try_get("key_thumbprint")?,
                created_at: r.try_get("created_at")?,
            })
        })
        .transpose()
    }

    /// Records (or replaces, after a re-registration) a profile's upstream account.
    pub async fn save_upstream_account(&self, row: &UpstreamAccountRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO upstream_accounts (profile, directory, account_url, key_thumbprint, created_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (profile) DO UPDATE SET directory = excluded.directory,
                 account_url = excluded.account_url, key_thumbprint = excluded.key_thumbprint,
                 created_at = excluded.created_at",
        )
        .bind(&row.profile)
        .bind(&row.directory)
        .bind(&row.account_url)
        .bind(&row.key_thumbprint)
        .bind(row.created_at)
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(())
    }

    /// finalize of a relayed order, in one transaction: ready → processing,
    /// the mapping row (with the CSR; no upstream order yet), and the job.
    /// False when the order was not ready (another finalize won).
    pub async fn begin_relay(
        &self,
        row: &NewUpstreamOrder<'_>,
        job: &NewJob<'_>,
        now_ms: i64,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let started = sqlx::query(
            "UPDATE orders SET status = 'processing' WHERE id = $1 AND status = 'ready'",
        )
        .bind(row.order_id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !started {
            return Ok(false);
        }
        // A mapping left by an earlier finalize that the upstream refused
        // (the order went back to ready) is replaced.
        sqlx::query("DELETE FROM upstream_orders WHERE order_id = $1")
            .bind(row.order_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(concat!(
            "INSERT INTO upstream_orders (",
            upstream_order_columns!(),
            ") VALUES ($1, $2, $3, $4, NULL, 'processing', NULL, NULL, $5, $6, $7, $8, $9, $9)"
        ))
        .bind(row.order_id)
        .bind(row.profile)
        .bind(row.account_id)
        .bind(row.csr_der)
        .bind(row.client_ip)
        .bind(row.reverse_name)
        .bind(row.user_agent)
        .bind(row.request_id)
        .bind(row.now)
        .execute(&mut *tx)
        .await?;
        crate::jobs::insert_job_in(&mut *tx, job, now_ms).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Undoes [`Store::begin_relay`] when the upstream refused the order for
    /// good before anything else ran: the mapping goes, the queued job is
    /// cancelled, the order is ready again. False if the job already started
    /// (then it owns the outcome and nothing changes).
    pub async fn undo_relay(&self, order_id: &str, job_kind: &str, now_ms: i64) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let cancelled = sqlx::query(
            "UPDATE jobs SET status = 'cancelled', finished_at = $1, updated_at = $1,
                 last_error = 'the upstream refused the order at finalize'
             WHERE kind = $2 AND key = $3 AND status = 'queued' AND attempts = 0",
        )
        .bind(now_ms)
        .bind(job_kind)
        .bind(order_id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !cancelled {
            return Ok(false);
        }
        sqlx::query("DELETE FROM upstream_orders WHERE order_id = $1 AND status = 'processing'")
            .bind(order_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE orders SET status = 'ready' WHERE id = $1 AND status = 'processing'")
            .bind(order_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Records the upstream order URL unless one is already recorded (the
    /// job and the finalize request may both have created one; the first
    /// recorded wins). Returns the URL in force.
    pub async fn set_upstream_url(
        &self,
        order_id: &str,
        url: &str,
        now: i64,
    ) -> Result<Option<String>> {
        sqlx::query(
            "UPDATE upstream_orders SET upstream_url = $1, updated_at = $2
             WHERE order_id = $3 AND upstream_url IS NULL",
        )
        .bind(url)
        .bind(now)
        .bind(order_id)
        .execute(&mut *self.writer().await?)
        .await?;
        Ok(
            sqlx::query_scalar("SELECT upstream_url FROM upstream_orders WHERE order_id = $1")
                .bind(order_id)
                .fetch_optional(&mut *self.writer().await?)
                .await?
                .flatten(),
        )
    }

    pub async fn upstream_order(&self, order_id: &str) -> Result<Option<UpstreamOrderRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            upstream_order_columns!(),
            " FROM upstream_orders WHERE order_id = $1"
        ))
        .bind(order_id)
        .fetch_optional(&mut *self.writer().await?)
        .await?;
        row.as_ref().map(upstream_order_from_row).transpose()
    }

    /// Mapping rows, newest first, optionally of one status.
    pub async fn upstream_orders(
        &self,
        status: Option<&str>,
        limit: i64,
    ) -> Result<Vec<UpstreamOrderRow>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            upstream_order_columns!(),
            " FROM upstream_orders WHERE ($1 IS NULL OR status = $1)
             ORDER BY created_at DESC, order_id LIMIT $2"
        ))
        .bind(status)
        .bind(limit)
        .fetch_all(&mut *self.reader().await?)
        .await?;
        rows.iter().map(upstream_order_from_row).collect()
    }

    /// Settles a relayed order in one transaction: the certificate and
    /// processing → valid, the mapping valid with the certificate URL, and
    /// the audit row. False when the order was no longer processing.
    pub async fn settle_relay(
        &self,
        cert: &NewCertificateRow<'_>,
        certificate_url: &str,
        audit: &NewAuditRow<'_>,
        notices: &[NewJob<'_>],
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        if !complete_order_in(&mut tx, cert).await? {
            return Ok(false);
        }
        sqlx::query(
            "UPDATE upstream_orders SET status = 'valid', certificate_url = $1, error = NULL, updated_at = $2
             WHERE order_id = $3",
        )
        .bind(certificate_url)
        .bind(cert.now)
        .bind(cert.order_id)
        .execute(&mut *tx)
        .await?;
        insert_audit_in(&mut *tx, audit).await?;
        insert_jobs_in(&mut tx, notices).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Abandons a relayed order in one transaction: processing → invalid
    /// with the client's (generic) problem, the mapping invalid with the
    /// real reason, and the audit row. Idempotent: false, and nothing
    /// written, when the order had already left processing.
    pub async fn abandon_relay(
        &self,
        order_id: &str,
        client_problem: &Problem,
        reason: &str,
        audit: &NewAuditRow<'_>,
        notices: &[NewJob<'_>],
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let failed = sqlx::query(
            "UPDATE orders SET status = 'invalid', error = $1 WHERE id = $2 AND status = 'processing'",
        )
        .bind(to_json(client_problem))
        .bind(order_id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !failed {
            return Ok(false);
        }
        sqlx::query(
            "UPDATE upstream_orders SET status = 'invalid', error = $1, updated_at = $2
             WHERE order_id = $3 AND status = 'processing'",
        )
        .bind(reason)
        .bind(audit.at)
        .bind(order_id)
        .execute(&mut *tx)
        .await?;
        insert_audit_in(&mut *tx, audit).await?;
        insert_jobs_in(&mut tx, notices).await?;
        tx.commit().await?;
        Ok(true)
    }
}
