//! instant-acme as the client: the steps every flow test repeats.

use instant_acme::{
    Account, AuthorizationStatus, ChallengeType, Identifier, NewAccount, NewOrder, OrderStatus,
    RetryPolicy,
};
use std::time::Duration;

use crate::harness::Responder;

pub fn retry() -> RetryPolicy {
    RetryPolicy::new()
        .initial_delay(Duration::from_millis(50))
        .backoff(1.5)
        .timeout(Duration::from_secs(20))
}

/// An instant-acme builder over plain HTTP (its default client speaks only
/// HTTPS), with Nagle off as every ACME client should.
pub fn builder() -> instant_acme::AccountBuilder {
    Account::builder_with_http(Box::new(builder_client()))
}

fn builder_client() -> hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    instant_acme::BodyWrapper<bytes::Bytes>,
> {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(connector)
}

pub async fn account(directory: &str) -> Account {
    create_account(builder(), directory).await
}

/// An account over https, trusting the CA certificate in `ca_pem`.
pub async fn account_with_roots(directory: &str, ca_pem: &std::path::Path) -> Account {
    create_account(
        Account::builder_with_root(ca_pem).expect("a client trusting the CA"),
        directory,
    )
    .await
}

/// An account whose every request carries the extra header `header`.
pub async fn account_with_header(directory: &str, header: (&'static str, &'static str)) -> Account {
    let inner = Box::new(builder_client());
    create_account(
        Account::builder_with_http(Box::new(WithHeader { inner, header })),
        directory,
    )
    .await
}

/// An HTTP client adding one header to every request.
struct WithHeader {
    inner: Box<dyn instant_acme::HttpClient>,
    header: (&'static str, &'static str),
}

impl instant_acme::HttpClient for WithHeader {
    fn request(
        &self,
        mut req: http::Request<instant_acme::BodyWrapper<bytes::Bytes>>,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<instant_acme::BytesResponse, instant_acme::Error>,
                > + Send,
        >,
    > {
        req.headers_mut().insert(
            http::HeaderName::from_static(self.header.0),
            http::HeaderValue::from_static(self.header.1),
        );
        self.inner.request(req)
    }
}

async fn create_account(builder: instant_acme::AccountBuilder, directory: &str) -> Account {
    let (account, _credentials) = builder
        .create(
            &NewAccount {
                contact: &["mailto:ops@example.test"],
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            directory.to_owned(),
            None,
        )
        .await
        .expect("account created");
    account
}

/// Runs one whole issuance with http-01 answered by `responder`; returns the
/// PEM chain and the certificate's private key (PEM).
pub async fn issue(account: &Account, responder: &Responder, names: &[&str]) -> (String, String) {
    let identifiers: Vec<Identifier> = names
        .iter()
        .map(|n| Identifier::Dns((*n).to_owned()))
        .collect();
    let mut order = account
        .new_order(&NewOrder::new(&identifiers))
        .await
        .expect("new order");
    assert_eq!(order.state().status, OrderStatus::Pending);
    let mut authorizations = order.authorizations();
    while let Some(authz) = authorizations.next().await {
        let mut authz = authz.expect("authorization");
        assert_eq!(authz.status, AuthorizationStatus::Pending);
        let mut challenge = authz
            .challenge(ChallengeType::Http01)
            .expect("http-01 offered");
        let ka = challenge.key_authorization();
        responder.publish(&challenge.token, ka.as_str());
        challenge.set_ready().await.expect("challenge triggered");
    }
    let status = order.poll_ready(&retry()).await.expect("order settles");
    assert_eq!(status, OrderStatus::Ready, "order after validation");
    let key_pem = order.finalize().await.expect("finalize");
    let chain = order.poll_certificate(&retry()).await.expect("certificate");
    (chain, key_pem)
}

/// The RFC 8555 problem type of an instant-acme error, e.g. "badNonce".
pub fn problem_type(e: &instant_acme::Error) -> String {
    match e {
        instant_acme::Error::Api(p) => p
            .r#type
            .clone()
            .unwrap_or_default()
            .trim_start_matches("urn:ietf:params:acme:error:")
            .to_owned(),
        other => format!("not a problem document: {other}"),
    }
}
