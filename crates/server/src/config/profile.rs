//! Each `[profiles.P]` table: one ACME endpoint, and its certificate profiles.

#[allow(unused_imports)]
use super::*;

/// One ACME endpoint.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProfileConfig {
    /// DANGER, tests only: mark every challenge valid without looking.
    pub bypass: bool,
    /// Challenge types offered, in order.
    #[schemars(schema_with = "super::reference::challenge_types")]
    pub challenges: Vec<ChallengeType>,
    /// URL of the terms of service; when set, new accounts must agree.
    pub terms_of_service: Option<String>,
    pub website: Option<String>,
    pub caa_identities: Vec<String>,
    /// How long a new order (and its pending authorizations) may take.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub order_lifetime: Duration,
    /// How long a valid authorization stays valid.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub authorization_lifetime: Duration,
    /// Reuse a valid authorization of the same account for the same
    /// identifier in a new order, if it was validated within this window
    /// (and outlives the new order). Absent: never reuse (the default).
    #[serde(deserialize_with = "opt_duration")]
    #[schemars(schema_with = "super::reference::opt_duration")]
    pub authorization_reuse: Option<Duration>,
    /// Check CAA (RFC 8659, with RFC 8657 parameters) at validation time,
    /// against `caa_identities`.
    pub caa: bool,
    /// Accept `ip` identifiers (RFC 8738).
    pub ip_identifiers: bool,
    /// Identifiers one order may name.
    pub max_identifiers: usize,
    /// Pending authorizations one account may hold at this profile; a
    /// newOrder that would pass it is `rateLimited`.
    pub max_pending_authorizations: usize,
    /// External Account Binding (RFC 8555 §7.3.4) at newAccount: `off`
    /// (bindings are ignored), `optional` (checked when sent) or `required`.
    pub eab: EabMode,
    /// What `[policy]` does with an identifier (at newOrder and finalize)
    /// that no rule decides at this profile: `allow` or `deny`. At the
    /// connection stage, what no rule denies goes on.
    pub policy_default: Effect,
    /// Named kinds of certificate this endpoint offers
    /// (draft-ietf-acme-profiles), advertised in the directory's
    /// `meta.profiles` and chosen by newOrder's `profile`.
    pub certificate_profiles: BTreeMap<String, CertificateProfileConfig>,
    /// The certificate profile of an order that names none; required when
    /// there are several (with one, it is that one).
    pub default_certificate_profile: Option<String>,
    /// RFC 9773: how long clients are told to wait (`Retry-After`) before
    /// asking for a certificate's renewal information again.
    #[serde(deserialize_with = "duration")]
    #[schemars(schema_with = "super::reference::duration")]
    pub renewal_info_retry_after: Duration,
    pub signer: SignerConfig,
    pub notify: ProfileNotifyConfig,
}

/// One certificate profile (draft-ietf-acme-profiles §3).
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CertificateProfileConfig {
    /// Shown to clients in the directory.
    pub description: String,
    /// Lifetime of its certificates (embedded CA only; default: the
    /// signer's `validity`).
    #[serde(default, deserialize_with = "opt_duration")]
    #[schemars(schema_with = "super::reference::opt_duration")]
    pub validity: Option<Duration>,
    /// keyUsage bits (embedded CA only; default: digitalSignature, plus
    /// keyEncipherment for an RSA key).
    #[serde(default)]
    pub key_usages: Option<Vec<KeyUsage>>,
    /// extKeyUsage purposes (embedded CA only; default: serverAuth).
    #[serde(default)]
    pub extended_key_usages: Option<Vec<ExtendedKeyUsage>>,
    /// Identifier types its certificates may carry: `dns`, `ip` (leaving
    /// `ip` out keeps IP addresses out of its SANs).
    #[serde(
        default = "default_identifier_types",
        deserialize_with = "identifier_types"
    )]
    #[schemars(schema_with = "super::reference::identifier_types")]
    pub identifier_types: Vec<IdentifierType>,
    /// Whether `*.name` identifiers are allowed.
    #[serde(default = "yes")]
    pub wildcards: bool,
}

pub(crate) fn default_identifier_types() -> Vec<IdentifierType> {
    IdentifierType::ALL.to_vec()
}

/// `identifier_types`, each parsed into the closed set, a wrong one
/// refused with the set spelled out (as before it was typed).
pub(crate) fn identifier_types<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<IdentifierType>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|t| {
            t.parse().map_err(|_| {
                serde::de::Error::custom(format!(
                    "{t:?} is not an identifier type; write some of {:?}",
                    IdentifierType::ALL
                        .iter()
                        .map(|t| t.as_str())
                        .collect::<Vec<_>>()
                ))
            })
        })
        .collect()
}

pub(crate) fn yes() -> bool {
    true
}

/// keyUsage bits a certificate profile may set (RFC 5280 §4.2.1.3).
#[derive(
    Clone, Copy, Debug, Deserialize, serde::Serialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum KeyUsage {
    DigitalSignature,
    KeyEncipherment,
    KeyAgreement,
    ContentCommitment,
}

/// extKeyUsage purposes a certificate profile may set (RFC 5280 §4.2.1.12).
#[derive(
    Clone, Copy, Debug, Deserialize, serde::Serialize, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ExtendedKeyUsage {
    ServerAuth,
    ClientAuth,
}

impl ExtendedKeyUsage {
    /// The purposes a certificate carries: its certificate profile's
    /// `extended_key_usages`, or serverAuth when it names none (or the
    /// order has no certificate profile). The one source both the embedded
    /// CA issuing and the check of a custom signer's leaf read.
    pub fn granted(configured: Option<&[Self]>) -> &[Self] {
        configured.unwrap_or(&[Self::ServerAuth])
    }

