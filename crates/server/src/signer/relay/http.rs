//! The upstream's HTTP client: HTTPS only, the system roots plus the
//! profile's trust anchors, `TCP_NODELAY`, and one timeout per request that
//! covers connecting, the headers *and* the body — so a black-holed request
//! costs one timeout, not the attempt's whole budget.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};

use crate::egress::{self, Egress, Outbound, ProxyError};
use crate::jobs::backoff;
use crate::metrics::Metrics;

type Inner = Outbound<BodyWrapper<Bytes>>;

/// An [`HttpClient`] for instant-acme with a per-request deadline.
#[derive(Clone)]
pub struct UpstreamHttp {
    inner: Inner,
    timeout: Duration,
    /// Counts each request by class for `acme_proxy_upstream_requests_total`.
    observer: Option<(Arc<Metrics>, String)>,
}

impl std::fmt::Debug for UpstreamHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamHttp")
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// An answer that decides nothing — 408, 429 or any 5xx, whatever its
/// body (a problem document, a proxy's HTML page, nothing) — surfaced as
/// its own error at the HTTP layer, so every upstream request (newNonce
/// included, which instant-acme reports as a bare string) is classified
/// retryable by its real status, with the `Retry-After` (RFC 9110
/// §10.2.3) the relay job then waits no less than.
#[derive(Debug, thiserror::Error)]
#[error("the upstream answered {status}{}: {body}", retry_after.map(|d| format!(" (retry after {d:?})")).unwrap_or_default())]
pub struct UpstreamUnavailable {
    pub status: u16,
    pub retry_after: Option<Duration>,
    /// The start of the body (a problem document's detail, an HTML page).
    pub body: String,
}

/// The delay of a `Retry-After` header in seconds (the HTTP-date form is
/// not used by ACME CAs and is ignored), at most
/// [`backoff::MAX_RETRY_AFTER`].
fn retry_after(parts: &http::response::Parts) -> Option<Duration> {
    let value = parts
        .headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?;
    delay_seconds(value)
}

/// RFC 9110 §10.2.3 `delay-seconds` (`1*DIGIT`, so any number of digits),
/// bounded by [`backoff::MAX_RETRY_AFTER`]; a number past `u64` is as long
/// as the bound.
fn delay_seconds(value: &str) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(backoff::retry_after(
        value
            .parse::<u64>()
            .map_or(backoff::MAX_RETRY_AFTER, Duration::from_secs),
    ))
}

/// Rewrites a `Retry-After` in seconds longer than
/// [`backoff::MAX_RETRY_AFTER`] to that bound before instant-acme reads
/// it: instant-acme adds the seconds to the system time unchecked
/// (0.8.5), and 18446744073709551615 of them would panic the task.
fn bound_retry_after(parts: &mut http::response::Parts) {
    let Some(value) = parts.headers.get(http::header::RETRY_AFTER) else {
        return;
    };
    let Some(delay) = value.to_str().ok().and_then(delay_seconds) else {
        return;
    };
    let bounded = http::HeaderValue::from(delay.as_secs());
    if value != bounded {
        parts.headers.insert(http::header::RETRY_AFTER, bounded);
    }
}

/// A request that did not finish within its timeout.
#[derive(Debug, thiserror::Error)]
#[error("the upstream did not answer within {0:?}")]
pub struct RequestTimedOut(Duration);

impl UpstreamHttp {
    /// Trusts the system roots and every certificate in `anchors` (PEM
    /// files); connects as `egress` routes the upstream; with `observer`
    /// (metrics, profile), counts every request and proxy failure.
    pub fn new(
        anchors: &[PathBuf],
        timeout: Duration,
        egress: Arc<Egress>,
        observer: Option<(Arc<Metrics>, &str)>,
    ) -> Result<Self, String> {
        let roots = egress::roots(anchors)?;
        if roots.is_empty() {
            return Err(
                "no trust anchors: the system has no CA certificates and trust_anchors is empty"
                    .into(),
            );
        }
        let mut builder = egress::Builder::new(egress, roots)?
            .connect_timeout(timeout)
            .https_only();
        if let Some((metrics, profile)) = &observer {
            builder = builder.observed(Arc::clone(metrics), profile, "relay");
        }
        Ok(Self {
            inner: builder.build(),
            timeout,
            observer: observer.map(|(m, p)| (m, p.to_owned())),
        })
    }
}

