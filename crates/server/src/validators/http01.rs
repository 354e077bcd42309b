//! http-01 (RFC 8555 §8.3): fetch
//! `http://{identifier}:{port}/.well-known/acme-challenge/{token}` and
//! compare the body with the key authorization.
//!
//! Redirects are followed (§8.3 "SHOULD follow redirects") at most
//! [`MAX_REDIRECTS`] times, only to names (never to an address literal),
//! over `http` or `https` on ports 80 and 443 (and the configured http-01
//! port, which tests move off 80); every address connected to, first hop
//! or redirect, passes `validation.deny_networks` first. So neither the
//! identifier nor a redirect can turn validation against the server's own
//! loopback services or a metadata endpoint (§10.2), and what answers is
//! never relayed to the client beyond its status and length. The response
//! body is capped at [`MAX_BODY`] octets and the whole validation runs
//! under the configured timeout.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use acme_proxy_protocol::ProblemType;
use bytes::Bytes;
use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::{ValidationError, ValidationTarget, Validators};

/// Redirect hops followed at most.
pub const MAX_REDIRECTS: usize = 5;
/// Largest body read: a key authorization is under 100 octets.
pub const MAX_BODY: usize = 1024;

const USER_AGENT: &str = concat!(
    "acme-proxy/",
    env!("CARGO_PKG_VERSION"),
    " (http-01 validation)"
);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    https: bool,
    host: String,
    port: u16,
    path_and_query: String,
}

impl Target {
    /// The host as it appears in a URL or Host header: an IPv6 address in
    /// brackets (RFC 3986 §3.2.2), as RFC 8738 §6 validation needs.
    fn authority_host(&self) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => self.host.clone(),
        }
    }

    fn url(&self) -> String {
        format!(
            "{}://{}:{}{}",
            if self.https { "https" } else { "http" },
            self.authority_host(),
            self.port,
            self.path_and_query
        )
    }
}

pub async fn validate(v: &Validators, t: &ValidationTarget) -> Result<(), ValidationError> {
    let mut target = Target {
        https: false,
        host: t.identifier.clone(),
        port: v.http_port,
        path_and_query: format!("/.well-known/acme-challenge/{}", t.token),
    };
    // How the current target was reached, for the detail of a failure.
    let mut via: Option<String> = None;
    for hop in 0..=MAX_REDIRECTS {
        let (status, location, body) = fetch(v, &target).await.map_err(|mut e| {
            if let Some(via) = &via {
                e.detail = format!("{via}: {}", e.detail);
            }
            e
        })?;
        if status.is_redirection() {
            let redirected = |why: String| {
                unauthorized(format!(
                    "{} answered HTTP {} with a redirect that is not followed: {why}",
                    target.url(),
                    status.as_u16()
                ))
            };
            if hop == MAX_REDIRECTS {
                return Err(redirected(format!("more than {MAX_REDIRECTS} redirects")));
            }
            let location = location.ok_or_else(|| redirected("it has no Location".to_owned()))?;
            let next = follow(v.http_port, &target, &location).map_err(redirected)?;
            via = Some(format!(
                "{} answered HTTP {} redirecting to {}",
                target.url(),
                status.as_u16(),
                next.url()
            ));
            target = next;
            continue;
        }
        if status != StatusCode::OK {
            return Err(unauthorized(format!(
                "{} answered HTTP {}, expected 200 with the key authorization",
                target.url(),
                status.as_u16()
            )));
        }
        // §8.3: trailing whitespace is ignored.
        let got = trim_trailing_ws(&body);
        let want = t.key_authorization.as_bytes();
        if got.len() == want.len() && bool::from(got.ct_eq(want)) {
            return Ok(());
        }
        // Only the length: whatever answered (after a redirect, perhaps an
        // internal service) must not have its words relayed to the client.
        return Err(ValidationError::new(
            ProblemType::IncorrectResponse,
            format!(
                "{} answered HTTP 200 with {} octets that are not the key authorization expected for token {}",
                target.url(),
                got.len(),
                t.token
            ),
        ));
    }
    Err(unauthorized("too many redirects".to_owned()))
}

