//! The resources of RFC 8555 §7.1 as they appear on the wire, and the
//! payloads clients send. Names follow the RFC exactly.

use serde::{Deserialize, Serialize};

use crate::problem::Problem;

/// An identifier (RFC 8555 §7.1.3, §9.7.7; `ip` from RFC 8738).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct Identifier {
    #[serde(rename = "type")]
    pub kind: String,
    pub value: String,
}

impl Identifier {
    pub fn dns(value: impl Into<String>) -> Self {
        Self {
            kind: "dns".into(),
            value: value.into(),
        }
    }
}

/// The directory object (RFC 8555 §7.1.1).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Directory {
    pub new_nonce: String,
    pub new_account: String,
    pub new_order: String,
    pub revoke_cert: String,
    pub key_change: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_authz: Option<String>,
    /// RFC 9773 §3: where renewal information is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal_info: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<DirectoryMeta>,
}

/// The directory's `meta` object (RFC 8555 §7.1.1).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DirectoryMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terms_of_service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub website: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caa_identities: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub external_account_required: bool,
    /// draft-ietf-acme-profiles §3: the certificate profiles offered, name
    /// to description.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub profiles: std::collections::BTreeMap<String, String>,
}

/// Account status (RFC 8555 §7.1.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccountStatus {
    Valid,
    Deactivated,
    Revoked,
}

/// The account object (RFC 8555 §7.1.2).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Account {
    pub status: AccountStatus,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub contact: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terms_of_service_agreed: Option<bool>,
    pub orders: String,
}

/// The newAccount payload (RFC 8555 §7.3). Unknown fields are ignored, as
/// §7.3 asks servers to ignore fields they do not understand.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewAccount {
    #[serde(default)]
    pub contact: Option<Vec<String>>,
    #[serde(default)]
    pub terms_of_service_agreed: Option<bool>,
    #[serde(default)]
    pub only_return_existing: Option<bool>,
    #[serde(default)]
    pub external_account_binding: Option<serde_json::Value>,
}

/// An update to an account (RFC 8555 §7.3.2, §7.3.6).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccountUpdate {
    #[serde(default)]
    pub contact: Option<Vec<String>>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub terms_of_service_agreed: Option<bool>,
}

/// The orders list of an account (RFC 8555 §7.1.2.1).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OrdersList {
    pub orders: Vec<String>,
}

/// Order status (RFC 8555 §7.1.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderStatus {
    Pending,
    Ready,
    Processing,
    Valid,
    Invalid,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Ready => "ready",
            Self::Processing => "processing",
            Self::Valid => "valid",
            Self::Invalid => "invalid",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "ready" => Self::Ready,
            "processing" => Self::Processing,
            "valid" => Self::Valid,
            "invalid" => Self::Invalid,
            _ => return None,
        })
    }
}

/// The order object (RFC 8555 §7.1.3).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    pub status: OrderStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    pub identifiers: Vec<Identifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
    pub authorizations: Vec<String>,
    pub finalize: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// draft-ietf-acme-profiles §4: the certificate profile chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// RFC 9773 §5: the certificate this order replaces, echoed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
}

/// The newOrder payload (RFC 8555 §7.4).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewOrder {
    pub identifiers: Vec<Identifier>,
    #[serde(default)]
    pub not_before: Option<String>,
    #[serde(default)]
    pub not_after: Option<String>,
    /// draft-ietf-acme-profiles §4.
    #[serde(default)]
    pub profile: Option<String>,
    /// RFC 9773 §5: a certificate identifier (`AKI.serial`).
    #[serde(default)]
    pub replaces: Option<String>,
}

/// A certificate's unique identifier (RFC 9773 §4.1): the base64url of its
/// Authority Key Identifier's keyIdentifier, a dot, and the base64url of
/// its serial number's DER content octets, both unpadded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertId {
    pub key_identifier: Vec<u8>,
    /// The DER INTEGER's content octets (a leading zero kept).
    pub serial: Vec<u8>,
}

