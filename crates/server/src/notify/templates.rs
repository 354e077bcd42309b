//! Notification templates (minijinja): built-in bodies, overridable and
//! extendable from the operator's directory. Every template is compiled at
//! start-up, so a broken one stops the server with its name and line
//! rather than failing deliveries later.

use crate::events::Event;
use std::path::Path;

use minijinja::Environment;

use super::Notice;

/// Built-in templates; a file of the same name in the templates directory
/// replaces one.
const BUILTIN: [(&str, &str); 4] = [
    // Every field of the notice as one JSON object.
    ("default.json", "{{ notice | tojson }}"),
    // Slack and Mattermost incoming webhooks: {"text": "..."}.
    (
        "slack.json",
        r#"{"text": {{ (notice.event ~ " (" ~ notice.profile ~ "): " ~ (notice.identifiers | join(", ")) ~ (" serial " ~ notice.serial if notice.serial else "") ~ (" — " ~ notice.detail if notice.detail else "")) | tojson }}}"#,
    ),
    // Email: one subject line, and a plain-text body with every field set.
    (
        "email_subject.txt",
        "[acme-proxy] {{ notice.event }} ({{ notice.profile }}){% if notice.identifiers %}: {{ notice.identifiers | join(\", \") }}{% endif %}",
    ),
    (
        "email_body.txt",
        "Event:       {{ notice.event }}\n\
Profile:     {{ notice.profile }}\n\
At:          {{ notice.at }}\n\
{% if notice.identifiers %}Identifiers: {{ notice.identifiers | join(\", \") }}\n{% endif %}\
{% if notice.serial %}Serial:      {{ notice.serial }}\n{% endif %}\
{% if notice.not_after %}Not after:   {{ notice.not_after }}\n{% endif %}\
{% if notice.account %}Account:     {{ notice.account }}\n{% endif %}\
{% if notice.order %}Order:       {{ notice.order }}\n{% endif %}\
{% if notice.challenge %}Challenge:   {{ notice.challenge }}\n{% endif %}\
{% if notice.detail %}Detail:      {{ notice.detail }}\n{% endif %}",
    ),
];

/// The instructions one render may execute (minijinja's fuel).
const FUEL: u64 = 100_000;

#[derive(Debug)]
pub struct Templates {
    env: Environment<'static>,
}

impl Templates {
    /// The built-ins plus every file of `dir` (its file name is the
    /// template's name).
    pub fn load(dir: Option<&Path>) -> Result<Self, String> {
        let mut sources = Vec::new();
        if let Some(dir) = dir {
            let entries = std::fs::read_dir(dir)
                .map_err(|e| format!("notify.templates_dir {}: {e}", dir.display()))?;
            for entry in entries {
                let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
                let path = entry.path();
                if !path.is_file() {
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                let source = std::fs::read_to_string(&path)
                    .map_err(|e| format!("template {}: {e}", path.display()))?;
                sources.push((name, source));
            }
        }
        Self::from_sources(sources)
    }

    /// The built-ins plus the operator's templates as (name, source).
    pub fn from_sources(sources: Vec<(String, String)>) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        // Every render is bounded: a template that loops for ever (or
        // nearly) fails that one notice with an error naming it, instead
        // of holding a delivery worker. The built-ins spend a few hundred.
        env.set_fuel(Some(FUEL));
        for (name, source) in BUILTIN {
            env.add_template(name, source)
                .map_err(|e| format!("built-in template {name}: {e}"))?;
        }
        for (name, source) in sources {
            env.add_template_owned(name.clone(), source)
                .map_err(|e| describe(&name, &e))?;
        }
        Ok(Self { env })
    }

    /// Fails unless `name` exists and renders a sample notice.
    pub fn check(&self, name: &str) -> Result<(), String> {
        let sample = Notice {
            event: Event::CertificateIssued,
            profile: "sample".into(),
            at: "2026-01-01T00:00:00Z".into(),
            account: Some("acct".into()),
            order: Some("order".into()),
            challenge: None,
            serial: Some("01".into()),
            identifiers: vec!["host.example".into()],
            not_after: Some("2026-04-01T00:00:00Z".into()),
            detail: None,
        };
        self.render(name, &sample).map(|_| ())
    }

    pub fn render(&self, name: &str, notice: &Notice) -> Result<String, String> {
        let template = self.env.get_template(name).map_err(|_| {
            format!(
                "no template named {name:?} (built-in: {:?}, or a file of that name in notify.templates_dir)",
                BUILTIN.map(|(n, _)| n)
            )
        })?;
        template
            .render(minijinja::context! { notice => notice })
            .map_err(|e| describe(name, &e))
    }
}

/// A template error with the template's name and line.
fn describe(name: &str, e: &minijinja::Error) -> String {
    match e.line() {
        Some(line) => format!("template {name}, line {line}: {e}"),
        None => format!("template {name}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn notice() -> Notice {
        Notice {
            at: "2026-11-29T00:00:00Z".into(),
            serial: Some("0a".into()),
            identifiers: vec!["a.example".into(), "b.example".into()],
            ..Notice::new(Event::CertificateIssued, "default", 0)
        }
    }

    #[test]
    fn the_default_body_is_the_notice_as_json() {
        let t = Templates::load(None).unwrap();
        let body: serde_json::Value =
            serde_json::from_str(&t.render("default.json", &notice()).unwrap()).unwrap();
        assert_eq!(body["event"], "certificate.issued");
        assert_eq!(body["identifiers"][1], "b.example");
    }

    #[test]
    fn the_slack_body_is_a_text_message_with_the_names() {
        let t = Templates::load(None).unwrap();
        let body: serde_json::Value =
            serde_json::from_str(&t.render("slack.json", &notice()).unwrap()).unwrap();
        let text = body["text"].as_str().unwrap();
        assert!(
            text.contains("a.example, b.example") && text.contains("serial 0a"),
            "{text}"
        );
    }

    #[test]
    fn the_email_templates_name_the_event_and_the_certificate() {
        let t = Templates::load(None).unwrap();
        let subject = t.render("email_subject.txt", &notice()).unwrap();
        assert_eq!(
            subject,
            "[acme-proxy] certificate.issued (default): a.example, b.example"
        );
        let body = t.render("email_body.txt", &notice()).unwrap();
        assert!(
            body.contains("Serial:      0a\n") && !body.contains("Detail"),
            "{body}"
        );
    }

    #[test]
    fn a_broken_template_is_refused_with_its_name_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("teams.json"),
            "{\n \"text\": {{ notice.event \n}",
        )
        .unwrap();
        let e = Templates::load(Some(dir.path())).unwrap_err();
        assert!(e.contains("teams.json") && e.contains("line"), "{e}");
    }

    #[test]
    fn a_missing_template_is_named() {
        let t = Templates::load(None).unwrap();
        let e = t.check("nope.json").unwrap_err();
        assert!(e.contains("nope.json") && e.contains("default.json"), "{e}");
    }

    #[test]
    fn a_template_that_loops_without_end_fails_its_render_instead_of_hanging() {
        let source =
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
        let t = Templates::from_sources(vec![("loop.txt".into(), source.into())]).unwrap();
        let e = t.check("loop.txt").unwrap_err();
        assert!(e.contains("loop.txt") && e.contains("fuel"), "{e}");
        // The built-ins stay well inside the bound.
        for name in [
            "default.json",
            "slack.json",
            "email_subject.txt",
            "email_body.txt",
        ] {
            t.check(name).unwrap();
        }
    }
}
