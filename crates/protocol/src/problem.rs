//! Problem documents (RFC 7807) with the ACME error types of RFC 8555 §6.7.
//!
//! This module only *describes* problems. Deciding which problem a failure
//! becomes, and rendering it into an HTTP response, is the server front end's
//! job (Architecture Invariant: `api` is the only module that builds problem
//! responses).

use serde::{Deserialize, Serialize};

use crate::types::RawIdentifier;

/// The ACME error types of RFC 8555 §6.7 (and `compound` with subproblems).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProblemType {
    AccountDoesNotExist,
    /// RFC 9773 §5: the certificate named by `replaces` was already replaced.
    AlreadyReplaced,
    AlreadyRevoked,
    BadCsr,
    BadNonce,
    BadPublicKey,
    BadRevocationReason,
    BadSignatureAlgorithm,
    Caa,
    Compound,
    Connection,
    Dns,
    ExternalAccountRequired,
    IncorrectResponse,
    InvalidContact,
    /// draft-ietf-acme-profiles §4: newOrder named a profile the server does not offer.
    InvalidProfile,
    Malformed,
    OrderNotReady,
    RateLimited,
    RejectedIdentifier,
    ServerInternal,
    Tls,
    Unauthorized,
    UnsupportedContact,
    UnsupportedIdentifier,
    UserActionRequired,
}

impl ProblemType {
    /// Every type, for tables and tests.
    pub const ALL: [ProblemType; 26] = [
        Self::AccountDoesNotExist,
        Self::AlreadyReplaced,
        Self::AlreadyRevoked,
        Self::BadCsr,
        Self::BadNonce,
        Self::BadPublicKey,
        Self::BadRevocationReason,
        Self::BadSignatureAlgorithm,
        Self::Caa,
        Self::Compound,
        Self::Connection,
        Self::Dns,
        Self::ExternalAccountRequired,
        Self::IncorrectResponse,
        Self::InvalidContact,
        Self::InvalidProfile,
        Self::Malformed,
        Self::OrderNotReady,
        Self::RateLimited,
        Self::RejectedIdentifier,
        Self::ServerInternal,
        Self::Tls,
        Self::Unauthorized,
        Self::UnsupportedContact,
        Self::UnsupportedIdentifier,
        Self::UserActionRequired,
    ];

    /// The short name after `urn:ietf:params:acme:error:`.
    pub fn name(self) -> &'static str {
        match self {
            Self::AccountDoesNotExist => "accountDoesNotExist",
            Self::AlreadyReplaced => "alreadyReplaced",
            Self::AlreadyRevoked => "alreadyRevoked",
            Self::BadCsr => "badCSR",
            Self::BadNonce => "badNonce",
            Self::BadPublicKey => "badPublicKey",
            Self::BadRevocationReason => "badRevocationReason",
            Self::BadSignatureAlgorithm => "badSignatureAlgorithm",
            Self::Caa => "caa",
            Self::Compound => "compound",
            Self::Connection => "connection",
            Self::Dns => "dns",
            Self::ExternalAccountRequired => "externalAccountRequired",
            Self::IncorrectResponse => "incorrectResponse",
            Self::InvalidContact => "invalidContact",
            Self::InvalidProfile => "invalidProfile",
            Self::Malformed => "malformed",
            Self::OrderNotReady => "orderNotReady",
            Self::RateLimited => "rateLimited",
            Self::RejectedIdentifier => "rejectedIdentifier",
            Self::ServerInternal => "serverInternal",
            Self::Tls => "tls",
            Self::Unauthorized => "unauthorized",
            Self::UnsupportedContact => "unsupportedContact",
            Self::UnsupportedIdentifier => "unsupportedIdentifier",
            Self::UserActionRequired => "userActionRequired",
        }
    }

    /// The full URN, e.g. `urn:ietf:params:acme:error:badNonce`.
    pub fn urn(self) -> String {
        format!("{URN_PREFIX}{}", self.name())
    }

    /// Parses a full URN back into a type.
    pub fn from_urn(urn: &str) -> Option<Self> {
        let name = urn.strip_prefix(URN_PREFIX)?;
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The HTTP status a problem of this type is answered with unless the
    /// caller has a better one. RFC 8555 does not fix statuses per type; these
    /// follow common practice (Boulder, Pebble) so clients behave the same.
    pub fn default_status(self) -> u16 {
        match self {
            Self::AccountDoesNotExist
            | Self::AlreadyReplaced
            | Self::AlreadyRevoked
            | Self::BadCsr
            | Self::BadNonce
            | Self::BadPublicKey
            | Self::BadRevocationReason
            | Self::BadSignatureAlgorithm
            | Self::Caa
            | Self::Compound
            | Self::Connection
            | Self::Dns
            | Self::IncorrectResponse
            | Self::InvalidContact
            | Self::InvalidProfile
            | Self::Malformed
            | Self::RejectedIdentifier
            | Self::Tls
            | Self::UnsupportedContact
            | Self::UnsupportedIdentifier => 400,
            Self::ExternalAccountRequired | Self::Unauthorized | Self::UserActionRequired => 403,
            Self::OrderNotReady => 403,
            Self::RateLimited => 429,
            Self::ServerInternal => 500,
        }
    }
}

const URN_PREFIX: &str = "urn:ietf:params:acme:error:";

/// A problem document (RFC 7807), as sent to clients and stored on
/// challenges, authorizations and orders (RFC 8555 §6.7).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// RFC 8555 §6.7.1: several errors for one request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subproblems: Vec<Subproblem>,
}

impl Problem {
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Self {
        Self {
            kind: kind.urn(),
            detail: Some(detail.into()),
            status: Some(kind.default_status()),
            subproblems: Vec::new(),
        }
    }

    /// The typed problem, if the type is one of RFC 8555's.
    pub fn problem_type(&self) -> Option<ProblemType> {
        ProblemType::from_urn(&self.kind)
    }
}

/// One entry of a `compound` problem, naming the identifier it concerns
/// (RFC 8555 §6.7.1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subproblem {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identifier: Option<RawIdentifier>,
}

impl Subproblem {
    pub fn new(
        kind: ProblemType,
        detail: impl Into<String>,
        identifier: impl Into<RawIdentifier>,
    ) -> Self {
        Self {
            kind: kind.urn(),
            detail: Some(detail.into()),
            identifier: Some(identifier.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_type_round_trips_through_its_urn() {
        for t in ProblemType::ALL {
            assert_eq!(ProblemType::from_urn(&t.urn()), Some(t));
        }
        assert_eq!(
            ProblemType::from_urn("urn:ietf:params:acme:error:nope"),
            None
        );
    }

    #[test]
    fn a_problem_serialises_with_the_rfc_field_names() {
        let p = Problem::new(ProblemType::BadNonce, "stale");
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["type"], "urn:ietf:params:acme:error:badNonce");
        assert_eq!(v["status"], 400);
        assert!(v.get("subproblems").is_none());
    }
}