impl CertId {
    /// Parses `AKI.serial`; None unless both halves are non-empty unpadded
    /// base64url.
    pub fn parse(s: &str) -> Option<Self> {
        let (aki, serial) = s.split_once('.')?;
        let decode = |part: &str| {
            crate::base64url::decode(part)
                .ok()
                .filter(|b| !b.is_empty())
        };
        Some(Self {
            key_identifier: decode(aki)?,
            serial: decode(serial)?,
        })
    }
}

impl std::fmt::Display for CertId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use base64::Engine;
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        write!(
            f,
            "{}.{}",
            e.encode(&self.key_identifier),
            e.encode(&self.serial)
        )
    }
}

/// A RenewalInfo object (RFC 9773 §4.2).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenewalInfo {
    pub suggested_window: SuggestedWindow,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "explanationURL"
    )]
    pub explanation_url: Option<String>,
}

/// RFC 3339 bounds of the window in which to renew.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SuggestedWindow {
    pub start: String,
    pub end: String,
}

/// Authorization status (RFC 8555 §7.1.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthorizationStatus {
    Pending,
    Valid,
    Invalid,
    Deactivated,
    Expired,
    Revoked,
}

impl AuthorizationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Valid => "valid",
            Self::Invalid => "invalid",
            Self::Deactivated => "deactivated",
            Self::Expired => "expired",
            Self::Revoked => "revoked",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "valid" => Self::Valid,
            "invalid" => Self::Invalid,
            "deactivated" => Self::Deactivated,
            "expired" => Self::Expired,
            "revoked" => Self::Revoked,
            _ => return None,
        })
    }
}

/// The authorization object (RFC 8555 §7.1.4).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    pub identifier: Identifier,
    pub status: AuthorizationStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    pub challenges: Vec<Challenge>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wildcard: Option<bool>,
}

/// Challenge status (RFC 8555 §7.1.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChallengeStatus {
    Pending,
    Processing,
    Valid,
    Invalid,
}

impl ChallengeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Processing => "processing",
            Self::Valid => "valid",
            Self::Invalid => "invalid",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "processing" => Self::Processing,
            "valid" => Self::Valid,
            "invalid" => Self::Invalid,
            _ => return None,
        })
    }
}

/// A challenge object (RFC 8555 §7.1.5, §8).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Challenge {
    #[serde(rename = "type")]
    pub kind: String,
    pub url: String,
    pub status: ChallengeStatus,
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validated: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
}

/// The finalize payload (RFC 8555 §7.4).
#[derive(Clone, Debug, Deserialize)]
pub struct Finalize {
    pub csr: String,
}

/// The revokeCert payload (RFC 8555 §7.6).
#[derive(Clone, Debug, Deserialize)]
pub struct Revocation {
    pub certificate: String,
    #[serde(default)]
    pub reason: Option<u64>,
}

/// The inner payload of a keyChange request (RFC 8555 §7.3.5).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyChange {
    pub account: String,
    pub old_key: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cert_id_parses_and_prints_as_rfc_9773_appendix_a_spells_it() {
        // RFC 9773 §4.1's example.
        let id = CertId::parse("aYhba4dGQEHhs3uEe6CuLN4ByNQ.AIdlQyE").unwrap();
        assert_eq!(
            id.key_identifier,
            [
                0x69, 0x88, 0x5B, 0x6B, 0x87, 0x46, 0x40, 0x41, 0xE1, 0xB3, 0x7B, 0x84, 0x7B, 0xA0,
                0xAE, 0x2C, 0xDE, 0x01, 0xC8, 0xD4
            ]
        );
        assert_eq!(id.serial, [0x00, 0x87, 0x65, 0x43, 0x21]);
        assert_eq!(id.to_string(), "aYhba4dGQEHhs3uEe6CuLN4ByNQ.AIdlQyE");
        for bad in ["", "nodot", ".AIdlQyE", "aYhb.", "aYhb=.AIdl", "a+b.AIdl"] {
            assert_eq!(CertId::parse(bad), None, "{bad:?}");
        }
    }
}
