//! `/metrics`: valid OpenMetrics text on its own listener with every family
//! operators chart, counters that equal the audit log they mirror, and a
//! Grafana dashboard that names only metrics the exporter really serves.

use std::collections::{BTreeMap, BTreeSet};

use crate::clients;
use crate::flow::reqwest_get;
use crate::harness::{self, Dns, TestServer};

/// The families every scrape must carry (without the `_total` of counters).
const FAMILIES: [&str; 13] = [
    "acme_proxy_http_requests",
    "acme_proxy_http_request_seconds",
    "acme_proxy_audit_events",
    "acme_proxy_certificates_issued",
    "acme_proxy_certificate_failures",
    "acme_proxy_revocations_refused",
    "acme_proxy_validations",
    "acme_proxy_validation_seconds",
    "acme_proxy_upstream_requests",
    "acme_proxy_jobs",
    "acme_proxy_job_queue_depth",
    "acme_proxy_db_connections",
    "acme_proxy_nonces",
];

/// Asserts that every exported `audit_events_total` series (those above
/// zero) equals the audit table's count of its rows; returns the counts.
pub(crate) async fn assert_audit_counters_match_the_table(
    server: &TestServer,
    samples: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    let rows = server
        .running()
        .authority()
        .store()
        .audit_recent(None, 10_000)
        .await
        .expect("audit");
    assert!(!rows.is_empty());
    let mut counted: BTreeMap<String, f64> = BTreeMap::new();
    for r in &rows {
        let series = format!(
            "acme_proxy_audit_events_total{{event=\"{}\",outcome=\"{}\",profile=\"{}\"}}",
            r.event,
            r.outcome,
            r.profile.as_deref().unwrap_or("")
        );
        *counted.entry(series).or_default() += 1.0;
    }
    // (Series declared at zero before their first event are left aside.)
    let exported: BTreeMap<String, f64> = samples
        .iter()
        .filter(|(k, v)| k.starts_with("acme_proxy_audit_events_total{") && **v > 0.0)
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    assert_eq!(
        exported, counted,
        "the counters and the audit table disagree"
    );
    counted
}

/// A strict enough reading of the OpenMetrics text format: every line is a
/// `# TYPE`/`# HELP`/`# UNIT` comment or `name{labels} value`, the text ends
/// with `# EOF`, and every sample belongs to a declared family. Returns the
/// families and the samples (name with labels → value).
pub(crate) fn parse(text: &str) -> (BTreeSet<String>, BTreeMap<String, f64>) {
    assert!(text.ends_with("# EOF\n"), "no # EOF terminator:\n{text}");
    let mut families = BTreeSet::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(
                ["counter", "gauge", "histogram", "info", "unknown"].contains(&kind),
                "{line}"
            );
            families.insert(name.to_owned());
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let name = series.split('{').next().unwrap_or(series);
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "bad metric name in {line:?}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            assert!(
                labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                "bad labels in {line:?}"
            );
        }
        let family = family_of(name);
        assert!(
            families.contains(&family),
            "sample {name} of an undeclared family"
        );
        samples.insert(series.to_owned(), value);
    }
    (families, samples)
}

/// The family a sample or query name belongs to.
fn family_of(name: &str) -> String {
    for suffix in ["_total", "_bucket", "_sum", "_count", "_created"] {
        if let Some(base) = name.strip_suffix(suffix) {
            return base.to_owned();
        }
    }
    name.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_a_lego_issuance_parse_carry_every_family_and_equal_the_audit_log() {
    let Some(dns) = Dns::start_answering_own_host() else {
        return;
    };
    if !harness::require_program("lego") {
        return;
    }
    let at = harness::own_addr();
    let extra = "[metrics]\nlisten = \"127.0.0.1:0\"\n";
    let dir = crate::harness::tempdir();
    let toml = TestServer::config_text(dir.path(), at.port(), Some(&dns), extra);
    let server = TestServer::start_in(dir, &toml).await;
    let metrics_url = format!(
        "http://{}/metrics",
        server.running().metrics_addr.expect("a metrics listener")
    );
    // Not on the ACME listener.
    let (status, _, _) = reqwest_get(&format!("{}/metrics", server.base())).await;
    assert_eq!(status, 404);

    let home = crate::harness::tempdir();
    let d = home.path().to_path_buf();
    let args = clients::lego_http_run(&server.directory("default"), &d, at, "metrics.example.test");
    let ran = clients::run("lego", args, d.clone()).await;
    assert!(ran.success(), "lego failed\n{}", ran.report());

    let (status, content_type, body) = reqwest_get(&metrics_url).await;
    assert_eq!(status, 200);
    assert!(
        content_type
            .as_deref()
            .is_some_and(|c| c.starts_with("application/openmetrics-text")),
        "{content_type:?}"
    );
    let text = String::from_utf8(body).expect("UTF-8");
    let (families, samples) = parse(&text);
    for f in FAMILIES {
        assert!(families.contains(f), "family {f} missing:\n{text}");
    }
    let sample = |series: &str| samples.get(series).copied().unwrap_or(0.0);
    assert_eq!(
        sample("acme_proxy_certificates_issued_total{profile=\"default\"}"),
        1.0,
        "{text}"
    );
    assert!(sample("acme_proxy_validations_total{type=\"http-01\",outcome=\"valid\"}") >= 1.0);

    // Every audit_events counter equals the rows it mirrors.
    let counted = assert_audit_counters_match_the_table(&server, &samples).await;
    assert!(
        counted.keys().any(|k| k.contains("certificate.issued")),
        "{counted:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_queries_only_metrics_the_exporter_serves() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/grafana/acme-proxy.json"
        ))
        .expect("the dashboard file"),
    )
    .expect("the dashboard is JSON");
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let mut rest = expr;
            while let Some(at) = rest.find("acme_proxy_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &rest[at + name.len()..];
                queried.insert(family_of(&name));
            }
        }
    }
    assert!(queried.len() >= 10, "{queried:?}");
    // A fresh server exports every family (gauges and families even with no
    // samples are declared).
    let extra = "[metrics]\nlisten = \"127.0.0.1:0\"\n";
    let dir = crate::harness::tempdir();
    let toml = TestServer::config_text(dir.path(), harness::free_port(), None, extra);
    let server = TestServer::start_in(dir, &toml).await;
    let url = format!(
        "http://{}/metrics",
        server.running().metrics_addr.expect("metrics")
    );
    // One ACME request, so that the request families have a sample.
    let (status, _, _) = reqwest_get(&server.directory("default")).await;
    assert_eq!(status, 200);
    let (_, _, body) = reqwest_get(&url).await;
    let (families, _) = parse(&String::from_utf8(body).expect("UTF-8"));
    for q in &queried {
        assert!(
            families.contains(q),
            "the dashboard queries {q}, which is not exported"
        );
    }
    server.stop().await;
}
