//! `acme-proxy config show`: every value in effect and where it comes from
//! — the default, the file (which one), or the environment (which
//! variable) — with secrets redacted.
//!
//! Defaults are the example file's values (it sets every key that has a
//! default to it; `reference.rs` keeps that true); a profile's defaults
//! are those of the example's `[profiles.default]` keys.

use std::collections::BTreeMap;
use std::path::Path;

use figment::Provider as _;

use super::{Config, ConfigError, redact_password};

/// One value in effect.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Shown {
    /// Dotted, as in the file: `jobs.lease`, `profiles.lab.bypass`.
    pub key: String,
    /// As TOML writes it; `"(redacted)"` for a secret.
    pub value: String,
    /// `default`, `file PATH` or `environment ACME_PROXY_…`.
    pub source: String,
}

/// The effective configuration of `file` and the environment, sorted by
/// key; refused as `serve` refuses it.
pub fn show(file: Option<&Path>) -> Result<Vec<Shown>, ConfigError> {
    let config = Config::load(file)?;
    let figment = Config::sources(file)?;
    let mut shown: BTreeMap<String, Shown> = BTreeMap::new();
    let example: toml::Table = toml::from_str(super::reference::EXAMPLE)
        .map_err(|e| ConfigError::Invalid(format!("the built-in example: {e}")))?;
    let mut defaults = Vec::new();
    flatten(
        "",
        &serde_json::to_value(&example).unwrap_or_default(),
        &mut defaults,
    );
    let profile_defaults: Vec<(String, String)> = defaults
        .iter()
        .filter_map(|(k, v)| {
            let rest = k.strip_prefix("profiles.default.")?;
            (!rest.contains('.')).then(|| (rest.to_owned(), v.clone()))
        })
        .collect();
    for (key, value) in defaults
        .into_iter()
        .filter(|(k, _)| !k.starts_with("profiles."))
    {
        shown.insert(key.clone(), entry(key, value, "default".into()));
    }
    for name in config.profiles.keys() {
        for (k, v) in &profile_defaults {
            let key = format!("profiles.{name}.{k}");
            shown.insert(key.clone(), entry(key, v.clone(), "default".into()));
        }
    }
    let provided = figment
        .data()
        .map_err(Box::new)?
        .remove(&figment::Profile::Default)
        .unwrap_or_default();
    let mut leaves = Vec::new();
    flatten(
        "",
        &serde_json::to_value(&provided).unwrap_or_default(),
        &mut leaves,
    );
    for (key, value) in leaves {
        let source = match figment.find_metadata(&key) {
            Some(m) if m.name.contains("environment") => format!(
                "environment ACME_PROXY_{}",
                key.split('.')
                    .map(str::to_ascii_uppercase)
                    .collect::<Vec<_>>()
                    .join("__")
            ),
            Some(m) => match m.source.as_ref().and_then(|s| s.file_path()) {
                Some(path) => format!("file {}", path.display()),
                None => m.name.to_string(),
            },
            None => "unknown".into(),
        };
        shown.insert(key.clone(), entry(key, value, source));
    }
    // As loading resolved it (a relative one of the file is the file's
    // neighbour); the example leaves it unset.
    let data_dir = format!("{:?}", config.data_dir.display().to_string());
    shown
        .entry("data_dir".into())
        .and_modify(|d| d.value = data_dir.clone())
        .or_insert_with(|| entry("data_dir".into(), data_dir, "default".into()));
    Ok(shown.into_values().collect())
}

fn entry(key: String, value: String, source: String) -> Shown {
    let value = if secret(&key) {
        "\"(redacted)\"".to_owned()
    } else if key.contains(".webhooks.") && key.ends_with(".url") {
        // Chat services put their token in the path or the query.
        webhook_origin(&value)
    } else {
        redact_password(&value)
    };
    Shown { key, value, source }
}

/// A key whose value is a secret itself (not the name of a file holding
/// one, nor a label): passwords, tokens, every header a webhook sends, and
/// the arguments of operators' programs, which may carry any of them.
fn secret(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key).to_ascii_lowercase();
    let named = ["password", "secret", "token", "hmac"]
        .iter()
        .any(|word| last.contains(word));
    (named && !last.ends_with("_file") && !last.ends_with("_label"))
        || key.contains(".headers.")
        || last == "args"
}

/// A quoted URL cut to its scheme and host, the rest redacted.
fn webhook_origin(quoted: &str) -> String {
    let url = quoted.trim_matches('"');
    let origin = match url.split_once("://") {
        Some((scheme, rest)) => {
            let host = rest.split(['/', '?', '#']).next().unwrap_or("");
            let host = host.rsplit('@').next().unwrap_or(host);
            format!("{scheme}://{host}")
        }
        None => String::new(),
    };
    format!("\"{origin}/(redacted)\"")
}

/// `value`'s leaves as (dotted key, TOML-like text); arrays are leaves.
fn flatten(prefix: &str, value: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        leaf => out.push((prefix.to_owned(), leaf.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_named_by_their_key_and_files_of_secrets_are_not() {
        assert!(secret(
            "profiles.p.notify.webhooks.chat.headers.Authorization"
        ));
        assert!(secret("notify.email.password"));
        assert!(!secret("database_password_file"));
        assert!(!secret("egress.proxy_credentials_file"));
        assert!(!secret("jobs.lease"));
        assert!(!secret("profiles.p.signer.pkcs11.token_label"));
        assert!(secret("profiles.p.signer.args"));
        assert_eq!(
            webhook_origin("\"https://u:p@hooks.example/services/T0/B0/s3cret?token=x\""),
            "\"https://hooks.example/(redacted)\""
        );
    }

    #[test]
    fn nested_values_flatten_to_dotted_keys_with_arrays_whole() {
        let mut out = Vec::new();
        flatten(
            "",
            &serde_json::json!({"jobs": {"lease": "30s"}, "p": [1, 2]}),
            &mut out,
        );
        assert_eq!(
            out,
            vec![
                ("jobs.lease".to_owned(), "\"30s\"".to_owned()),
                ("p".to_owned(), "[1,2]".to_owned())
            ]
        );
    }
}
