//! The configuration reference (`docs/configuration-reference.md`),
//! generated from the configuration types: every key with its doc comment,
//! its type, and its default as `acme-proxy.example.toml` writes it (the
//! example file sets every key that has a default to it, and shows the
//! others commented out). A test keeps the committed page equal to what
//! this generates and requires every key in the example file.

use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Map, Value};

use acme_proxy_protocol::types::{ChallengeType, IdentifierType};

use super::Config;
use crate::events::Event;

/// The example configuration, shipped as `/etc/acme-proxy/acme-proxy.toml`.
pub const EXAMPLE: &str = include_str!("../../../../acme-proxy.example.toml");

/// A duration key: "90d", "12h", "1h 30m" (humantime).
pub fn duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "duration" })
}

/// A rate limit: "5/1h".
pub fn opt_rate(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": ["string", "null"], "format": "rate" })
}

/// `[[fallback]]` tables of a relay signer: the signer's own keys again
/// (documented once, there).
pub fn fallbacks(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "array", "items": { "type": "object" } })
}

/// ACME problem type names: "caa", "rejectedIdentifier".
pub fn problem_types(_: &mut SchemaGenerator) -> Schema {
    let values: Vec<Value> = acme_proxy_protocol::ProblemType::ALL
        .iter()
        .map(|t| Value::String(t.name().to_owned()))
        .collect();
    json_schema!({ "type": "array", "items": { "type": "string", "enum": values } })
}

pub fn opt_duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": ["string", "null"], "format": "duration" })
}

/// Addresses or CIDR networks: "10.0.0.0/8", "192.0.2.10".
pub fn networks(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "array", "items": { "type": "string", "format": "network" } })
}

pub fn challenge_types(_: &mut SchemaGenerator) -> Schema {
    one_of_each(ChallengeType::ALL.iter().map(|c| c.as_str()))
}

pub fn identifier_types(_: &mut SchemaGenerator) -> Schema {
    one_of_each(IdentifierType::ALL.iter().map(|i| i.as_str()))
}

pub fn events(_: &mut SchemaGenerator) -> Schema {
    one_of_each(Event::ALL.iter().map(|e| e.as_str()))
}

/// An array whose items are among `values`.
fn one_of_each<'a>(values: impl Iterator<Item = &'a str>) -> Schema {
    let values: Vec<Value> = values.map(|v| Value::String(v.to_owned())).collect();
    json_schema!({ "type": "array", "items": { "type": "string", "enum": values } })
}

/// One documented key.
#[derive(Debug)]
pub struct Key {
    /// Dotted path; `<name>` stands for a name the operator chooses.
    pub path: String,
    /// The table it sits in (`""` for the top level), with the signer
    /// type it belongs to.
    pub table: String,
    pub kind: String,
    pub description: String,
}

/// Every key of the configuration, in the order of the types.
pub fn keys() -> Vec<Key> {
    let root = schemars::schema_for!(Config).to_value();
    let defs = root
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut keys = Vec::new();
    walk(&root, "", "", &defs, &mut keys);
    keys
}

/// The schema `v` stands for: its `$ref` and `allOf` parts merged in, the
/// non-null branch of an optional value.
fn resolve(v: &Value, defs: &Map<String, Value>) -> Value {
    let mut out = match v
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|name| defs.get(name))
    {
        Some(target) => resolve(target, defs),
        None => Value::Object(Map::new()),
    };
    let mut merge = |from: &Value| {
        if let (Some(into), Some(from)) = (out.as_object_mut(), from.as_object()) {
            for (k, val) in from {
                match (into.get_mut(k), val) {
                    (Some(Value::Object(a)), Value::Object(b)) => {
                        a.extend(b.clone());
                    }
                    (Some(_), _) if k == "description" => {}
                    _ => {
                        into.insert(k.clone(), val.clone());
                    }
                }
            }
        }
    };
    if let Some(parts) = v.get("allOf").and_then(Value::as_array) {
        for p in parts {
            merge(&resolve(p, defs));
        }
    }
    let mut own = v.clone();
    if let Some(o) = own.as_object_mut() {
        o.remove("$ref");
        o.remove("allOf");
    }
    merge(&own);
    // Option<Table>: the table.
    if let Some(branches) = out.get("anyOf").and_then(Value::as_array).cloned() {
        let non_null: Vec<&Value> = branches
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) != Some("null"))
            .collect();
        if let [one] = non_null.as_slice() {
            let mut inner = resolve(one, defs);
            if let (Some(i), Some(d)) = (inner.as_object_mut(), out.get("description").cloned()) {
                i.insert("description".into(), d);
            }
            return inner;
        }
    }
    out
}

