//! The audit trail: one insert-only row per issuance and per refusal, with
//! who asked, from where, and why not.

use acme_proxy_protocol::types::RawIdentifier;

use crate::db::{Arg, Conn, Row, args};
use crate::{Result, Store, StoreError, to_json};

acme_proxy_protocol::string_enum! {
    /// What an audit row records: the one list that the writers, the
    /// `audit list --event` filter and the metrics' labels share.
    pub enum AuditEvent {
        AccountCreated = "account.created",
        AccountDeactivated = "account.deactivated",
        AccountKeyChanged = "account.key_changed",
        AccountRefused = "account.refused",
        AccountDeleted = "account.deleted",
        OrderRefused = "order.refused",
        OrderDeleted = "order.deleted",
        CertificateIssued = "certificate.issued",
        CertificateIssueFailed = "certificate.issue_failed",
        CertificateRevoked = "certificate.revoked",
        CertificateRevokeFailed = "certificate.revoke_failed",
        EabCreated = "eab.created",
        EabRevoked = "eab.revoked",
        NotificationFailed = "notification.failed",
        ConfigReload = "config.reload",
        DnsRecordAdded = "dns.record_added",
        DnsRecordRemoved = "dns.record_removed",
        DnsAccountRegistered = "dns.account_registered",
        DnsAccountRemoved = "dns.account_removed",
        DnsRecordUpdated = "dns.record_updated",
        PolicyRefused = "policy.refused",
        PolicyUndecided = "policy.undecided",
        PolicyWarned = "policy.warned",
        RateLimitReset = "ratelimit.reset",
        OrderUpstreamMoved = "order.upstream_moved",
        OperatorCreated = "operator.created",
        OperatorChanged = "operator.changed",
        OperatorDeleted = "operator.deleted",
        OperatorLogin = "operator.login",
        OperatorLogout = "operator.logout",
        OperatorSessionRevoked = "operator.session_revoked",
        OperatorTokenCreated = "operator.token_created",
        OperatorTokenRevoked = "operator.token_revoked",
        JobRetryRequested = "job.retry_requested",
        JobCancelRequested = "job.cancel_requested",
    }
}

acme_proxy_protocol::string_enum! {
    /// How it went: `refused` for a client's mistake or policy, `failure`
    /// for the server's own.
    pub enum AuditOutcome {
        Success = "success",
        Refused = "refused",
        Failure = "failure",
    }
}

acme_proxy_protocol::string_enum! {
    /// Who writes a store's audit rows: the server, or an admin command
    /// (which has no metrics endpoint: servers count its rows when they
    /// next export metrics).
    pub enum AuditOrigin {
        Server = "server",
        Cli = "cli",
    }
}

/// One day's count of one kind of audit row ([`Store::issuance_outcomes_by_day`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DayCount {
    /// Days since the period's start, from 0.
    pub day: i64,
    pub profile: Option<String>,
    pub event: String,
    pub outcome: String,
    pub problem_type: Option<String>,
    pub count: i64,
}

/// An audit record to write. Identifiers are a frozen copy: the row must
/// say what was asked even after the order is deleted.
#[derive(Clone, Debug)]
pub struct NewAuditRow<'a> {
    pub at: i64,
    pub event: AuditEvent,
    pub outcome: AuditOutcome,
    pub profile: Option<&'a str>,
    /// `account:<id>`, `operator:<name>` or `system`.
    pub actor: &'a str,
    pub account_id: Option<&'a str>,
    pub order_id: Option<&'a str>,
    pub serial: Option<&'a str>,
    /// As sent: a refused order records what the client asked for,
    /// of whatever type (RFC 8555 §7.4).
    pub identifiers: Option<&'a [RawIdentifier]>,
    pub client_ip: Option<&'a str>,
    pub reverse_name: Option<&'a str>,
    pub user_agent: Option<&'a str>,
    pub request_id: Option<&'a str>,
    pub problem_type: Option<&'a str>,
    /// Operator-only: never sent to a client.
    pub detail: Option<&'a str>,
}

