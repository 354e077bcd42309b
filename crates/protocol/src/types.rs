//! The resources of RFC 8555 §7.1 as they appear on the wire, and the
//! payloads clients send. Names follow the RFC exactly.

use serde::{Deserialize, Serialize};

use crate::problem::Problem;

/// A string that names no member of a closed set: what parsing one of
/// this module's enums from text answers (the store reports it with the
/// column it read).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {set} {value:?}")]
pub struct UnknownValue {
    /// The set's name (the enum's).
    pub set: &'static str,
    pub value: String,
}

/// A closed set of strings as an enum: serde and [`std::str::FromStr`]
/// accept exactly the listed spellings, `as_str` and `Display` give them
/// back, `ALL` lists the members. One list per set, so the wire names,
/// the database's TEXT values and the parsers cannot drift apart.
#[macro_export]
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::serde::Serialize, ::serde::Deserialize)]
        $vis enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every member, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::types::UnknownValue;

            fn from_str(s: &str) -> ::std::result::Result<Self, Self::Err> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    _ => Err($crate::types::UnknownValue {
                        set: stringify!($name),
                        value: s.to_owned(),
                    }),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

string_enum! {
    /// The identifier types this server knows (RFC 8555 §9.7.7; `ip` from
    /// RFC 8738 §3). Declared in the order their strings sort, so that
    /// identifiers sort as they did when the type was a string.
    pub enum IdentifierType {
        Dns = "dns",
        Ip = "ip",
    }
}

/// An identifier of a type this server knows (RFC 8555 §7.1.3, §9.7.7;
/// `ip` from RFC 8738): what orders, authorizations and certificates hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct Identifier {
    #[serde(rename = "type")]
    pub kind: IdentifierType,
    pub value: String,
}

impl Identifier {
    pub fn dns(value: impl Into<String>) -> Self {
        Self {
            kind: IdentifierType::Dns,
            value: value.into(),
        }
    }

    pub fn ip(value: impl Into<String>) -> Self {
        Self {
            kind: IdentifierType::Ip,
            value: value.into(),
        }
    }
}

/// An identifier as a client sent it, its type not yet checked: RFC 8555
/// §7.4 answers a type the server does not support with
/// `unsupportedIdentifier` (not a malformed payload), and the subproblem
/// and the audit row of that refusal name the identifier as sent (§6.7.1).
/// The server parses it into an [`Identifier`] before anything else uses it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct RawIdentifier {
    #[serde(rename = "type")]
    pub kind: String,
    pub value: String,
}

impl From<&Identifier> for RawIdentifier {
    fn from(id: &Identifier) -> Self {
        Self {
            kind: id.kind.as_str().to_owned(),
            value: id.value.clone(),
        }
    }
}

impl From<Identifier> for RawIdentifier {
    fn from(id: Identifier) -> Self {
        Self {
            kind: id.kind.as_str().to_owned(),
            value: id.value,
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

string_enum! {
    /// Account status (RFC 8555 §7.1.6).
    pub enum AccountStatus {
        Valid = "valid",
        Deactivated = "deactivated",
        Revoked = "revoked",
    }
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

string_enum! {
    /// Order status (RFC 8555 §7.1.6).
    pub enum OrderStatus {
        Pending = "pending",
        Ready = "ready",
        Processing = "processing",
        Valid = "valid",
        Invalid = "invalid",
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
    pub identifiers: Vec<RawIdentifier>,
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

string_enum! {
    /// Authorization status (RFC 8555 §7.1.6).
    pub enum AuthorizationStatus {
        Pending = "pending",
        Valid = "valid",
        Invalid = "invalid",
        Deactivated = "deactivated",
        Expired = "expired",
        Revoked = "revoked",
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

string_enum! {
    /// Challenge status (RFC 8555 §7.1.6).
    pub enum ChallengeStatus {
        Pending = "pending",
        Processing = "processing",
        Valid = "valid",
        Invalid = "invalid",
    }
}

string_enum! {
    /// The challenge types this server validates (RFC 8555 §8.3, §8.4;
    /// tls-alpn-01 from RFC 8737 §3).
    pub enum ChallengeType {
        Http01 = "http-01",
        Dns01 = "dns-01",
        TlsAlpn01 = "tls-alpn-01",
    }
}

/// A challenge object (RFC 8555 §7.1.5, §8).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Challenge {
    #[serde(rename = "type")]
    pub kind: ChallengeType,
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
    pub reason: Option<ReasonCode>,
}

/// A revocation reason code as the client wrote it (RFC 8555 §7.6, RFC
/// 5280 §5.3.1). Any JSON number is read, so that one no reason has (-1,
/// 1.5, 2^64) is refused as `badRevocationReason`, as §7.6 asks, rather
/// than as a payload that does not parse.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct ReasonCode(serde_json::Number);

impl ReasonCode {
    /// The code, if the number is one a reason can have.
    pub fn code(&self) -> Option<u64> {
        self.0.as_u64()
    }
}

impl From<u64> for ReasonCode {
    fn from(code: u64) -> Self {
        Self(code.into())
    }
}

impl std::fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
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
