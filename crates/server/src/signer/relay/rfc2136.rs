//! dns01 publication: RFC 2136 dynamic updates signed with TSIG (RFC 8945).
//!
//! Records are *added to* and *deleted from* the `_acme-challenge` RRset by
//! value (RFC 2136 §2.5.1 and §2.5.4), never replaced as a set: a name and
//! its wildcard, or two orders for one name, share one RRset, and removing
//! one attempt's value must leave the others in place.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use base64::Engine;
use hickory_proto::op::{Message, ResponseCode, update_message};
use hickory_proto::rr::rdata::TXT;
use hickory_proto::rr::rdata::tsig::TsigAlgorithm;
use hickory_proto::rr::{Name, RData, RecordSet, RecordType, TSigner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::classify::RelayError;
use crate::clock::SharedClock;
use crate::config::Rfc2136Config;

/// Allowed clock difference between us and the DNS server (RFC 8945 §5.2.3
/// recommends 300 seconds).
const TSIG_FUDGE: u16 = 300;

/// A primary server that takes signed updates for some zones.
pub struct Rfc2136 {
    server: SocketAddr,
    zones: Vec<Name>,
    signer: TSigner,
    ttl: u32,
    timeout: Duration,
    clock: SharedClock,
    /// Values this process published, by (name, value), with how many
    /// attempts hold each: two orders whose upstream authorizations share a
    /// value (one pending authorization reused) must not delete it from
    /// under each other.
    held: std::sync::Mutex<std::collections::HashMap<(String, String), usize>>,
}

impl std::fmt::Debug for Rfc2136 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The TSIG secret is never printed.
        f.debug_struct("Rfc2136")
            .field("server", &self.server)
            .field("zones", &self.zones)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Rfc2136 {
    pub fn new(
        config: &Rfc2136Config,
        timeout: Duration,
        clock: SharedClock,
    ) -> Result<Self, String> {
        let secret_text = std::fs::read_to_string(&config.tsig_secret_file).map_err(|e| {
            format!(
                "reading the TSIG secret {}: {e}",
                config.tsig_secret_file.display()
            )
        })?;
        let secret = base64::engine::general_purpose::STANDARD
            .decode(secret_text.trim())
            .map_err(|_| {
                format!(
                    "the TSIG secret in {} is not base64 (write the secret exactly as tsig-keygen prints it)",
                    config.tsig_secret_file.display()
                )
            })?;
        let algorithm = match config.tsig_algorithm.as_str() {
            "hmac-sha256" => TsigAlgorithm::HmacSha256,
            "hmac-sha384" => TsigAlgorithm::HmacSha384,
            "hmac-sha512" => TsigAlgorithm::HmacSha512,
            other => return Err(format!("TSIG algorithm {other:?} is not supported")),
        };
        let key_name = absolute(&config.tsig_key_name)
            .map_err(|e| format!("tsig_key_name {:?}: {e}", config.tsig_key_name))?;
        let signer = TSigner::new(secret, algorithm, key_name, TSIG_FUDGE)
            .map_err(|e| format!("TSIG key: {e}"))?;
        let zones = config
            .zones
            .iter()
            .map(|z| absolute(z).map_err(|e| format!("zone {z:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            server: config.server,
            zones,
            signer,
            ttl: config.ttl,
            timeout,
            clock,
            held: std::sync::Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// Adds `value` to the TXT RRset at `name` (absolute). Every call is
    /// one hold, released by one [`Rfc2136::delete_txt`].
    pub async fn add_txt(&self, name: &str, value: &str) -> Result<(), RelayError> {
        if let Ok(mut held) = self.held.lock() {
            *held.entry((name.to_owned(), value.to_owned())).or_default() += 1;
        }
        let (rrset, zone) = self.rrset(name, value)?;
        self.send(update_message::append(rrset, zone, false, true))
            .await
            .map_err(|e| e.context(&format!("adding TXT {name}")))
    }

    /// Releases one hold of `value` at `name`; the last one removes only
    /// that value from the TXT RRset.
    pub async fn delete_txt(&self, name: &str, value: &str) -> Result<(), RelayError> {
        if let Ok(mut held) = self.held.lock() {
            let key = (name.to_owned(), value.to_owned());
            match held.get_mut(&key) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    return Ok(());
                }
                _ => {
                    held.remove(&key);
                }
            }
        }
        let (rrset, zone) = self.rrset(name, value)?;
        self.send(update_message::delete_by_rdata(rrset, zone, true))
            .await
            .map_err(|e| e.context(&format!("deleting TXT {name}")))
    }

    fn rrset(&self, name: &str, value: &str) -> Result<(RecordSet, Name), RelayError> {
        let name = absolute(name).map_err(RelayError::permanent)?;
        let zone = self
            .zones
            .iter()
            .filter(|z| z.zone_of(&name))
            .max_by_key(|z| z.num_labels())
            .cloned()
            .ok_or_else(|| {
                RelayError::permanent(format!(
                    "{name} is in none of the configured dns01 zones {:?}",
                    self.zones.iter().map(|z| z.to_string()).collect::<Vec<_>>()
                ))
            })?;
        let mut rrset = RecordSet::with_ttl(name, RecordType::TXT, self.ttl);
        rrset.add_rdata(RData::TXT(TXT::new(vec![value.to_owned()])));
        Ok((rrset, zone))
    }

    /// Signs, sends over UDP (TCP when the answer is truncated), verifies
    /// the answer's TSIG and reads its response code.
    async fn send(&self, mut message: Message) -> Result<(), RelayError> {
        let id = rand_id();
        message.metadata.id = id;
        let now = self.clock.unix().max(0) as u64;
        let mut verifier = message
            .finalize(&self.signer, now)
            .map_err(|e| RelayError::permanent(format!("signing the update: {e}")))?
            .ok_or_else(|| RelayError::permanent("signing the update gave no verifier"))?;
        let bytes = message
            .to_vec()
            .map_err(|e| RelayError::permanent(format!("encoding the update: {e}")))?;
        let exchange = async {
            let mut answer = self.udp(&bytes).await?;
            if Message::from_vec(&answer).is_ok_and(|m| m.metadata.truncation) {
                answer = self.tcp(&bytes).await?;
            }
            Ok::<_, std::io::Error>(answer)
        };
        let answer = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| {
                RelayError::retryable(format!(
                    "the DNS server {} did not answer within {:?}",
                    self.server, self.timeout
                ))
            })?
            .map_err(|e| RelayError::retryable(format!("DNS server {}: {e}", self.server)))?;
        let unsigned = Message::from_vec(&answer)
            .map_err(|e| RelayError::retryable(format!("an unreadable DNS answer: {e}")))?;
        if unsigned.metadata.id != id {
            return Err(RelayError::retryable("a DNS answer for another request"));
        }
        let code = unsigned.metadata.response_code;
        // A refusal (NOTAUTH: key unknown or bad signature; REFUSED: policy)
        // comes unsigned or signed with an error; read the code first.
        match code {
            ResponseCode::NoError => {}
            ResponseCode::ServFail => {
                return Err(RelayError::retryable(format!(
                    "the DNS server answered {code}"
                )));
            }
            _ => {
                return Err(RelayError::permanent(format!(
                    "the DNS server refused the update: {code} (check the TSIG key, its algorithm and the zone's update-policy)"
                )));
            }
        }
        verifier.verify(&answer).map_err(|e| {
            RelayError::permanent(format!("the DNS answer's TSIG does not verify: {e}"))
        })?;
        Ok(())
    }

    async fn udp(&self, bytes: &[u8]) -> std::io::Result<Vec<u8>> {
        let local: SocketAddr = if self.server.is_ipv4() {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            SocketAddr::from(([0u16; 8], 0))
        };
        let socket = tokio::net::UdpSocket::bind(local).await?;
        socket.connect(self.server).await?;
        socket.send(bytes).await?;
        let mut buf = vec![0u8; 4096];
        let n = socket.recv(&mut buf).await?;
        buf.truncate(n);
        Ok(buf)
    }

    async fn tcp(&self, bytes: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut stream = tokio::net::TcpStream::connect(self.server).await?;
        let len = u16::try_from(bytes.len())
            .map_err(|_| std::io::Error::other("DNS message over 64 KiB"))?;
        stream.write_all(&len.to_be_bytes()).await?;
        stream.write_all(bytes).await?;
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await?;
        let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
        stream.read_exact(&mut buf).await?;
        Ok(buf)
    }
}

/// A name made absolute (a trailing dot), whatever the operator wrote.
fn absolute(name: &str) -> Result<Name, String> {
    let mut n = Name::from_str(name).map_err(|e| e.to_string())?;
    n.set_fqdn(true);
    Ok(n)
}

fn rand_id() -> u16 {
    let mut b = [0u8; 2];
    // ring's system RNG; a failure leaves a zero id, which still matches.
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    u16::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn server(zones: &[&str]) -> Rfc2136 {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("tsig");
        std::fs::write(&secret, "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0\n").unwrap();
        Rfc2136::new(
            &Rfc2136Config {
                server: "127.0.0.1:53".parse().unwrap(),
                zones: zones.iter().map(|z| z.to_string()).collect(),
                tsig_key_name: "acme-proxy".into(),
                tsig_algorithm: "hmac-sha256".into(),
                tsig_secret_file: secret,
                ttl: 60,
            },
            Duration::from_secs(1),
            std::sync::Arc::new(crate::clock::SystemClock),
        )
        .unwrap()
    }

    #[test]
    fn a_name_is_updated_in_the_longest_zone_that_contains_it() {
        let s = server(&["example.test", "sub.example.test."]);
        let (_, zone) = s.rrset("_acme-challenge.a.sub.example.test", "v").unwrap();
        assert_eq!(zone.to_string(), "sub.example.test.");
        let (rrset, zone) = s.rrset("_acme-challenge.b.example.test.", "v").unwrap();
        assert_eq!(zone.to_string(), "example.test.");
        assert!(rrset.name().is_fqdn());
    }

    #[test]
    fn a_name_outside_every_zone_is_a_permanent_error() {
        let s = server(&["example.test"]);
        let e = s.rrset("_acme-challenge.other.test.", "v").unwrap_err();
        assert!(e.is_permanent());
        assert!(e.detail.contains("example.test"), "{}", e.detail);
    }

    #[test]
    fn a_secret_that_is_not_base64_is_refused_with_what_to_write() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("tsig");
        std::fs::write(&secret, "not base64 !!").unwrap();
        let e = Rfc2136::new(
            &Rfc2136Config {
                server: "127.0.0.1:53".parse().unwrap(),
                zones: vec!["example.test".into()],
                tsig_key_name: "k".into(),
                tsig_algorithm: "hmac-sha256".into(),
                tsig_secret_file: secret,
                ttl: 60,
            },
            Duration::from_secs(1),
            std::sync::Arc::new(crate::clock::SystemClock),
        )
        .unwrap_err();
        assert!(e.contains("tsig-keygen"), "{e}");
    }
}
