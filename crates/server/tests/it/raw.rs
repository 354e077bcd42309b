//! A deliberately low-level ACME client for forging requests: it signs
//! whatever protected header and payload a test writes, and sends raw HTTP.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http_body_util::{BodyExt, Full};
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED_SIGNING, ECDSA_P384_SHA384_FIXED_SIGNING, EcdsaKeyPair, KeyPair,
};
use serde_json::{Value, json};

pub fn b64(b: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(b)
}

/// An ECDSA account key and its public JWK.
pub struct Key {
    pair: EcdsaKeyPair,
    pkcs8: Vec<u8>,
    alg: &'static ring::signature::EcdsaSigningAlgorithm,
    pub jwk: Value,
}

impl Clone for Key {
    fn clone(&self) -> Key {
        let pair = EcdsaKeyPair::from_pkcs8(self.alg, &self.pkcs8, &SystemRandom::new()).unwrap();
        Key {
            pair,
            pkcs8: self.pkcs8.clone(),
            alg: self.alg,
            jwk: self.jwk.clone(),
        }
    }
}

impl Key {
    pub fn p256() -> Key {
        Self::ec(&ECDSA_P256_SHA256_FIXED_SIGNING, "P-256", 32)
    }

    pub fn p384() -> Key {
        Self::ec(&ECDSA_P384_SHA384_FIXED_SIGNING, "P-384", 48)
    }

    fn ec(alg: &'static ring::signature::EcdsaSigningAlgorithm, crv: &str, len: usize) -> Key {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        let point = pair.public_key().as_ref().to_vec();
        let jwk = json!({"kty": "EC", "crv": crv, "x": b64(&point[1..=len]), "y": b64(&point[len + 1..])});
        Key {
            pair,
            pkcs8: pkcs8.as_ref().to_vec(),
            alg,
            jwk,
        }
    }

    /// The private key as PKCS#8 DER (e.g. for rcgen, to make a CSR with
    /// this key).
    pub fn pkcs8(&self) -> &[u8] {
        &self.pkcs8
    }

    pub fn alg(&self) -> &'static str {
        if self.jwk["crv"] == "P-256" {
            "ES256"
        } else {
            "ES384"
        }
    }

    /// Signs `protected` and `payload` (None = POST-as-GET) into a
    /// flattened JWS body.
    pub fn sign(&self, protected: &Value, payload: Option<&Value>) -> Value {
        let p = b64(protected.to_string().as_bytes());
        let body = payload
            .map(|v| b64(v.to_string().as_bytes()))
            .unwrap_or_default();
        let sig = self.sign_raw(format!("{p}.{body}").as_bytes());
        json!({"protected": p, "payload": body, "signature": b64(&sig)})
    }

    pub fn sign_raw(&self, msg: &[u8]) -> Vec<u8> {
        self.pair
            .sign(&SystemRandom::new(), msg)
            .unwrap()
            .as_ref()
            .to_vec()
    }
}

/// An HTTP response, decoded enough for assertions.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
    /// The nonce of the request's protected header, when it had one.
    pub sent_nonce: Option<String>,
}

/// The `nonce` in the protected header of a flattened JWS request body.
/// Lenient on purpose (padding trimmed), to find the nonce of the forged
/// bodies too.
pub fn nonce_sent(body: &[u8]) -> Option<String> {
    let jws: Value = serde_json::from_slice(body).ok()?;
    let protected = jws["protected"].as_str()?.trim_end_matches('=');
    let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(protected).ok()?).ok()?;
    header["nonce"].as_str().map(str::to_owned)
}