fn unauthorized(detail: String) -> ValidationError {
    ValidationError::new(ProblemType::Unauthorized, detail)
}

fn trim_trailing_ws(b: &[u8]) -> &[u8] {
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    &b[..end]
}

/// Resolves the next hop of a redirect, enforcing the scheme, host and
/// port rules; the error says why the hop is refused. Where the new host's
/// addresses may be reached is decided when it is fetched
/// ([`Validators::reachable`]), before connecting.
fn follow(http_port: u16, from: &Target, location: &str) -> Result<Target, String> {
    if location.starts_with('/') && !location.starts_with("//") {
        return Ok(Target {
            path_and_query: location.to_owned(),
            ..from.clone()
        });
    }
    let uri: Uri = location
        .parse()
        .map_err(|_| format!("the Location {location:?} does not parse"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => {
            return Err(format!(
                "{location:?}: only http and https URLs are followed"
            ));
        }
    };
    let host = uri
        .host()
        .ok_or_else(|| format!("{location:?} has no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    // As Boulder does: a name can be looked up and judged by its
    // addresses, and a client that controls its name has no need to send
    // us to an address literal.
    if host.parse::<IpAddr>().is_ok() {
        return Err(format!(
            "{location:?}: redirects to an IP address are not followed, only to names"
        ));
    }
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let allowed = port == 80 || port == 443 || (!https && port == http_port);
    if !allowed {
        return Err(format!("{location:?}: only ports 80 and 443 are followed"));
    }
    Ok(Target {
        https,
        host,
        port,
        path_and_query: uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
    })
}

async fn fetch(
    v: &Validators,
    target: &Target,
) -> Result<(StatusCode, Option<String>, Bytes), ValidationError> {
    let addrs = v.reachable(&target.host).await?;
    let mut last_err = String::new();
    let mut stream = None;
    for ip in addrs {
        let addr = SocketAddr::new(ip, target.port);
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                stream = Some(s);
                break;
            }
            Ok(Err(e)) => last_err = format!("connecting to {addr}: {e}"),
            Err(_) => last_err = format!("connecting to {addr}: timed out"),
        }
    }
    let stream = stream.ok_or_else(|| {
        ValidationError::new(
            ProblemType::Connection,
            format!(
                "could not connect to {} for http-01: {last_err}",
                target.host
            ),
        )
    })?;
    let _ = stream.set_nodelay(true);
    let host_header =
        if (target.https && target.port == 443) || (!target.https && target.port == 80) {
            target.authority_host()
        } else {
            format!("{}:{}", target.authority_host(), target.port)
        };
    if target.https {
        let server_name = match target.host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(target.host.clone()).map_err(|_| {
                ValidationError::new(
                    ProblemType::Tls,
                    format!("{:?} is not a TLS server name", target.host),
                )
            })?,
        };
        let tls = tokio_rustls::TlsConnector::from(Arc::clone(&v.tls))
            .connect(server_name, stream)
            .await
            .map_err(|e| {
                ValidationError::new(
                    ProblemType::Tls,
                    format!("TLS handshake with {} failed: {e}", target.url()),
                )
            })?;
        exchange(tls, target, &host_header).await
    } else {
        exchange(stream, target, &host_header).await
    }
}

async fn exchange<IO>(
    io: IO,
    target: &Target,
    host: &str,
) -> Result<(StatusCode, Option<String>, Bytes), ValidationError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn_err = |e: hyper::Error| {
        ValidationError::new(
            ProblemType::Connection,
            format!("fetching {}: {e}", target.url()),
        )
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(conn_err)?;
    let driver = tokio::spawn(conn);
    let request = Request::get(target.path_and_query.as_str())
        .header(header::HOST, host)
        .header(header::USER_AGENT, USER_AGENT)
        .header(header::ACCEPT, "*/*")
        .body(Empty::<Bytes>::new())
        .map_err(|e| unauthorized(format!("cannot build a request for {}: {e}", target.url())))?;
    let response = sender.send_request(request).await.map_err(conn_err)?;
    let status = response.status();
    let location = response
        .headers()
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| {
            unauthorized(format!(
                "reading the answer of {}: {e} (at most {MAX_BODY} octets are read)",
                target.url()
            ))
        })?
        .to_bytes();
    driver.abort();
    Ok((status, location, body))
}

