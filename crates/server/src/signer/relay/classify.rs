//! Retryable or permanent, decided by
//! whose answer a failure is. Nobody decided anything (a transport error, a
//! proxy's HTML page, a 5xx, a rate limit) → retry after backoff; the CA
//! stated a reason (any other problem document) → believe it.

use std::fmt;

/// Whether the relay job should try again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Retryable,
    Permanent,
}

/// A failure of one relay attempt, with the real reason (for operators and
/// the audit row; the client only ever sees a generic problem).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayError {
    pub class: Class,
    pub detail: String,
    /// The upstream's problem type, when it stated one.
    pub problem_type: Option<String>,
    /// When the upstream asked us to come back (429/503 `Retry-After`).
    pub retry_after: Option<std::time::Duration>,
    /// The upstream did not answer as a working CA: no connection, no
    /// answer in time, a 5xx without `Retry-After`, a page that is not
    /// ACME. What the circuit breaker counts; anything else it said shows
    /// that it is up.
    pub unreachable: bool,
    /// The identifier whose upstream authorization turned invalid: a
    /// failed validation, which the upstream counts against the account.
    pub failed_validation: Option<String>,
}

impl RelayError {
    pub fn retryable(detail: impl Into<String>) -> Self {
        Self {
            class: Class::Retryable,
            detail: detail.into(),
            problem_type: None,
            retry_after: None,
            unreachable: false,
            failed_validation: None,
        }
    }

    /// The upstream did not answer as a working CA (no answer in time, a
    /// page that is not ACME): the breaker counts it.
    pub fn down(detail: impl Into<String>) -> Self {
        Self {
            unreachable: true,
            ..Self::retryable(detail)
        }
    }

    pub fn permanent(detail: impl Into<String>) -> Self {
        Self {
            class: Class::Permanent,
            detail: detail.into(),
            problem_type: None,
            retry_after: None,
            unreachable: false,
            failed_validation: None,
        }
    }

    pub fn is_permanent(&self) -> bool {
        self.class == Class::Permanent
    }

    /// Prefixes the detail with what was being done.
    pub fn context(mut self, doing: &str) -> Self {
        self.detail = format!("{doing}: {}", self.detail);
        self
    }
}

impl fmt::Display for RelayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

/// Problem types that mean "not now" even without an HTTP status in the
/// document: the CA is overloaded, throttling, or wants a fresh nonce.
const TRANSIENT_TYPES: [&str; 3] = [
    "urn:ietf:params:acme:error:serverInternal",
    "urn:ietf:params:acme:error:rateLimited",
    "urn:ietf:params:acme:error:badNonce",
];

/// instant-acme's `Error::Str` messages that describe a stated, final state.
const PERMANENT_STRINGS: [&str; 3] = [
    "no certificate URL found",
    "invalid order state",
    "unable to decode certificate as UTF-8",
];

/// Maps an `instant-acme` error onto the table.
pub fn classify(e: &instant_acme::Error) -> RelayError {
    use instant_acme::Error as E;
    let class = match e {
        // A problem document: the CA's own words. ≥ 500 and 429 say "later".
        // (408, 429 and 5xx answers never get here: the HTTP layer turns
        // them into `UpstreamUnavailable` by their real status.)
        E::Api(p)
            if p.r#type
                .as_deref()
                .is_some_and(|t| TRANSIENT_TYPES.contains(&t)) =>
        {
            Class::Retryable
        }
        E::Api(p) => match p.status {
            Some(s) if s >= 500 || s == 429 => Class::Retryable,
            _ => Class::Permanent,
        },
        // Not the JSON expected: typically a proxy's HTML error page.
        E::Json(_) => Class::Retryable,
        // Transport: resets, refused connections, timeouts, TLS, bad URLs.
        E::Http(_) | E::Hyper(_) | E::InvalidUri(_) | E::Other(_) => Class::Retryable,
        // Polling ran out of its budget: the authorization or order did not
        // settle in time; the next attempt re-reads it.
        E::Timeout(_) => Class::Retryable,
        // Our own key cannot sign: no retry will fix that.
        E::Crypto | E::KeyRejected => Class::Permanent,
        // The CA lacks what we need.
        E::Unsupported(_) => Class::Permanent,
        // instant-acme's bare strings: a document that states something
        // impossible (a valid order without a certificate URL) is the CA's
        // word; the rest (no nonce in an answer, a newNonce failure) are
        // nobody's decision.
        E::Str(s) if PERMANENT_STRINGS.contains(s) => Class::Permanent,
        E::Str(_) => Class::Retryable,
        // instant-acme's error is non-exhaustive: an unknown kind is
        // nobody's decision.
        _ => Class::Retryable,
    };
    let problem_type = match e {
        E::Api(p) => p.r#type.clone(),
        _ => None,
    };
    let retry_after = match e {
        E::Other(inner) => inner
            .downcast_ref::<super::http::UpstreamUnavailable>()
            .and_then(|u| u.retry_after),
        _ => None,
    };
    RelayError {
        class,
        detail: e.to_string(),
        problem_type,
        retry_after,
        unreachable: unreachable(e),
        failed_validation: None,
    }
}

