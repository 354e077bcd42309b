//! tls-alpn-01 (RFC 8737): a TLS handshake to the identifier on port 443
//! (configurable), offering only the ALPN protocol `acme-tls/1`, with SNI
//! the identifier (for an IP address, its reverse-DNS name: RFC 8738 §6).
//!
//! The certificate is trusted for nothing: it must carry exactly one SAN,
//! equal to the identifier, and the critical `id-pe-acmeIdentifier`
//! extension holding SHA-256 of the key authorization, compared in constant
//! time (RFC 8737 §3).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use acme_proxy_protocol::ProblemType;
use rustls::pki_types::ServerName;
use subtle::ConstantTimeEq;
use tokio::net::TcpStream;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{ValidationError, ValidationTarget, Validators};

/// The ALPN protocol of RFC 8737 §6.2.
pub const ACME_TLS_1: &[u8] = b"acme-tls/1";

/// id-pe-acmeIdentifier, 1.3.6.1.5.5.7.1.31 (RFC 8737 §6.1).
const ACME_IDENTIFIER_OID: &str = "1.3.6.1.5.5.7.1.31";

fn err(kind: ProblemType, detail: String) -> ValidationError {
    ValidationError::new(kind, detail)
}

/// The reverse-DNS name of an IP address (RFC 8738 §6), e.g.
/// `1.0.0.127.in-addr.arpa` for 127.0.0.1.
pub fn reverse_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let mut labels: Vec<String> = Vec::with_capacity(34);
            for byte in v6.octets().iter().rev() {
                labels.push(format!("{:x}", byte & 0x0f));
                labels.push(format!("{:x}", byte >> 4));
            }
            labels.push("ip6.arpa".into());
            labels.join(".")
        }
    }
}

pub async fn validate(v: &Validators, t: &ValidationTarget) -> Result<(), ValidationError> {
    let ip_identifier = t.identifier.parse::<IpAddr>().ok();
    let sni = match ip_identifier {
        Some(ip) => reverse_name(ip),
        None => t.identifier.clone(),
    };
    let server_name = ServerName::try_from(sni.clone()).map_err(|_| {
        err(
            ProblemType::Malformed,
            format!("{sni:?} cannot be sent as SNI"),
        )
    })?;
    let addrs = v.reachable(&t.identifier).await?;
    let mut last = String::new();
    let mut stream = None;
    for ip in addrs {
        let addr = SocketAddr::new(ip, v.tls_port);
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                stream = Some(s);
                break;
            }
            Ok(Err(e)) => last = format!("connecting to {addr}: {e}"),
            Err(_) => last = format!("connecting to {addr}: timed out"),
        }
    }
    let stream = stream.ok_or_else(|| {
        err(
            ProblemType::Connection,
            format!(
                "could not connect to {} for tls-alpn-01: {last}",
                t.identifier
            ),
        )
    })?;
    let tls = tokio_rustls::TlsConnector::from(Arc::clone(&v.tls_alpn))
        .connect(server_name, stream)
        .await
        .map_err(|e| {
            err(
                ProblemType::Tls,
                format!(
                    "TLS handshake with {} (SNI {sni}) failed: {e}",
                    t.identifier
                ),
            )
        })?;
    let (_, session) = tls.get_ref();
    if session.alpn_protocol() != Some(ACME_TLS_1) {
        return Err(err(
            ProblemType::Tls,
            format!(
                "{} did not negotiate the acme-tls/1 protocol (RFC 8737 §3)",
                t.identifier
            ),
        ));
    }
    let cert = session
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or_else(|| {
            err(
                ProblemType::Tls,
                format!("{} presented no certificate", t.identifier),
            )
        })?;
    let (_, cert) = X509Certificate::from_der(cert.as_ref()).map_err(|e| {
        err(
            ProblemType::Unauthorized,
            format!("the certificate of {} does not parse: {e}", t.identifier),
        )
    })?;
    check_certificate(&cert, &t.identifier, ip_identifier, &t.key_authorization)
}

