//! TLS termination on the ACME listener (rustls on ring): the operator's
//! certificate and key files, re-read when they change or on SIGHUP, or a
//! self-signed certificate for the public URL's host; HTTP/2 and HTTP/1.1
//! by ALPN. The connections themselves (the bounded handshake included)
//! are served by `listener`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

use crate::config::TlsConfig;

/// The listener's certificate: where it comes from and the one served now.
#[derive(Debug)]
pub struct Terminator {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// Modification times of (cert, key) when last loaded.
    loaded: Mutex<(Option<SystemTime>, Option<SystemTime>)>,
    reload_interval: Duration,
    pub handshake_timeout: Duration,
}

impl Terminator {
    /// Loads the configured files, or makes (once) the self-signed
    /// certificate for `base_url`'s host under `{data_dir}/tls/`. A file
    /// that does not parse, or a key that is not the certificate's, stops
    /// start-up.
    pub fn new(
        config: &TlsConfig,
        data_dir: &Path,
        base_url: &str,
        now: time::OffsetDateTime,
    ) -> Result<Self, String> {
        let (cert, key) = match (&config.cert, &config.key) {
            (Some(cert), Some(key)) => (cert.clone(), key.clone()),
            _ => self_signed(data_dir, base_url, now)?,
        };
        let loaded = load(&cert, &key)?;
        Ok(Self {
            loaded: Mutex::new(stamps(&cert, &key)),
            cert,
            key,
            current: RwLock::new(Arc::new(loaded)),
            reload_interval: config.reload_interval,
            handshake_timeout: config.handshake_timeout,
        })
    }

    /// The certificate file served (for the start-up summary: what clients
    /// must trust when it is self-signed).
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// rustls settings: TLS 1.2 and 1.3, h2 then http/1.1, the certificate
    /// looked up per handshake so a reload applies to new connections.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, String> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Resolver(Arc::clone(self))));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Re-reads the files; on failure the certificate served stays as it
    /// was and the error is returned (and logged by the caller).
    pub fn reload(&self) -> Result<(), String> {
        let stamps = stamps(&self.cert, &self.key);
        let fresh = load(&self.cert, &self.key)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
        *self.loaded.lock().unwrap_or_else(|p| p.into_inner()) = stamps;
        Ok(())
    }

    fn changed(&self) -> bool {
        *self.loaded.lock().unwrap_or_else(|p| p.into_inner()) != stamps(&self.cert, &self.key)
    }

    /// Reloads when the files change (checked every `reload_interval`) and
    /// at once on `hangup` (SIGHUP, registered by the caller before the
    /// server is up, so an early signal cannot end the process), until `stop`.
    pub async fn watch(
        self: Arc<Self>,
        mut hangup: Option<tokio::signal::unix::Signal>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let why = tokio::select! {
                () = crate::listener::stopped(&mut stop) => return,
                _ = tokio::time::sleep(self.reload_interval) => {
                    if !self.changed() {
                        continue;
                    }
                    "the files changed"
                }
                Some(()) = async {
                    match hangup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                } => "SIGHUP",
            };
            self.reload_logged(why);
        }
    }

    /// [`Terminator::reload`], its outcome logged with `why`.
    pub fn reload_logged(&self, why: &str) {
        match self.reload() {
            Ok(()) => {
                tracing::info!(event = "tls.reload", outcome = "success", cert = %self.cert.display(), why, "TLS certificate reloaded")
            }
            Err(e) => {
                tracing::error!(event = "tls.reload", outcome = "failure", cert = %self.cert.display(), why, error = %e, "TLS certificate not reloaded; still serving the previous one")
            }
        }
    }
}

#[derive(Debug)]
struct Resolver(Arc<Terminator>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.0.current.read().unwrap_or_else(|p| p.into_inner()),
        ))
    }
}

fn stamps(cert: &Path, key: &Path) -> (Option<SystemTime>, Option<SystemTime>) {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    (mtime(cert), mtime(key))
}

/// Reads a PEM chain and key and checks that they belong together.
fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("tls.cert {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls.cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "tls.cert {}: no PEM certificate in it",
            cert.display()
        ));
    }
    let private =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("tls.key {}: {e}", key.display()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&private)
        .map_err(|e| format!("tls.key {}: {e}", key.display()))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(e) => Err(format!(
            "tls.key {} is not the key of tls.cert {}: {e}",
            key.display(),
            cert.display()
        )),
    }
}

/// The self-signed certificate for the public URL's host: made once
/// (ECDSA P-256, ten years), then reused; a new host gets a new file.
/// Whether [`Terminator::new`] would generate the self-signed certificate,
/// for a dry run of start-up that creates nothing.
pub fn still_to_generate(config: &TlsConfig, data_dir: &Path, base_url: &str) -> bool {
    (config.cert.is_none() || config.key.is_none())
        && self_signed_paths(data_dir, base_url)
            .is_ok_and(|(_, cert, key)| !(cert.is_file() && key.is_file()))
}

fn self_signed(
    data_dir: &Path,
    base_url: &str,
    now: time::OffsetDateTime,
) -> Result<(PathBuf, PathBuf), String> {
    let (host, cert_path, key_path) = self_signed_paths(data_dir, base_url)?;
    if cert_path.is_file() && key_path.is_file() {
        return Ok((cert_path, key_path));
    }
    let dir = data_dir.join("tls");
    crate::private::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| format!("generating the TLS key: {e}"))?;
    let mut params = rcgen::CertificateParams::new(vec![host.clone()])
        .map_err(|e| format!("the TLS certificate for {host}: {e}"))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, host.clone());
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(3650);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("self-signing the TLS certificate: {e}"))?;
    // The key first, 0600 from its creation.
    crate::private::write(&key_path, key.serialize_pem().as_bytes())
        .map_err(|e| format!("writing {}: {e}", key_path.display()))?;
    crate::private::write(&cert_path, cert.pem().as_bytes())
        .map_err(|e| format!("writing {}: {e}", cert_path.display()))?;
    tracing::info!(event = "tls.self_signed", outcome = "success", host = %host, cert = %cert_path.display(), "generated a self-signed TLS certificate");
    Ok((cert_path, key_path))
}

/// The public URL's host and where its self-signed certificate and key are
/// kept under `{data_dir}/tls/`.
fn self_signed_paths(
    data_dir: &Path,
    base_url: &str,
) -> Result<(String, PathBuf, PathBuf), String> {
    let host = base_url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_owned()))
        .ok_or_else(|| format!("no host in the public URL {base_url}"))?;
    let dir = data_dir.join("tls");
    let stem: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let cert_path = dir.join(format!("self-signed-{stem}.pem"));
    let key_path = dir.join(format!("self-signed-{stem}.key.pem"));
    Ok((host, cert_path, key_path))
}