/// A TLS client configuration that accepts any server certificate.
///
/// DANGER: used only to follow an http-01 redirect to https, where RFC 8555
/// §8.3 validation proves control through the body, not the certificate
/// (the name may not even have a certificate yet — that is why the client
/// is asking us for one), and for tls-alpn-01, whose certificate is checked
/// by `tlsalpn01` itself (RFC 8737 §3), not by a chain of trust.
pub fn danger_unverified_tls_config(alpn: &[u8]) -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(DangerAcceptAnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

/// The SubjectPublicKeyInfo (DER) of a certificate and its key bits.
fn spki_of(cert: &CertificateDer<'_>) -> Result<(Vec<u8>, Vec<u8>), rustls::Error> {
    use x509_parser::prelude::FromDer;
    let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(cert.as_ref())
        .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
    let spki = parsed.public_key();
    Ok((spki.raw.to_vec(), spki.subject_public_key.data.to_vec()))
}

#[derive(Debug)]
struct DangerAcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for DangerAcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    // The handshake signature is checked against the certificate's key,
    // read with x509-parser rather than webpki: webpki refuses certificates
    // with critical extensions it does not know, and the tls-alpn-01
    // certificate's acmeIdentifier extension is critical by design.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let (_, key) = spki_of(cert)?;
        let candidates = self
            .0
            .signature_verification_algorithms
            .mapping
            .iter()
            .find(|(scheme, _)| *scheme == dss.scheme)
            .map(|(_, algs)| *algs)
            .ok_or(rustls::Error::PeerMisbehaved(
                rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme,
            ))?;
        if candidates
            .iter()
            .any(|alg| alg.verify_signature(&key, message, dss.signature()).is_ok())
        {
            Ok(HandshakeSignatureValid::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::BadSignature,
            ))
        }
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let (spki, _) = spki_of(cert)?;
        rustls::crypto::verify_tls13_signature_with_raw_key(
            message,
            &rustls::pki_types::SubjectPublicKeyInfoDer::from(spki),
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from() -> Target {
        Target {
            https: false,
            host: "a.example.test".into(),
            port: 5002,
            path_and_query: "/.well-known/acme-challenge/t".into(),
        }
    }

    #[test]
    fn redirects_are_followed_only_to_http_or_https_on_the_allowed_ports() {
        let ok = follow(5002, &from(), "https://b.example.test/x").unwrap();
        assert!(ok.https);
        assert_eq!(
            (ok.host.as_str(), ok.port, ok.path_and_query.as_str()),
            ("b.example.test", 443, "/x")
        );
        let rel = follow(5002, &from(), "/other").unwrap();
        assert_eq!((rel.port, rel.path_and_query.as_str()), (5002, "/other"));
        assert!(follow(5002, &from(), "http://b.example.test:8080/").is_err());
        assert!(follow(5002, &from(), "ftp://b.example.test/").is_err());
        assert!(follow(5002, &from(), "https://b.example.test:5002/").is_err());
        assert!(follow(5002, &from(), "http://b.example.test:5002/").is_ok());
    }

    #[test]
    fn a_redirect_to_an_address_literal_is_refused_whatever_the_address() {
        for location in [
            "http://127.0.0.2/x",
            "http://169.254.169.254/latest/meta-data/",
            "https://[::1]/",
            "http://10.1.2.3/",
            "http://[::ffff:127.0.0.1]/",
        ] {
            let e = follow(5002, &from(), location).unwrap_err();
            assert!(e.contains("IP address"), "{location}: {e}");
        }
    }

    #[test]
    fn trailing_whitespace_is_ignored_and_nothing_else() {
        assert_eq!(trim_trailing_ws(b"abc \r\n\t"), b"abc");
        assert_eq!(trim_trailing_ws(b" abc"), b" abc");
        assert_eq!(trim_trailing_ws(b"   "), b"");
    }
}