fn walk(v: &Value, path: &str, table: &str, defs: &Map<String, Value>, keys: &mut Vec<Key>) {
    let v = resolve(v, defs);
    // An internally tagged enum (the signer): each variant is a table of
    // its own, told apart by `type`.
    if let Some(variants) = v.get("oneOf").and_then(Value::as_array)
        && variants
            .iter()
            .all(|x| resolve(x, defs).get("properties").is_some())
    {
        for variant in variants {
            let variant = resolve(variant, defs);
            let tag = variant
                .pointer("/properties/type/const")
                .and_then(Value::as_str)
                .unwrap_or("?");
            let table = format!("{path} (type = \"{tag}\")");
            walk_properties(&variant, path, &table, defs, keys);
        }
        return;
    }
    walk_properties(&v, path, table, defs, keys);
}

fn walk_properties(
    v: &Value,
    path: &str,
    table: &str,
    defs: &Map<String, Value>,
    keys: &mut Vec<Key>,
) {
    let Some(properties) = v.get("properties").and_then(Value::as_object) else {
        return;
    };
    let is_table = |s: &Value| {
        s.get("properties").is_some()
            || s.get("oneOf").and_then(Value::as_array).is_some_and(|a| {
                a.iter()
                    .all(|x| resolve(x, defs).get("properties").is_some())
            })
    };
    // A map of tables: one per name the operator chooses.
    let each_table = |s: &Value| {
        s.get("additionalProperties")
            .filter(|each| is_table(&resolve(each, defs)))
            .cloned()
    };
    // An array of tables (`[[policy.rules]]`): one per entry.
    let array_of_tables = |s: &Value| {
        s.get("items")
            .filter(|each| is_table(&resolve(each, defs)))
            .cloned()
    };
    // The table's own keys first, then its tables: a table's keys stay
    // together on the page.
    let (tables, leaves): (Vec<_>, Vec<_>) = properties.iter().partition(|(_, prop)| {
        let resolved = resolve(prop, defs);
        is_table(&resolved)
            || each_table(&resolved).is_some()
            || array_of_tables(&resolved).is_some()
    });
    for (name, prop) in leaves.into_iter().chain(tables) {
        let key = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let resolved = resolve(prop, defs);
        if let Some(each) = each_table(&resolved) {
            let named = format!("{key}.<name>");
            walk(&each, &named, &named, defs, keys);
            continue;
        }
        if let Some(each) = array_of_tables(&resolved) {
            let entry = format!("{key}[]");
            walk(&each, &entry, &entry, defs, keys);
            continue;
        }
        if is_table(&resolved) {
            walk(&resolved, &key, &key, defs, keys);
            continue;
        }
        keys.push(Key {
            path: key,
            table: table.to_owned(),
            kind: kind(&resolved, defs),
            description: resolved
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        });
    }
}

/// A value's type in a few words.
fn kind(v: &Value, defs: &Map<String, Value>) -> String {
    let v = resolve(v, defs);
    if let Some(values) = v.get("enum").and_then(Value::as_array) {
        return one_of(values.iter().filter_map(Value::as_str));
    }
    if let Some(variants) = v.get("oneOf").and_then(Value::as_array) {
        let consts: Vec<&str> = variants
            .iter()
            .filter_map(|x| x.get("const").and_then(Value::as_str))
            .collect();
        if !consts.is_empty() {
            return one_of(consts.into_iter());
        }
    }
    let types: Vec<&str> = match v.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let optional = types.contains(&"null");
    let base = types.iter().find(|t| **t != "null").copied().unwrap_or("");
    let format = v.get("format").and_then(Value::as_str);
    let mut text = match (base, format) {
        ("string", Some("duration")) => "duration (\"30s\", \"12h\", \"90d\")".to_owned(),
        ("string", Some("rate")) => "rate (\"N/period\": \"5/1h\")".to_owned(),
        ("string", Some("network")) => "address or CIDR network".to_owned(),
        ("string", Some(f)) if f.starts_with("ip") => "address:port".to_owned(),
        ("string", _) => "string".to_owned(),
        ("integer", _) => "integer".to_owned(),
        ("number", _) => "number".to_owned(),
        ("boolean", _) => "boolean".to_owned(),
        ("array", _) => match v.get("items") {
            Some(items) => format!("array of {}", kind(items, defs)),
            None => "array".to_owned(),
        },
        ("object", _) => "table of strings".to_owned(),
        _ => "value".to_owned(),
    };
    if optional {
        text.push_str(", optional");
    }
    text
}

fn one_of<'a>(values: impl Iterator<Item = &'a str>) -> String {
    let values: Vec<String> = values.map(|v| format!("`{v}`")).collect();
    format!("one of {}", values.join(", "))
}

