//! Responses: JSON documents, PEM/DER bodies and problem documents.
//!
//! Architecture Invariant: this is the only place an [`AcmeError`] becomes a
//! problem document (RFC 7807, RFC 8555 §6.7). Internal causes are logged
//! here, under the request's span, and never sent.

use acme_proxy_protocol::Problem;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};

use crate::error::AcmeError;

/// A successful ACME response under construction.
#[derive(Debug)]
pub struct Reply {
    status: StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
    location: Option<String>,
    links: Vec<String>,
    retry_after: Option<u64>,
}

impl Reply {
    pub fn json(status: u16, value: &impl serde::Serialize) -> Self {
        Self {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
            content_type: "application/json",
            body: serde_json::to_vec(value).unwrap_or_default(),
            location: None,
            links: Vec::new(),
            retry_after: None,
        }
    }

    pub fn bytes(content_type: &'static str, body: Vec<u8>) -> Self {
        Self {
            status: StatusCode::OK,
            content_type,
            body,
            location: None,
            links: Vec::new(),
            retry_after: None,
        }
    }

    pub fn empty(status: StatusCode) -> Self {
        Self {
            status,
            content_type: "",
            body: Vec::new(),
            location: None,
            links: Vec::new(),
            retry_after: None,
        }
    }

    pub fn location(mut self, url: String) -> Self {
        self.location = Some(url);
        self
    }

    /// `Link: <url>;rel="rel"` (RFC 8288), e.g. `up` from a challenge.
    pub fn link(mut self, url: &str, rel: &str) -> Self {
        self.links.push(format!("<{url}>;rel=\"{rel}\""));
        self
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut r = Response::new(Body::from(self.body));
        *r.status_mut() = self.status;
        let h = r.headers_mut();
        if !self.content_type.is_empty() {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(self.content_type),
            );
        }
        if let Some(loc) = self.location.and_then(|l| HeaderValue::from_str(&l).ok()) {
            h.insert(header::LOCATION, loc);
        }
        for link in self.links {
            if let Ok(v) = HeaderValue::from_str(&link) {
                h.append(header::LINK, v);
            }
        }
        if let Some(s) = self.retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// Renders an error as a problem document, logging what the client must not see.
pub fn problem_response(e: AcmeError) -> Response {
    let status = e.http_status();
    // A detail may quote what the client sent (an identifier, a contact, a
    // CSR's names): the log line keeps a bounded start of it.
    // A failure of ours is an error; a refusal (a policy's, with its rule
    // as the cause) is not.
    match &e.internal {
        Some(cause) if status >= 500 => {
            tracing::error!(event = "acme.error", outcome = "failure", status, error = %crate::bounded::text(cause), "internal error");
        }
        Some(cause) => tracing::info!(
            event = "acme.refused",
            outcome = "refused",
            status,
            problem = e.kind.name(),
            detail = %crate::bounded::text(&e.detail),
            cause = %crate::bounded::text(cause),
            "request refused"
        ),
        None => tracing::info!(
            event = "acme.refused",
            outcome = "refused",
            status,
            problem = e.kind.name(),
            detail = %crate::bounded::text(&e.detail),
            "request refused"
        ),
    }
    let mut doc = Problem::new(e.kind, e.detail);
    doc.status = Some(status);
    doc.subproblems = e.subproblems;
    let mut body = serde_json::to_value(&doc).unwrap_or_default();
    if e.kind == acme_proxy_protocol::ProblemType::BadSignatureAlgorithm {
        // RFC 8555 §6.2: list the algorithms we accept.
        body["algorithms"] = serde_json::json!(acme_proxy_protocol::Algorithm::SUPPORTED);
    }
    let mut r = Response::new(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if let Some(loc) = e.location.and_then(|l| HeaderValue::from_str(&l).ok()) {
        h.insert(header::LOCATION, loc);
    }
    if let Some(s) = e.retry_after {
        h.insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// Handlers return this; errors become problem documents.
pub fn respond(result: Result<Reply, AcmeError>) -> Response {
    match result {
        Ok(reply) => reply.into_response(),
        Err(e) => problem_response(e),
    }
}
