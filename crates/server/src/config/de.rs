//! Deserialisers of the configuration's own value syntaxes (durations, networks).

#[allow(unused_imports)]
use super::*;

/// "10.0.0.0/8" or a bare "10.1.2.3" (a network of one address).
pub(crate) fn addresses_or_networks<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<ipnet::IpNet>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|s| {
            s.parse::<ipnet::IpNet>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    serde::de::Error::custom(format!(
                        "{s:?} is not an address or a CIDR network; write e.g. \"10.0.0.0/8\" or \"192.0.2.10\""
                    ))
                })
        })
        .collect()
}

/// As [`duration`], for optional keys.
pub(crate) fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// Deserialises "90d", "1h 30m", "10s" (humantime) into a Duration.
pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "{s:?} is not a duration ({e}); write e.g. \"90d\", \"12h\" or \"30s\""
        ))
    })
}

/// RFC 8555 problem type names, e.g. `["caa", "rejectedIdentifier"]`.
pub(crate) fn problem_types<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<acme_proxy_protocol::ProblemType>, D::Error> {
    use acme_proxy_protocol::ProblemType;
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|name| {
            ProblemType::ALL
                .into_iter()
                .find(|t| t.name() == name)
                .ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "{name:?} is not an ACME problem type (RFC 8555 §6.7); write one of {}",
                        ProblemType::ALL.map(ProblemType::name).join(", ")
                    ))
                })
        })
        .collect()
}
