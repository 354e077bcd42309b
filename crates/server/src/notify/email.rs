//! Email delivery with lettre over SMTP (RFC 5321): STARTTLS that must
//! succeed (RFC 3207), TLS from the first byte, or plain for a local relay.
//! One message per delivery job; the answer is classified like a webhook's.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::{Mailbox, Message};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use super::webhook::Delivery;
use crate::config::{EmailConfig, SmtpTls};

/// One email destination, built (and checked) at start-up: addresses that
/// do not parse, an unreadable password file or trust anchors stop the
/// server instead of failing every delivery later.
#[derive(Clone)]
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    to: Vec<Mailbox>,
    timeout: Duration,
}

impl std::fmt::Debug for Mailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The transport holds the SMTP password: never printed.
        f.debug_struct("Mailer")
            .field("from", &self.from.to_string())
            .field("to", &self.to.len())
            .finish()
    }
}

impl Mailer {
    /// `key` names the destination in errors (`profiles.P.notify.emails.N`).
    pub fn new(key: &str, config: &EmailConfig) -> Result<Self, String> {
        let from: Mailbox = config.from.parse().map_err(|e| {
            format!(
                "{key}.from {:?}: {e}; write e.g. from = \"acme-proxy <pki@example.org>\"",
                config.from
            )
        })?;
        let to = config
            .to
            .iter()
            .map(|t| {
                t.parse::<Mailbox>()
                    .map_err(|e| format!("{key}.to {t:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tls = match config.tls {
            SmtpTls::None => Tls::None,
            SmtpTls::Starttls => Tls::Required(tls_parameters(key, config)?),
            SmtpTls::Tls => Tls::Wrapper(tls_parameters(key, config)?),
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&config.host)
            .port(config.port())
            .tls(tls)
            // Each SMTP command's own bound; the whole delivery is bounded
            // again in `send`.
            .timeout(Some(config.timeout));
        if let (Some(user), Some(file)) = (&config.username, &config.password_file) {
            let password = std::fs::read_to_string(file)
                .map_err(|e| format!("{key}.password_file {}: {e}", file.display()))?;
            builder = builder.credentials(Credentials::new(
                user.clone(),
                password.trim_end_matches(['\r', '\n']).to_owned(),
            ));
        }
        Ok(Self {
            transport: builder.build(),
            from,
            to,
            timeout: config.timeout,
        })
    }

    /// Sends one message. A refusal with a permanent (5xx) reply is
    /// `Refused`; a connection, TLS or timeout failure, or a transient (4xx)
    /// reply, is `Later`.
    pub async fn send(&self, subject: &str, body: String) -> Delivery {
        // A header cannot span lines: the subject is its template's first line.
        let subject = subject.lines().next().unwrap_or("").trim();
        let mut message = Message::builder()
            .from(self.from.clone())
            .subject(subject)
            .header(ContentType::TEXT_PLAIN);
        for to in &self.to {
            message = message.to(to.clone());
        }
        let message = match message.body(body) {
            Ok(m) => m,
            Err(e) => return Delivery::Refused(format!("the message cannot be built: {e}")),
        };
        match tokio::time::timeout(self.timeout, self.transport.send(message)).await {
            Err(_) => Delivery::Later {
                reason: format!("the SMTP dialogue took longer than {:?}", self.timeout),
                after: None,
            },
            Ok(Ok(response)) => Delivery::Delivered(u16::from(response.code())),
            Ok(Err(e)) if e.is_permanent() => {
                Delivery::Refused(format!("the SMTP server refused it: {e}"))
            }
            Ok(Err(e)) => Delivery::Later {
                reason: format!("smtp: {e}"),
                after: None,
            },
        }
    }
}

/// TLS toward the SMTP server: the system roots plus the operator's anchors,
/// the certificate checked against `host`.
fn tls_parameters(key: &str, config: &EmailConfig) -> Result<TlsParameters, String> {
    let mut builder = TlsParameters::builder(config.host.clone());
    if let Some(path) = &config.trust_anchors {
        let pem = std::fs::read(path)
            .map_err(|e| format!("{key}.trust_anchors {}: {e}", path.display()))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(format!(
                "{key}.trust_anchors {}: no PEM certificate in it",
                path.display()
            ));
        }
        let cert = Certificate::from_pem(&pem)
            .map_err(|e| format!("{key}.trust_anchors {}: {e}", path.display()))?;
        builder = builder.add_root_certificate(cert);
    }
    builder
        .build_rustls()
        .map_err(|e| format!("{key}: TLS settings: {e}"))
}