/// `text` with the commented-out keys and tables of the example file
/// uncommented (the example profiles at its end aside), so that every key
/// it documents parses.
pub fn uncommented(text: &str) -> String {
    let documented = text
        .split("\n# [profiles.staging]\n")
        .next()
        .unwrap_or(text);
    documented
        .lines()
        .map(|l| {
            let t = l.trim_start();
            let is_key = |rest: &str| {
                rest.split_once(" = ").is_some_and(|(k, _)| {
                    !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                })
            };
            // The commented-out tables of the example (an HSM key, the
            // notification destinations, the relay and custom profiles).
            let is_table = |rest: &str| {
                [
                    "[profiles.edge",
                    "[[profiles.edge",
                    "[profiles.legacy",
                    "[profiles.default.certificate_profiles",
                    "[profiles.default.signer.pkcs11",
                    "[profiles.default.notify",
                    "[notify]",
                    "[metrics]",
                    "[admin.tls]",
                    "[dns_zone]",
                    "[dns_zone.api]",
                    "[policy.",
                    "[[policy.rules]]",
                    "[rate_limits]",
                    "[rate_limits.",
                    "[egress]",
                    "[tls]",
                    "[audit]",
                ]
                .iter()
                .any(|t| rest.starts_with(t))
            };
            match t.strip_prefix("# ") {
                Some(rest) if is_key(rest) || is_table(rest) => rest,
                _ => l,
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value at `path` in `table`; `<name>` matches any key.
pub fn find<'a>(table: &'a toml::Table, path: &str) -> Option<&'a toml::Value> {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    let candidates: Vec<&toml::Value> = if head == "<name>" {
        table.values().collect()
    } else if let Some(array) = head.strip_suffix("[]") {
        // An array of tables: the first entry that has the key.
        table
            .get(array)
            .and_then(toml::Value::as_array)
            .map(|entries| entries.iter().collect())
            .unwrap_or_default()
    } else {
        table.get(head).into_iter().collect()
    };
    candidates.into_iter().find_map(|v| match (rest, v) {
        (None, v) => Some(v),
        (Some(rest), toml::Value::Table(t)) => find(t, rest),
        _ => None,
    })
}

/// The reference page, in Markdown.
pub fn markdown() -> String {
    let set: toml::Table = EXAMPLE.parse().unwrap_or_default();
    let documented: toml::Table = uncommented(EXAMPLE).parse().unwrap_or_default();
    let mut out = String::from(
        "# Configuration reference\n\n\
         <!-- Generated by `acme-proxy generate config-reference` from the configuration\n\
         types and acme-proxy.example.toml; edit those, not this page. -->\n\n\
         Every key of the configuration file, by table. A key can also be set\n\
         from the environment: `ACME_PROXY_` and the key's path in upper case,\n\
         with `__` between levels (`ACME_PROXY_VALIDATION__HTTP_PORT=5002`).\n\
         `<name>` stands for a name you choose (a profile, a webhook…).\n\
         \"Default\" is the value the server uses when the key is absent, as\n\
         the example configuration sets it. A key the example shows only\n\
         commented out (one without a default, or one in the example's relay\n\
         and custom profiles) shows the example's value as \"e.g.\".\n",
    );
    let mut table = None;
    for key in keys() {
        if table.as_deref() != Some(key.table.as_str()) {
            let title = match key.table.split_once(" (") {
                _ if key.table.is_empty() => "Top level".to_owned(),
                None if key.table.ends_with("[]") => {
                    format!("`[[{}]]`", key.table.trim_end_matches("[]"))
                }
                Some((name, signer)) => format!("`[{name}]` ({signer}"),
                None => format!("`[{}]`", key.table),
            };
            out.push_str(&format!("\n## {title}\n"));
            table = Some(key.table.clone());
        }
        out.push_str(&format!("\n### `{}`\n\n", key.path));
        // The tag of one variant's table is that variant's name.
        let tag = key
            .table
            .split_once(" (type = ")
            .filter(|_| key.path.ends_with(".type"))
            .map(|(_, t)| t.trim_end_matches(')'));
        let value = match (find(&set, &key.path), find(&documented, &key.path)) {
            _ if tag.is_some() => format!("`{}` in this table", tag.unwrap_or_default()),
            (Some(v), _) => format!("default `{}`", inline(v)),
            (None, Some(v)) => format!("e.g. `{}`", inline(v)),
            (None, None) => "not in the example file".to_owned(),
        };
        out.push_str(&format!("{} — {value}\n", key.kind));
        if !key.description.is_empty() {
            out.push_str(&format!("\n{}\n", key.description));
        }
    }
    out
}

/// A TOML value on one line.
fn inline(v: &toml::Value) -> String {
    v.to_string()
}
