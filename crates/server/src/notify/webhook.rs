//! Webhook delivery over HTTP(S): one request with a timeout, the answer
//! classified as delivered, later, or refused.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use crate::config::WebhookConfig;
use crate::egress::{self, Egress, Outbound};
use crate::metrics::Metrics;

/// What one delivery attempt concluded.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    Delivered(u16),
    /// Nobody decided anything: a transport error, a timeout, 408, 429 or 5xx.
    Later {
        reason: String,
        after: Option<Duration>,
    },
    /// The receiver said no (any other status).
    Refused(String),
}

/// Classifies a receiver's status code.
pub fn classify(status: u16, retry_after: Option<Duration>) -> Delivery {
    match status {
        200..=299 => Delivery::Delivered(status),
        408 | 429 | 500..=599 => Delivery::Later {
            reason: format!("the receiver answered {status}"),
            after: retry_after,
        },
        _ => Delivery::Refused(format!("the receiver refused it with {status}")),
    }
}

/// One webhook's HTTP client, routed by its effective `[egress]`.
#[derive(Clone)]
pub struct WebhookClient {
    inner: Outbound<Full<Bytes>>,
}

impl std::fmt::Debug for WebhookClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookClient")
    }
}

impl WebhookClient {
    /// Trusts the system roots; internal receivers (chat bridges,
    /// ticketing) often speak plain HTTP on the local network, so http://
    /// is allowed: the operator chooses the URL.
    pub fn new(egress: Arc<Egress>, metrics: Arc<Metrics>, profile: &str) -> Result<Self, String> {
        let inner = egress::Builder::new(egress, egress::roots(&[])?)?
            .observed(metrics, profile, "webhook")
            .build();
        Ok(Self { inner })
    }

    /// One request; the headers' values (tokens) are never logged.
    pub async fn send(&self, hook: &WebhookConfig, body: String) -> Delivery {
        let mut request = http::Request::builder()
            .method(hook.method.as_str())
            .uri(hook.url.as_str())
            .header(http::header::CONTENT_TYPE, hook.content_type.as_str())
            .header(http::header::USER_AGENT, "acme-proxy-notify");
        for (k, v) in &hook.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let request = match request.body(Full::new(Bytes::from(body))) {
            Ok(r) => r,
            Err(e) => return Delivery::Refused(format!("the request cannot be built: {e}")),
        };
        let uri = request.uri().clone();
        let exchange = async {
            let response = self
                .inner
                .request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            if let Some(refusal) = self.inner.refused_by_proxy(&uri, status) {
                // The proxy's answer, not the receiver's: the operator's
                // to fix, so tried again after the backoff.
                let _ = response.into_body().collect().await;
                return Err(refusal.to_string());
            }
            let retry_after = response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            // Drain (bounded by the timeout) so the connection can be reused.
            let _ = response.into_body().collect().await;
            Ok::<_, String>((status, retry_after))
        };
        match tokio::time::timeout(hook.timeout, exchange).await {
            Ok(Ok((status, retry_after))) => classify(status, retry_after),
            Ok(Err(e)) => Delivery::Later {
                reason: format!("transport: {e}"),
                after: None,
            },
            Err(_) => Delivery::Later {
                reason: format!("no answer within {:?}", hook.timeout),
                after: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receivers_answers_are_classified_by_whose_decision_they_are() {
        assert_eq!(classify(204, None), Delivery::Delivered(204));
        for s in [408, 429, 500, 502, 503] {
            assert!(matches!(classify(s, None), Delivery::Later { .. }), "{s}");
        }
        assert_eq!(
            classify(429, Some(Duration::from_secs(3))),
            Delivery::Later {
                reason: "the receiver answered 429".into(),
                after: Some(Duration::from_secs(3))
            }
        );
        for s in [400, 401, 403, 404, 410] {
            assert!(matches!(classify(s, None), Delivery::Refused(_)), "{s}");
        }
    }
}