impl<'a> NewAuditRow<'a> {
    /// A row saying only what happened, when and by whom; the caller fills
    /// in what else it knows.
    pub fn new(at: i64, event: AuditEvent, outcome: AuditOutcome, actor: &'a str) -> Self {
        Self {
            at,
            event,
            outcome,
            profile: None,
            actor,
            account_id: None,
            order_id: None,
            serial: None,
            identifiers: None,
            client_ip: None,
            reverse_name: None,
            user_agent: None,
            request_id: None,
            problem_type: None,
            detail: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRow {
    pub id: i64,
    pub at: i64,
    pub event: String,
    pub outcome: String,
    pub profile: Option<String>,
    pub actor: String,
    pub account_id: Option<String>,
    pub order_id: Option<String>,
    pub serial: Option<String>,
    pub identifiers: Vec<RawIdentifier>,
    pub client_ip: Option<String>,
    pub reverse_name: Option<String>,
    pub user_agent: Option<String>,
    pub request_id: Option<String>,
    pub problem_type: Option<String>,
    pub detail: Option<String>,
}

pub(crate) const INSERT_AUDIT: &str =
    "INSERT INTO audit_log (at, event, outcome, profile, actor, account_id, order_id, serial,
         identifiers, client_ip, reverse_name, user_agent, request_id, problem_type, detail, origin)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)";

/// The arguments of [`INSERT_AUDIT`] for `row`, in its order (a
/// statement that writes the row with others takes them the same way);
/// `identifiers` is `row.identifiers` as JSON.
pub(crate) fn audit_args<'a>(
    row: &'a NewAuditRow<'a>,
    identifiers: &'a Option<String>,
    origin: AuditOrigin,
) -> [Arg<'a>; 16] {
    [
        Arg::Int(Some(row.at)),
        Arg::Text(Some(row.event.as_str())),
        Arg::Text(Some(row.outcome.as_str())),
        Arg::Text(row.profile),
        Arg::Text(Some(row.actor)),
        Arg::Text(row.account_id),
        Arg::Text(row.order_id),
        Arg::Text(row.serial),
        Arg::Text(identifiers.as_deref()),
        Arg::Text(row.client_ip),
        Arg::Text(row.reverse_name),
        Arg::Text(row.user_agent),
        Arg::Text(row.request_id),
        Arg::Text(row.problem_type),
        Arg::Text(row.detail),
        Arg::Text(Some(origin.as_str())),
    ]
}

/// Writes one audit row on `conn` (the writer, or the caller's transaction).
pub(crate) async fn insert_audit_in(
    conn: &mut Conn<'_>,
    row: &NewAuditRow<'_>,
    origin: AuditOrigin,
) -> Result<()> {
    let identifiers = row.identifiers.map(to_json);
    conn.exec(INSERT_AUDIT, &audit_args(row, &identifiers, origin))
        .await?;
    Ok(())
}

macro_rules! audit_columns {
    () => {
        "id, at, event, outcome, profile, actor, account_id, order_id, serial, identifiers, \
         client_ip, reverse_name, user_agent, request_id, problem_type, detail"
    };
}

fn audit_from_row(row: Row<'_>) -> Result<AuditRow> {
    let identifiers: Option<String> = row.get("identifiers")?;
    Ok(AuditRow {
        id: row.get("id")?,
        at: row.get("at")?,
        event: row.get("event")?,
        outcome: row.get("outcome")?,
        profile: row.get("profile")?,
        actor: row.get("actor")?,
        account_id: row.get("account_id")?,
        order_id: row.get("order_id")?,
        serial: row.get("serial")?,
        identifiers: match identifiers {
            Some(s) => serde_json::from_str(&s)
                .map_err(|e| StoreError::Corrupt(format!("audit identifiers: {e}")))?,
            None => Vec::new(),
        },
        client_ip: row.get("client_ip")?,
        reverse_name: row.get("reverse_name")?,
        user_agent: row.get("user_agent")?,
        request_id: row.get("request_id")?,
        problem_type: row.get("problem_type")?,
        detail: row.get("detail")?,
    })
}

/// Which audit rows to list; every filter is optional.
#[derive(Clone, Debug, Default)]
pub struct AuditFilter<'a> {
    pub profile: Option<&'a str>,
    pub account: Option<&'a str>,
    pub order: Option<&'a str>,
    pub serial: Option<&'a str>,
    pub event: Option<AuditEvent>,
    pub outcome: Option<AuditOutcome>,
    /// Unix seconds; rows at or after.
    pub since: Option<i64>,
    /// Only rows older than this id: the next page.
    pub before: Option<i64>,
}

