//! The upstream's HTTP client: HTTPS only, the system roots plus the
//! profile's trust anchors, `TCP_NODELAY`, and one timeout per request that
//! covers connecting, the headers *and* the body — so a black-holed request
//! costs one timeout, not the attempt's whole budget.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};

use crate::jobs::backoff;
use crate::metrics::Metrics;

type Inner = Client<hyper_rustls::HttpsConnector<HttpConnector>, BodyWrapper<Bytes>>;

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
    /// Trusts the system roots and every certificate in `anchors` (PEM files).
    pub fn new(anchors: &[PathBuf], timeout: Duration) -> Result<Self, String> {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for cert in native.certs {
            // A system store may hold certificates rustls cannot use; skip them.
            let _ = roots.add(cert);
        }
        for path in anchors {
            let text = std::fs::read(path)
                .map_err(|e| format!("reading trust anchor {}: {e}", path.display()))?;
            let blocks = pem::parse_many(&text)
                .map_err(|e| format!("trust anchor {} is not PEM: {e}", path.display()))?;
            let mut added = 0;
            for block in blocks.iter().filter(|b| b.tag() == "CERTIFICATE") {
                roots
                    .add(block.contents().to_vec().into())
                    .map_err(|e| format!("trust anchor {}: {e}", path.display()))?;
                added += 1;
            }
            if added == 0 {
                return Err(format!(
                    "trust anchor {} holds no CERTIFICATE block",
                    path.display()
                ));
            }
        }
        if roots.is_empty() {
            return Err(
                "no trust anchors: the system has no CA certificates and trust_anchors is empty"
                    .into(),
            );
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            inner,
            timeout,
            observer: None,
        })
    }

    /// Counts every request of `profile` in `metrics`.
    pub fn observed(mut self, metrics: Arc<Metrics>, profile: &str) -> Self {
        self.observer = Some((metrics, profile.to_owned()));
        self
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
                    .map_err(|e| instant_acme::Error::Other(Box::new(e)))?;
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