/// RFC 8737 §3's checks on the validation certificate.
fn check_certificate(
    cert: &X509Certificate<'_>,
    identifier: &str,
    ip: Option<IpAddr>,
    key_authorization: &str,
) -> Result<(), ValidationError> {
    let sans: Vec<&GeneralName<'_>> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|e| e.value.general_names.iter().collect())
        .unwrap_or_default();
    let matches = match (sans.as_slice(), ip) {
        ([GeneralName::DNSName(n)], None) => n.eq_ignore_ascii_case(identifier),
        ([GeneralName::IPAddress(b)], Some(ip)) => match ip {
            IpAddr::V4(v4) => *b == v4.octets().as_slice(),
            IpAddr::V6(v6) => *b == v6.octets().as_slice(),
        },
        _ => false,
    };
    if !matches {
        return Err(err(
            ProblemType::Unauthorized,
            format!("the tls-alpn-01 certificate must have exactly one SAN, {identifier}"),
        ));
    }
    let ext = cert
        .extensions()
        .iter()
        .find(|e| e.oid.to_id_string() == ACME_IDENTIFIER_OID)
        .ok_or_else(|| {
            err(
                ProblemType::Unauthorized,
                "the certificate lacks the acmeIdentifier extension".into(),
            )
        })?;
    if !ext.critical {
        return Err(err(
            ProblemType::Unauthorized,
            "the acmeIdentifier extension must be critical".into(),
        ));
    }
    // extnValue holds the DER OCTET STRING of the 32-octet digest.
    let digest = ring::digest::digest(&ring::digest::SHA256, key_authorization.as_bytes());
    let mut want = vec![0x04, 0x20];
    want.extend_from_slice(digest.as_ref());
    if ext.value.len() == want.len() && bool::from(ext.value.ct_eq(&want)) {
        Ok(())
    } else {
        Err(err(
            ProblemType::IncorrectResponse,
            format!(
                "the acmeIdentifier extension of {identifier}'s certificate does not hold this challenge's digest"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_names_follow_rfc_8738() {
        assert_eq!(
            reverse_name("127.0.0.1".parse().unwrap()),
            "1.0.0.127.in-addr.arpa"
        );
        assert_eq!(
            reverse_name("2001:db8::1".parse().unwrap()),
            "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa"
        );
    }

    fn cert(sans: Vec<String>, digest_of: &str, critical: bool) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(sans).unwrap();
        let d = ring::digest::digest(&ring::digest::SHA256, digest_of.as_bytes());
        let mut ext = rcgen::CustomExtension::new_acme_identifier(d.as_ref());
        ext.set_criticality(critical);
        p.custom_extensions.push(ext);
        p.self_signed(&key).unwrap().der().to_vec()
    }

    fn check(der: &[u8]) -> Result<(), ProblemType> {
        let (_, c) = X509Certificate::from_der(der).unwrap();
        check_certificate(&c, "a.example.test", None, "tok.thumb").map_err(|e| e.kind)
    }

    #[test]
    fn the_validation_certificate_must_carry_one_san_and_the_right_critical_digest() {
        assert_eq!(
            check(&cert(vec!["a.example.test".into()], "tok.thumb", true)),
            Ok(())
        );
        assert_eq!(
            check(&cert(vec!["A.Example.Test".into()], "tok.thumb", true)),
            Ok(())
        );
        assert_eq!(
            check(&cert(vec!["a.example.test".into()], "other", true)),
            Err(ProblemType::IncorrectResponse)
        );
        assert_eq!(
            check(&cert(
                vec!["a.example.test".into(), "b.example.test".into()],
                "tok.thumb",
                true
            )),
            Err(ProblemType::Unauthorized)
        );
        assert_eq!(
            check(&cert(vec!["b.example.test".into()], "tok.thumb", true)),
            Err(ProblemType::Unauthorized)
        );
        assert_eq!(
            check(&cert(vec!["a.example.test".into()], "tok.thumb", false)),
            Err(ProblemType::Unauthorized)
        );
    }
}