impl Store {
    /// Issuances and failures since `since` — rows of `certificate.issued`,
    /// `certificate.issue_failed`, `order.refused` and `policy.refused` —
    /// counted per day (days start at `since`, every 86,400 s), profile,
    /// event, outcome and problem; read from the `audit_log_outcomes`
    /// index alone.
    pub async fn issuance_outcomes_by_day(&self, since: i64) -> Result<Vec<DayCount>> {
        self.reader()
            .await?
            .all(
                "SELECT CAST((at - ?1) / 86400 AS BIGINT) AS day, profile, event, outcome,
                        problem_type, CAST(COUNT(*) AS BIGINT) AS n
                 FROM audit_log
                 WHERE at >= ?1 AND event IN ('certificate.issued', 'certificate.issue_failed',
                                              'order.refused', 'policy.refused')
                 GROUP BY day, profile, event, outcome, problem_type ORDER BY day",
                args![since],
                |row| {
                    Ok(DayCount {
                        day: row.get("day")?,
                        profile: row.get("profile")?,
                        event: row.get("event")?,
                        outcome: row.get("outcome")?,
                        problem_type: row.get("problem_type")?,
                        count: row.get("n")?,
                    })
                },
            )
            .await
    }

    pub async fn audit_list(&self, filter: &AuditFilter<'_>, limit: i64) -> Result<Vec<AuditRow>> {
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    audit_columns!(),
                    " FROM audit_log
             WHERE (?1 IS NULL OR profile = ?1) AND (?2 IS NULL OR account_id = ?2)
               AND (?3 IS NULL OR order_id = ?3) AND (?4 IS NULL OR serial = ?4)
               AND (?5 IS NULL OR event = ?5) AND (?6 IS NULL OR outcome = ?6)
               AND (?7 IS NULL OR at >= ?7) AND (?9 IS NULL OR id < ?9)
             ORDER BY id DESC LIMIT ?8"
                ),
                args![
                    filter.profile,
                    filter.account,
                    filter.order,
                    filter.serial,
                    filter.event.map(AuditEvent::as_str),
                    filter.outcome.map(AuditOutcome::as_str),
                    filter.since,
                    limit,
                    filter.before,
                ],
                audit_from_row,
            )
            .await
    }

    pub async fn audit_row(&self, id: i64) -> Result<Option<AuditRow>> {
        self.reader()
            .await?
            .one(
                concat!("SELECT ", audit_columns!(), " FROM audit_log WHERE id = ?1"),
                args![id],
                audit_from_row,
            )
            .await
    }

    pub async fn insert_audit(&self, row: &NewAuditRow<'_>) -> Result<()> {
        insert_audit_in(&mut self.writer().await?, row, self.audit_origin).await
    }

    /// The highest audit row id so far (0 for none).
    pub async fn last_audit_id(&self) -> Result<i64> {
        Ok(self
            .reader()
            .await?
            .scalar("SELECT COALESCE(MAX(id), 0) FROM audit_log", &[])
            .await?
            .unwrap_or(0))
    }

    /// Audit rows admin commands wrote after row `after`, oldest first, at
    /// most `limit`.
    pub async fn cli_audit_after(&self, after: i64, limit: i64) -> Result<Vec<AuditRow>> {
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    audit_columns!(),
                    " FROM audit_log WHERE origin = 'cli' AND id > ?1 ORDER BY id LIMIT ?2"
                ),
                args![after, limit],
                audit_from_row,
            )
            .await
    }

    /// The audit rows about one order, oldest first.
    pub async fn audit_for_order(&self, order_id: &str) -> Result<Vec<AuditRow>> {
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    audit_columns!(),
                    " FROM audit_log WHERE order_id = ?1 ORDER BY id"
                ),
                args![order_id],
                audit_from_row,
            )
            .await
    }

    /// Deletes the rows written before `before` (Unix seconds): the
    /// retention sweep, the only deletion the audit log knows (rows are
    /// never updated).
    pub async fn delete_audit_before(&self, before: i64) -> Result<u64> {
        Ok(self
            .writer()
            .await?
            .exec("DELETE FROM audit_log WHERE at < ?1", args![before])
            .await? as u64)
    }

    /// The newest audit rows, newest first, optionally of one event.
    pub async fn audit_recent(&self, event: Option<&str>, limit: i64) -> Result<Vec<AuditRow>> {
        self.reader()
            .await?
            .all(
                concat!(
                    "SELECT ",
                    audit_columns!(),
                    " FROM audit_log WHERE (?1 IS NULL OR event = ?1) ORDER BY id DESC LIMIT ?2"
                ),
                args![event, limit],
                audit_from_row,
            )
            .await
    }
}