/// instant-acme's `Error::Str` messages of a newNonce that did not answer
/// as ACME does.
const NONCE_STRINGS: [&str; 2] = [
    "error response from newNonce resource",
    "no nonce found in newNonce response",
];

/// Whether `e` shows the upstream down rather than answering: see
/// [`RelayError::unreachable`]. A 429, or anything with `Retry-After`, is
/// an upstream at work asking for a pause (which the relay honours for
/// everyone); a problem document below 500 is its stated answer.
fn unreachable(e: &instant_acme::Error) -> bool {
    use instant_acme::Error as E;
    match e {
        E::Api(p) => p.status.is_some_and(|s| s >= 500),
        E::Json(_) | E::Http(_) | E::Hyper(_) => true,
        // A newNonce that answered without a nonce: a page in front of the
        // CA, not the CA.
        E::Str(s) => NONCE_STRINGS.contains(s),
        E::Other(inner) => match inner.downcast_ref::<super::http::UpstreamUnavailable>() {
            Some(u) => u.retry_after.is_none() && u.status != 429,
            None => true,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn problem(status: Option<u16>, kind: &str) -> instant_acme::Error {
        let mut doc = serde_json::json!({ "type": kind, "detail": "said so" });
        if let Some(s) = status {
            doc["status"] = s.into();
        }
        instant_acme::Error::Api(serde_json::from_value(doc).unwrap())
    }

    fn class(e: instant_acme::Error) -> Class {
        classify(&e).class
    }

    #[test]
    fn transport_errors_and_bad_urls_are_retried() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        assert_eq!(
            class(instant_acme::Error::Other(Box::new(io))),
            Class::Retryable
        );
        let timeout = std::io::Error::new(std::io::ErrorKind::TimedOut, "request timed out");
        assert_eq!(
            class(instant_acme::Error::Other(Box::new(timeout))),
            Class::Retryable
        );
        let bad_uri = "http://[::1".parse::<http::Uri>().unwrap_err();
        assert_eq!(
            class(instant_acme::Error::InvalidUri(bad_uri)),
            Class::Retryable
        );
    }

    #[test]
    fn a_rate_limit_with_retry_after_is_retried_no_sooner_than_asked() {
        let busy = super::super::http::UpstreamUnavailable {
            status: 429,
            retry_after: Some(std::time::Duration::from_secs(7)),
            body: "{\"type\":\"urn:ietf:params:acme:error:rateLimited\"}".into(),
        };
        let e = classify(&instant_acme::Error::Other(Box::new(busy)));
        assert_eq!(e.class, Class::Retryable);
        assert_eq!(e.retry_after, Some(std::time::Duration::from_secs(7)));
    }

    #[test]
    fn a_body_that_is_not_the_json_expected_is_retried() {
        let html =
            serde_json::from_str::<serde_json::Value>("<html>502 Bad Gateway</html>").unwrap_err();
        assert_eq!(class(instant_acme::Error::Json(html)), Class::Retryable);
    }

    #[test]
    fn problem_documents_of_5xx_and_429_are_retried() {
        for status in [500, 502, 503, 504] {
            assert_eq!(
                class(problem(
                    Some(status),
                    "urn:ietf:params:acme:error:serverInternal"
                )),
                Class::Retryable,
                "{status}"
            );
        }
        assert_eq!(
            class(problem(Some(429), "urn:ietf:params:acme:error:rateLimited")),
            Class::Retryable
        );
        assert_eq!(
            class(problem(None, "urn:ietf:params:acme:error:rateLimited")),
            Class::Retryable
        );
    }

    #[test]
    fn any_other_problem_document_is_believed() {
        for (status, kind) in [
            (403, "urn:ietf:params:acme:error:unauthorized"),
            (400, "urn:ietf:params:acme:error:badCSR"),
            (400, "urn:ietf:params:acme:error:rejectedIdentifier"),
            (404, "about:blank"),
        ] {
            let e = classify(&problem(Some(status), kind));
            assert_eq!(e.class, Class::Permanent, "{status} {kind}");
            assert_eq!(e.problem_type.as_deref(), Some(kind));
        }
        assert_eq!(
            class(problem(None, "urn:ietf:params:acme:error:malformed")),
            Class::Permanent
        );
    }

    #[test]
    fn the_breaker_counts_no_answer_a_5xx_and_a_page_that_is_not_acme_but_not_a_429_or_a_refusal() {
        let unavailable = |status, retry_after| {
            let u = super::super::http::UpstreamUnavailable {
                status,
                retry_after,
                body: String::new(),
            };
            classify(&instant_acme::Error::Other(Box::new(u))).unreachable
        };
        assert!(unavailable(502, None));
        assert!(unavailable(504, None));
        assert!(!unavailable(429, None), "a 429 is a CA at work");
        assert!(
            !unavailable(503, Some(std::time::Duration::from_secs(20))),
            "Retry-After pauses instead"
        );
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        assert!(classify(&instant_acme::Error::Other(Box::new(reset))).unreachable);
        let html =
            serde_json::from_str::<serde_json::Value>("<html>502 Bad Gateway</html>").unwrap_err();
        assert!(classify(&instant_acme::Error::Json(html)).unreachable);
        assert!(
            classify(&problem(
                Some(500),
                "urn:ietf:params:acme:error:serverInternal"
            ))
            .unreachable
        );
        assert!(
            classify(&instant_acme::Error::Str(
                "no nonce found in newNonce response"
            ))
            .unreachable
        );
        for e in [
            problem(Some(403), "urn:ietf:params:acme:error:unauthorized"),
            problem(Some(400), "urn:ietf:params:acme:error:badNonce"),
            instant_acme::Error::Str("invalid order state"),
        ] {
            assert!(!classify(&e).unreachable, "{e}");
        }
        assert!(RelayError::down("no answer").unreachable);
        assert!(!RelayError::retryable("not settled yet").unreachable);
    }

    #[test]
    fn a_bad_nonce_is_retried_whatever_its_status() {
        assert_eq!(
            class(problem(Some(400), "urn:ietf:params:acme:error:badNonce")),
            Class::Retryable
        );
    }

    #[test]
    fn any_408_429_or_5xx_answer_is_retried_by_its_real_status_whatever_the_body() {
        for status in [408, 429, 500, 502, 503, 504] {
            let e = super::super::http::UpstreamUnavailable {
                status,
                retry_after: None,
                body: "{\"message\":\"Bad Gateway\"}".into(),
            };
            let r = classify(&instant_acme::Error::Other(Box::new(e)));
            assert_eq!(r.class, Class::Retryable, "{status}");
            assert_eq!(r.retry_after, None);
        }
    }

    #[test]
    fn a_failed_nonce_request_is_retried_but_a_stated_impossible_state_is_not() {
        assert_eq!(
            class(instant_acme::Error::Str(
                "error response from newNonce resource"
            )),
            Class::Retryable
        );
        assert_eq!(
            class(instant_acme::Error::Str("invalid order state")),
            Class::Permanent
        );
    }

    #[test]
    fn a_local_signing_failure_with_the_account_key_is_permanent() {
        assert_eq!(class(instant_acme::Error::Crypto), Class::Permanent);
        assert_eq!(class(instant_acme::Error::KeyRejected), Class::Permanent);
    }

    #[test]
    fn an_authorization_that_did_not_settle_within_the_budget_is_retried() {
        assert_eq!(class(instant_acme::Error::Timeout(None)), Class::Retryable);
    }

    #[test]
    fn a_valid_order_without_a_certificate_url_is_permanent() {
        assert_eq!(
            class(instant_acme::Error::Str("no certificate URL found")),
            Class::Permanent
        );
        assert_eq!(
            class(instant_acme::Error::Unsupported(
                "ACME renewal information (ARI)"
            )),
            Class::Permanent
        );
    }
}