impl HttpClient for UpstreamHttp {
    fn request(
        &self,
        req: http::Request<BodyWrapper<Bytes>>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>>
    {
        let inner = self.inner.clone();
        let timeout = self.timeout;
        let observer = self.observer.clone();
        Box::pin(async move {
            let exchange = async {
                let response = inner
                    .request(req)
                    .await
                    .map_err(instant_acme::Error::Other)?;
                let (mut parts, body) = response.into_parts();
                bound_retry_after(&mut parts);
                // Read the whole body inside the deadline: a server that
                // sends headers and then stalls is as stuck as one that
                // never answers.
                let body = body
                    .collect()
                    .await
                    .map_err(|e| instant_acme::Error::Other(Box::new(e)))?
                    .to_bytes();
                let status = parts.status.as_u16();
                if status == 408 || status == 429 || status >= 500 {
                    return Err(instant_acme::Error::Other(Box::new(UpstreamUnavailable {
                        status,
                        retry_after: retry_after(&parts),
                        body: String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned(),
                    })));
                }
                Ok(BytesResponse::from(http::Response::from_parts(
                    parts,
                    Full::new(body),
                )))
            };
            let result = match tokio::time::timeout(timeout, exchange).await {
                Ok(result) => result,
                Err(_) => Err(instant_acme::Error::Other(Box::new(RequestTimedOut(
                    timeout,
                )))),
            };
            if let Some((metrics, profile)) = observer {
                let class = match &result {
                    Ok(r) if r.parts.status.is_success() || r.parts.status.is_redirection() => {
                        "2xx"
                    }
                    Ok(_) => "4xx",
                    Err(instant_acme::Error::Other(e)) if e.is::<RequestTimedOut>() => "timeout",
                    Err(instant_acme::Error::Other(e))
                        if e.downcast_ref::<ProxyError>()
                            .is_some_and(ProxyError::is_refusal) =>
                    {
                        "proxy_refused"
                    }
                    Err(instant_acme::Error::Other(e)) if e.is::<UpstreamUnavailable>() => {
                        match e.downcast_ref::<UpstreamUnavailable>().map(|u| u.status) {
                            Some(s) if s >= 500 => "5xx",
                            _ => "4xx",
                        }
                    }
                    Err(_) => "transport",
                };
                metrics
                    .upstream_requests
                    .get_or_create(&vec![("profile", profile), ("class", class.to_owned())])
                    .inc();
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(retry_after: &str) -> http::response::Parts {
        let (parts, ()) = http::Response::builder()
            .status(429)
            .header(http::header::RETRY_AFTER, retry_after)
            .body(())
            .unwrap()
            .into_parts();
        parts
    }

    #[test]
    fn a_huge_retry_after_is_read_and_passed_on_as_a_day() {
        let day = backoff::MAX_RETRY_AFTER;
        for huge in [
            "18446744073709551615",
            "1000000000000",
            "99999999999999999999999999",
            " 86401 ",
        ] {
            let mut p = parts(huge);
            assert_eq!(retry_after(&p), Some(day), "{huge}");
            bound_retry_after(&mut p);
            assert_eq!(p.headers[http::header::RETRY_AFTER], "86400", "{huge}");
        }
        let mut p = parts("7");
        assert_eq!(retry_after(&p), Some(Duration::from_secs(7)));
        bound_retry_after(&mut p);
        assert_eq!(p.headers[http::header::RETRY_AFTER], "7");
        // The HTTP-date form and anything else are left to instant-acme.
        for other in ["Fri, 31 Dec 1999 23:59:59 GMT", "-5", ""] {
            let mut p = parts(other);
            assert_eq!(retry_after(&p), None, "{other:?}");
            bound_retry_after(&mut p);
            assert_eq!(p.headers[http::header::RETRY_AFTER], other);
        }
    }
}