    /// The purposes a CSR may ask for (RFC 8555 §7.4 leaves what a CA
    /// accepts to it): the profile's own when it names them, otherwise
    /// serverAuth and clientAuth, which cert-manager writes into its CSRs
    /// for TLS certificates. A request is never copied into a certificate
    /// ([`Self::granted`] decides), so this only keeps out purposes no
    /// certificate here could carry.
    pub fn requestable(configured: Option<&[Self]>) -> &[Self] {
        configured.unwrap_or(&[Self::ServerAuth, Self::ClientAuth])
    }

    /// Its name in RFC 5280 §4.2.1.12.
    pub fn rfc5280_name(self) -> &'static str {
        match self {
            Self::ServerAuth => "serverAuth",
            Self::ClientAuth => "clientAuth",
        }
    }
}

impl ProfileConfig {
    /// The certificate profile an order gets: the one it names, or the
    /// default. `Ok(None)` when the endpoint offers none and none was
    /// asked for; `Err` names what was asked and is not offered.
    pub fn certificate_profile<'a>(
        &'a self,
        asked: Option<&'a str>,
    ) -> Result<Option<(&'a str, &'a CertificateProfileConfig)>, String> {
        let name = match (asked, &self.default_certificate_profile) {
            (Some(a), _) => a,
            (None, Some(d)) => d.as_str(),
            (None, None) => match self.certificate_profiles.keys().next() {
                Some(only) if self.certificate_profiles.len() == 1 => only.as_str(),
                _ => return Ok(None),
            },
        };
        self.certificate_profiles
            .get_key_value(name)
            .map(|(k, v)| Some((k.as_str(), v)))
            .ok_or_else(|| name.to_owned())
    }
}

/// Whether a profile asks new accounts for an External Account Binding.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EabMode {
    /// Anyone may register; a binding sent anyway is ignored.
    #[default]
    Off,
    /// A binding is checked when sent (and then limits the account), but
    /// not asked for.
    Optional,
    /// newAccount without a valid binding is refused with
    /// `externalAccountRequired`; the directory says so.
    Required,
}

impl Default for ProfileConfig {
    fn default() -> Self {
        Self {
            bypass: false,
            challenges: vec![ChallengeType::Http01],
            terms_of_service: None,
            website: None,
            caa_identities: Vec::new(),
            order_lifetime: Duration::from_secs(7 * 86400),
            authorization_lifetime: Duration::from_secs(30 * 86400),
            authorization_reuse: None,
            ip_identifiers: true,
            max_identifiers: 100,
            max_pending_authorizations: 300,
            caa: false,
            eab: EabMode::Off,
            policy_default: Effect::Allow,
            certificate_profiles: BTreeMap::new(),
            default_certificate_profile: None,
            renewal_info_retry_after: Duration::from_secs(6 * 3600),
            signer: SignerConfig::LocalCa(LocalCaConfig::default()),
            notify: ProfileNotifyConfig::default(),
        }
    }
}

/// Certificate profiles: names fit for URLs and JSON, a default that
/// exists (and one when there are several), identifier types we issue,
/// and no signing parameters at a relay (the upstream decides those).
pub(crate) fn check_certificate_profiles(name: &str, p: &ProfileConfig) -> Result<(), ConfigError> {
    let invalid = |m: String| Err(ConfigError::Invalid(m));
    if p.certificate_profiles.is_empty() {
        if let Some(d) = &p.default_certificate_profile {
            return invalid(format!(
                "profiles.{name}.default_certificate_profile is {d:?} but there are no [profiles.{name}.certificate_profiles.NAME] tables; add one or remove the default"
            ));
        }
        return Ok(());
    }
    for (cp_name, cp) in &p.certificate_profiles {
        let key = format!("profiles.{name}.certificate_profiles.{cp_name}");
        if cp_name.is_empty()
            || cp_name.len() > 64
            || !cp_name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return invalid(format!(
                "{key}: a certificate profile name is 1–64 letters, digits, '-', '_' or '.'"
            ));
        }
        if cp.identifier_types.is_empty() {
            return invalid(format!(
                "{key}.identifier_types is empty; write e.g. identifier_types = [\"dns\"]"
            ));
        }
        let signs_here = !matches!(p.signer, SignerConfig::Relay(_));
        if !signs_here
            && (cp.validity.is_some()
                || cp.key_usages.is_some()
                || cp.extended_key_usages.is_some())
        {
            return invalid(format!(
                "{key}: a relay profile forwards the profile's name upstream and the upstream decides validity and usages; remove validity, key_usages and extended_key_usages"
            ));
        }
        if cp.validity.is_some_and(|v| v < Duration::from_secs(60)) {
            return invalid(format!(
                "{key}.validity is shorter than a minute; write e.g. validity = \"7d\""
            ));
        }
        if cp.key_usages.as_ref().is_some_and(Vec::is_empty)
            || cp.extended_key_usages.as_ref().is_some_and(Vec::is_empty)
        {
            return invalid(format!(
                "{key}: key_usages and extended_key_usages, when written, list at least one usage (or leave them out for the defaults)"
            ));
        }
    }
    match &p.default_certificate_profile {
        Some(d) if !p.certificate_profiles.contains_key(d) => invalid(format!(
            "profiles.{name}.default_certificate_profile {d:?} is not one of its certificate profiles ({})",
            p.certificate_profiles
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )),
        None if p.certificate_profiles.len() > 1 => invalid(format!(
            "profiles.{name} has several certificate profiles: say which an order without `profile` gets, e.g. default_certificate_profile = \"{}\"",
            p.certificate_profiles
                .keys()
                .next()
                .map(String::as_str)
                .unwrap_or("classic")
        )),
        _ => Ok(()),
    }
}
