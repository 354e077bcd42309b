//! The one error type of the ACME state machine.
//!
//! An [`AcmeError`] names an RFC 8555 §6.7 problem type and a detail meant
//! for the client. Internal failures carry their real cause separately
//! (`internal`), which is logged with the request id and never sent: the
//! client sees a generic `serverInternal`. The front end (`api`) is the only
//! code that renders an `AcmeError` into a problem document.

use acme_proxy_protocol::{ProblemType, Subproblem};

#[derive(Debug, Clone)]
pub struct AcmeError {
    pub kind: ProblemType,
    pub detail: String,
    /// Overrides the type's default HTTP status.
    pub status: Option<u16>,
    pub subproblems: Vec<Subproblem>,
    /// A `Location` to send with the problem (keyChange's 409, §7.3.5).
    pub location: Option<String>,
    /// For logs and audit rows only: the real cause of a failure, or why
    /// a refusal was made (a policy's rule and checks).
    pub internal: Option<String>,
    /// Seconds the client should wait (`Retry-After`).
    pub retry_after: Option<u64>,
}

impl AcmeError {
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            status: None,
            subproblems: Vec::new(),
            location: None,
            internal: None,
            retry_after: None,
        }
    }

    /// A failure that is ours, not the client's: generic to the client, the
    /// cause kept for the logs.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        let mut e = Self::new(
            ProblemType::ServerInternal,
            "the server could not complete the request; the operator's logs have the details under this request's id",
        );
        e.internal = Some(cause.to_string());
        e
    }

    pub fn malformed(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::Malformed, detail)
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(ProblemType::Unauthorized, detail)
    }

    /// A request signed by an account that is no longer valid. RFC 8555
    /// §7.3.6: "If a server receives a POST or POST-as-GET from a
    /// deactivated account, it MUST return an error response with status
    /// code 401 (Unauthorized) and type
    /// "urn:ietf:params:acme:error:unauthorized"" (the type's default is
    /// 403, for the other refusals).
    pub fn deactivated_account(detail: impl Into<String>) -> Self {
        Self::unauthorized(detail).with_status(401)
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(ProblemType::Malformed, format!("no such {what}")).with_status(404)
    }

    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    pub fn http_status(&self) -> u16 {
        self.status.unwrap_or_else(|| self.kind.default_status())
    }
}

impl From<acme_proxy_store::StoreError> for AcmeError {
    fn from(e: acme_proxy_store::StoreError) -> Self {
        match e {
            // A write's AccountGuard found the account changed: the request
            // is refused as the account's would be now (RFC 8555 §7.3.6),
            // with the 401 of a deactivated account's request whether the
            // account was deactivated, deleted or rekeyed: the store does
            // not say which, and for all three the signer is no longer
            // authorized. The authority forgets its copy of the account
            // where it maps this itself (`Authority::guarded_write_error`).
            acme_proxy_store::StoreError::AccountChanged => Self::deactivated_account(
                "the account was deactivated, deleted or given another key; it can no longer make this request (RFC 8555 §7.3.6)",
            ),
            // A nonce used before, found as the request's first statement
            // (or the record ahead of it) was written: nothing was.
            acme_proxy_store::StoreError::NonceReplayed => bad_nonce(),
            // Nothing was written; the client may try again shortly
            // (RFC 8555 §6.6: a 503 with Retry-After).
            e if e.is_unavailable() => {
                let mut refused = Self::internal(e).with_status(503);
                refused.detail = DATABASE_UNAVAILABLE.into();
                refused.retry_after = Some(DATABASE_RETRY_AFTER);
                refused
            }
            e => Self::internal(e),
        }
    }
}

/// The refusal of a nonce never issued, expired or used before (RFC 8555
/// §6.5.2); the response carries a fresh one, as every response does.
pub fn bad_nonce() -> AcmeError {
    AcmeError::new(
        acme_proxy_protocol::ProblemType::BadNonce,
        "the nonce is unknown, expired or already used; retry with the fresh one in Replay-Nonce",
    )
}

/// What a client is told while the database is unavailable (503).
pub const DATABASE_UNAVAILABLE: &str =
    "the server's database is unavailable; retry after the indicated delay";

/// Seconds a client is asked to wait while the database is unavailable:
/// a PostgreSQL restart or fail-over takes some.
const DATABASE_RETRY_AFTER: u64 = 5;

pub type AcmeResult<T> = Result<T, AcmeError>;