/// The short problem type of a document's `error` ("" when it has none).
pub fn error_type(doc: &Value) -> &str {
    doc["error"]["type"]
        .as_str()
        .unwrap_or("")
        .trim_start_matches("urn:ietf:params:acme:error:")
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The problem type's short name ("badNonce"), or "" if not a problem.
    pub fn problem(&self) -> String {
        self.json()["type"]
            .as_str()
            .unwrap_or("")
            .trim_start_matches("urn:ietf:params:acme:error:")
            .to_owned()
    }

    pub fn nonce(&self) -> Option<String> {
        self.headers
            .get("replay-nonce")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    /// Asserts a refusal: `status`, the problem type `problem`, a problem
    /// document, and a `Replay-Nonce` that is not the nonce the request
    /// used (RFC 8555 §6.5: a fresh nonce on every response to a POST,
    /// errors included, so the client can retry).
    pub fn assert_refused(&self, status: u16, problem: &str, what: &str) {
        assert_eq!(
            (self.status, self.problem().as_str()),
            (status, problem),
            "{what}: {}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(
            self.headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json"),
            "{what}"
        );
        self.assert_fresh_nonce(what);
    }

    /// Asserts a `Replay-Nonce` other than the one the request used.
    pub fn assert_fresh_nonce(&self, what: &str) {
        let fresh = self.nonce();
        assert!(fresh.is_some(), "{what}: no Replay-Nonce");
        assert!(
            self.sent_nonce.is_some(),
            "{what}: the request had no nonce"
        );
        assert_ne!(fresh, self.sent_nonce, "{what}: the nonce used came back");
    }

    pub fn location(&self) -> Option<String> {
        self.headers
            .get("location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

pub async fn request(method: &str, url: &str, content_type: Option<&str>, body: Vec<u8>) -> Resp {
    let headers: Vec<(&str, &str)> = content_type
        .map(|ct| ("content-type", ct))
        .into_iter()
        .collect();
    request_with(method, url, &headers, body).await
}

/// A request with the headers given (and `host`).
pub async fn request_with(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Resp {
    try_request_with(method, url, headers, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// [`request_with`], with a failure to connect or a cut-off answer as an
/// error rather than a panic (a server that may crash mid-request).
pub async fn try_request_with(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<Resp, String> {
    try_request_from(None, method, url, headers, body).await
}

/// [`request_with`] from the source address `from` (another loopback
/// address: a second client, as a server that counts per address sees it).
pub async fn request_from(
    from: std::net::IpAddr,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Resp {
    try_request_from(Some(from), method, url, headers, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {url} from {from}: {e}"))
}

async fn try_request_from(
    from: Option<std::net::IpAddr>,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<Resp, String> {
    let sent_nonce = nonce_sent(&body);
    let uri: http::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let addr = format!("{}:{}", uri.host().unwrap(), uri.port_u16().unwrap_or(80));
    let stream = match from {
        None => tokio::net::TcpStream::connect(addr).await,
        Some(from) => {
            let to: std::net::SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
            let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
            socket
                .bind(std::net::SocketAddr::new(from, 0))
                .map_err(|e| e.to_string())?;
            socket.connect(to).await
        }
    }
    .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(method)
        .uri(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
        .header("host", uri.authority().unwrap().as_str());
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = sender
        .send_request(req.body(Full::new(bytes::Bytes::from(body))).unwrap())
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes()
        .to_vec();
    Ok(Resp {
        status,
        headers,
        body,
        sent_nonce,
    })
}

/// POSTs a JSON body as `application/jose+json`.
pub async fn post(url: &str, body: &Value) -> Resp {
    request(
        "POST",
        url,
        Some("application/jose+json"),
        body.to_string().into_bytes(),
    )
    .await
}

/// A fresh nonce from newNonce.
pub async fn nonce(directory: &Value) -> String {
    let r = request(
        "HEAD",
        directory["newNonce"].as_str().unwrap(),
        None,
        vec![],
    )
    .await;
    r.nonce()
        .unwrap_or_else(|| panic!("newNonce gave no nonce: {} {:?}", r.status, r.headers))
}

pub async fn directory(url: &str) -> Value {
    request("GET", url, None, vec![]).await.json()
}

/// A registered account: its key and URL.
pub struct Acct {
    pub key: Key,
    pub url: String,
}

impl Acct {
    pub async fn create(directory: &Value, key: Key) -> Acct {
        let url = directory["newAccount"].as_str().unwrap();
        let protected =
            json!({"alg": key.alg(), "jwk": key.jwk, "nonce": nonce(directory).await, "url": url});
        let r = post(
            url,
            &key.sign(&protected, Some(&json!({"termsOfServiceAgreed": true}))),
        )
        .await;
        assert!(
            r.status == 201 || r.status == 200,
            "newAccount: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        Acct {
            url: r.location().expect("Location"),
            key,
        }
    }

    /// POST-as-GETs `url` until its `status` is no longer `while_status`
    /// (background validation settling), for at most `within`.
    pub async fn wait_while(
        &self,
        directory: &Value,
        url: &str,
        while_status: &str,
        within: std::time::Duration,
    ) -> Value {
        let deadline = std::time::Instant::now() + within;
        loop {
            let doc = self.post(directory, url, None).await.json();
            if doc["status"] != while_status {
                return doc;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{url} still {while_status} after {within:?}: {doc}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Triggers the challenge at `url` (RFC 8555 §7.5.1) and returns it once
    /// its background validation has settled.
    pub async fn trigger_and_settle(&self, directory: &Value, url: &str) -> Value {
        let r = self.post(directory, url, Some(&json!({}))).await;
        assert_eq!(
            r.json()["status"],
            "processing",
            "validation runs off the request path"
        );
        self.wait_while(
            directory,
            url,
            "processing",
            std::time::Duration::from_secs(10),
        )
        .await
    }

    /// A kid-signed request with a fresh nonce.
    pub async fn post(&self, directory: &Value, url: &str, payload: Option<&Value>) -> Resp {
        let protected = json!({"alg": self.key.alg(), "kid": self.url, "nonce": nonce(directory).await, "url": url});
        post(url, &self.key.sign(&protected, payload)).await
    }
}
