use std::io::Write;
use std::os::unix::fs::PermissionsExt;

use acme_proxy_protocol::types::{Identifier, IdentifierType};

use super::*;

fn policy(toml: &str) -> Policy {
    let config = Config::from_toml(toml).unwrap();
    Policy::build(&config, None).unwrap()
}

fn problems(toml: &str) -> String {
    let config = Config::from_toml(toml).unwrap();
    Policy::build(&config, None).unwrap_err().join("\n")
}

fn dns(name: &str) -> Identifier {
    Identifier {
        kind: IdentifierType::Dns,
        value: name.to_owned(),
    }
}

const CHECKS: &str = r#"
[profiles.default]
[profiles.strict]
policy_default = "deny"

[policy.checks.lab_net]
type = "client_ip"
networks = ["10.20.0.0/16", "192.0.2.7"]

[policy.checks.lab_names]
type = "identifiers"
allow = ["*.lab.test", "10.20.0.0/16"]
deny = ["secret.lab.test"]
wildcards = false

[policy.checks.web]
type = "identifiers"
allow_regex = ["web[0-9]+\\.prod\\.test"]

[policy.checks.partners]
type = "eab"
labels = ["partner"]
key_ids = ["kid-1"]

[policy.checks.strict]
type = "path"
profiles = ["strict"]
"#;

/// (stage, profile, client, EAB label, identifier, verdict, deciding rule).
type Case = (
    Stage,
    &'static str,
    IpAddr,
    Option<&'static str>,
    Option<&'static str>,
    Verdict,
    &'static str,
);

#[tokio::test]
async fn rules_decide_in_order_and_the_first_true_one_wins() {
    let p = policy(&format!(
        r#"{CHECKS}
[[policy.rules]]
name = "lab-names-from-lab"
when = "lab_names and not lab_net"
then = "deny"
message = "lab names go to lab hosts"

[[policy.rules]]
name = "lab-ok"
when = "lab_names"
then = "allow"

[[policy.rules]]
name = "web-for-partners"
when = "web and partners"
then = "allow"

[[policy.rules]]
name = "nothing-else-strict"
when = "strict"
then = "deny"
message = "strict takes only lab and partner names"

[[policy.rules]]
name = "lab-hosts-only"
stages = ["connection"]
when = "not lab_net and strict"
then = "deny"
message = "strict answers lab hosts only"
"#
    ));
    let lab: IpAddr = "10.20.3.4".parse().unwrap();
    let office: IpAddr = "172.16.0.9".parse().unwrap();
    let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
    // (stage, profile, client, eab label, identifier) → (verdict, rule)
    let table: Vec<Case> = vec![
        (
            Stage::NewOrder,
            "default",
            lab,
            None,
            Some("a.lab.test"),
            Verdict::Allow,
            "lab-ok",
        ),
        (
            Stage::NewOrder,
            "default",
            mapped,
            None,
            Some("a.lab.test"),
            Verdict::Allow,
            "lab-ok",
        ),
        (
            Stage::NewOrder,
            "default",
            office,
            None,
            Some("a.lab.test"),
            Verdict::Deny,
            "lab-names-from-lab",
        ),
        // `*` is one label; a deny entry wins over an allow; no wildcards.
        (
            Stage::NewOrder,
            "default",
            office,
            None,
            Some("a.b.lab.test"),
            Verdict::Allow,
            "default",
        ),
        (
            Stage::NewOrder,
            "default",
            office,
            None,
            Some("secret.lab.test"),
            Verdict::Allow,
            "default",
        ),
        (
            Stage::NewOrder,
            "strict",
            lab,
            None,
            Some("*.lab.test"),
            Verdict::Deny,
            "nothing-else-strict",
        ),
        (
            Stage::NewOrder,
            "strict",
            lab,
            Some("partner"),
            Some("web12.prod.test"),
            Verdict::Allow,
            "web-for-partners",
        ),
        (
            Stage::NewOrder,
            "strict",
            lab,
            Some("partner"),
            Some("xweb12.prod.test"),
            Verdict::Deny,
            "nothing-else-strict",
        ),
        (
            Stage::NewOrder,
            "strict",
            lab,
            None,
            Some("web12.prod.test"),
            Verdict::Deny,
            "nothing-else-strict",
        ),
        (
            Stage::Finalize,
            "default",
            office,
            None,
            Some("a.lab.test"),
            Verdict::Deny,
            "lab-names-from-lab",
        ),
        // The connection stage asks only the connection rule.
        (
            Stage::Connection,
            "strict",
            office,
            None,
            None,
            Verdict::Deny,
            "lab-hosts-only",
        ),
        // A deny default decides identifiers, never the connection.
        (
            Stage::Connection,
            "strict",
            lab,
            None,
            None,
            Verdict::Allow,
            "default",
        ),
        (
            Stage::Connection,
            "default",
            office,
            None,
            None,
            Verdict::Allow,
            "default",
        ),
    ];
    for (stage, profile, ip, label, name, verdict, rule) in table {
        let id = name.map(dns);
        let subject = Subject {
            profile,
            client_ip: Some(ip),
            account: Some("acct"),
            eab: label.map(|l| ("kid-9", Some(l))),
            identifier: id.as_ref(),
        };
        let e = p.evaluate(stage, &subject).await;
        assert_eq!(
            (e.verdict, e.rule_name()),
            (verdict, rule),
            "{stage} {profile} {ip} {label:?} {name:?}: {}",
            e.summary()
        );
    }
}

#[tokio::test]
async fn a_refusal_says_its_rule_its_message_and_every_check_asked() {
    let p = policy(&format!(
        r#"{CHECKS}
[[policy.rules]]
name = "lab-names-from-lab"
when = "lab_names and not lab_net"
then = "deny"
message = "lab names go to lab hosts"
"#
    ));
    let e = name_at(
        &p,
        Stage::NewOrder,
        "default",
        Some("172.16.0.9"),
        "a.lab.test",
    )
    .await;
    assert_eq!(e.verdict, Verdict::Deny);
    assert_eq!(e.message, "lab names go to lab hosts");
    assert_eq!(
        e.summary(),
        "policy deny at new_order: rule lab-names-from-lab; checks: lab_names=true, lab_net=false"
    );
}

/// `p`'s decision on the DNS name `name` at `stage`, from `client`.
async fn name_at(
    p: &Policy,
    stage: Stage,
    profile: &str,
    client: Option<&str>,
    name: &str,
) -> Evaluation {
    let id = dns(name);
    p.evaluate(
        stage,
        &Subject {
            profile,
            client_ip: client.map(|c| c.parse().unwrap()),
            identifier: Some(&id),
            ..Subject::default()
        },
    )
    .await
}

/// A program check: exits with the code in its first argument, or sleeps.
fn program(dir: &tempfile::TempDir) -> String {
    let path = dir.path().join("decide");
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(
        f,
        "#!/bin/sh\ncat >/dev/null\nif [ \"$1\" = sleep ]; then sleep 5; fi\necho \"refused by the program\"\nexit \"$1\""
    )
    .unwrap();
    drop(f);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

#[tokio::test]
async fn an_undecided_check_holds_the_decision_only_when_its_answer_could_change_it() {
    let dir = tempfile::tempdir().unwrap();
    let program = program(&dir);
    let config = |exit: &str, rules: &str| {
        format!(
            r#"{CHECKS}
[policy.checks.approver]
type = "program"
command = "{program}"
args = ["{exit}"]
timeout = "300ms"
{rules}"#
        )
    };
    let deny_unless_approved = r#"
[[policy.rules]]
name = "needs-approval"
when = "not approver"
then = "deny"
"#;
    // The approver's answer decides: undecided when it cannot answer.
    for (exit, verdict, rule) in [
        ("0", Verdict::Allow, "default"),
        ("1", Verdict::Deny, "needs-approval"),
        ("7", Verdict::Undecided, "needs-approval"),
        ("sleep", Verdict::Undecided, "needs-approval"),
    ] {
        let p = policy(&config(exit, deny_unless_approved));
        let e = name_at(&p, Stage::NewOrder, "default", None, "a.example.test").await;
        assert_eq!(
            (e.verdict, e.rule_name()),
            (verdict, rule),
            "exit {exit}: {}",
            e.summary()
        );
        if exit == "1" {
            assert!(
                e.summary()
                    .contains("approver=false (refused by the program)"),
                "{}",
                e.summary()
            );
        }
    }
    // An undecided deny rule followed by a deny default changes nothing:
    // the answer is deny either way.
    let p = policy(&config(
        "7",
        r#"
[[policy.rules]]
name = "needs-approval"
when = "not approver"
then = "deny"
"#,
    ));
    let e = name_at(&p, Stage::NewOrder, "strict", None, "a.example.test").await;
    assert_eq!(
        (e.verdict, e.rule_name()),
        (Verdict::Deny, "default"),
        "{}",
        e.summary()
    );
    // `false and undecided` is false without asking the program.
    let p = policy(&config(
        "sleep",
        r#"
[[policy.rules]]
name = "lab-approved"
when = "lab_net and approver"
then = "deny"
"#,
    ));
    let started = std::time::Instant::now();
    let e = name_at(
        &p,
        Stage::NewOrder,
        "default",
        Some("172.16.0.9"),
        "a.example.test",
    )
    .await;
    assert_eq!(e.verdict, Verdict::Allow);
    assert!(
        e.checks.iter().all(|c| c.check != "approver"),
        "{}",
        e.summary()
    );
    assert!(started.elapsed() < std::time::Duration::from_millis(250));
}

#[tokio::test]
async fn a_warn_rule_lets_the_request_through_and_says_what_it_would_have_refused() {
    let p = policy(&format!(
        r#"{CHECKS}
[[policy.rules]]
name = "would-refuse"
stages = ["connection"]
when = "not lab_net"
then = "deny"
mode = "warn"
message = "only the lab"
"#
    ));
    let e = p
        .evaluate(
            Stage::Connection,
            &Subject {
                profile: "default",
                client_ip: Some("172.16.0.9".parse().unwrap()),
                ..Subject::default()
            },
        )
        .await;
    assert_eq!(e.verdict, Verdict::Allow);
    let warned = e.warned.as_ref().unwrap();
    assert_eq!(
        (warned.rule.as_str(), warned.message.as_str()),
        ("would-refuse", "only the lab")
    );
}

#[test]
fn rules_that_cannot_be_evaluated_are_refused_with_what_to_write() {
    for (rules, says) in [
        (
            "[[policy.rules]]\nname = \"r\"\nstages = [\"connection\"]\nwhen = \"lab_names\"\nthen = \"deny\"",
            "the check \"lab_names\" (identifiers) cannot run at stage connection",
        ),
        (
            "[[policy.rules]]\nname = \"r\"\nstages = [\"connection\"]\nwhen = \"partners\"\nthen = \"deny\"",
            "cannot run at stage connection: no account is known",
        ),
        (
            "[[policy.rules]]\nname = \"r\"\nwhen = \"lab_net and nope\"\nthen = \"deny\"",
            "names the check \"nope\", which is not defined",
        ),
        (
            "[[policy.rules]]\nname = \"r\"\nwhen = \"lab_net and\"\nthen = \"deny\"",
            "does not parse",
        ),
        (
            "[[policy.rules]]\nname = \"r\"\nwhen = \"lab_net\"\nthen = \"allow\"\nmode = \"warn\"",
            "changes only deny rules",
        ),
        (
            "[[policy.rules]]\nname = \"r\"\nwhen = \"lab_net\"\nthen = \"deny\"\n[[policy.rules]]\nname = \"r\"\nwhen = \"lab_net\"\nthen = \"deny\"",
            "another rule has this name",
        ),
        (
            "[policy.checks.x]\ntype = \"path\"\nprofiles = [\"nope\"]",
            "names \"nope\", which is not a profile",
        ),
        (
            "[policy.checks.x]\ntype = \"identifiers\"\nallow = [\"a.*b.test\"]",
            "is neither a DNS name glob",
        ),
        (
            "[policy.checks.x]\ntype = \"identifiers\"\nallow_regex = [\"(\"]",
            "not a regular expression",
        ),
        (
            "[policy.checks.x]\ntype = \"program\"\ncommand = \"decide\"",
            "must be an absolute path",
        ),
        (
            "[policy.checks.and]\ntype = \"path\"\nprofiles = [\"default\"]",
            "not and, or or not",
        ),
        // One expression cannot escape the anchors of a set.
        (
            "[policy.checks.x]\ntype = \"identifiers\"\nallow_regex = [\"a)|(b\"]",
            "\"a)|(b\" is not a regular expression",
        ),
        (
            "[policy.checks.x]\ntype = \"client_ip\"\nnetworks = [\"::ffff:10.0.0.0/104\"]",
            "written as IPv6; write it as IPv4, e.g. 10.0.0.0/8",
        ),
        (
            "[policy.checks.x]\ntype = \"identifiers\"\nallow = [\"::ffff:10.0.0.1\"]",
            "written as IPv6",
        ),
        (
            "[[policy.rules]]\nname = \"timeout\"\nwhen = \"lab_net\"\nthen = \"deny\"",
            "or \"timeout\"",
        ),
    ] {
        let text = problems(&format!("{CHECKS}\n{rules}"));
        assert!(text.contains(says), "{rules}\n→ {text}");
    }
}

#[test]
fn a_glob_star_is_exactly_one_label() {
    let p = |s: &str| s.split('.').map(str::to_owned).collect::<Vec<_>>();
    let every = checks::Flavour::Every;
    let any = checks::Flavour::Any;
    assert!(checks::glob_labels(&p("*.lab.test"), "a.lab.test", every));
    assert!(checks::glob_labels(&p("*.lab.test"), "A.LAB.test", every));
    assert!(!checks::glob_labels(&p("*.lab.test"), "a.b.lab.test", any));
    assert!(!checks::glob_labels(&p("*.lab.test"), "lab.test", any));
    assert!(checks::glob_labels(&p("web.*.test"), "web.x.test", every));
    assert!(!checks::glob_labels(
        &p("web.*.test"),
        "web.x.test.evil",
        any
    ));
    // A wildcard name: every name it covers, or some.
    assert!(checks::glob_labels(&p("*.lab.test"), "*.lab.test", every));
    assert!(!checks::glob_labels(&p("a.lab.test"), "*.lab.test", every));
    assert!(checks::glob_labels(&p("a.lab.test"), "*.lab.test", any));
    assert!(!checks::glob_labels(&p("a.b.lab.test"), "*.lab.test", any));
}

async fn verdict(p: &Policy, profile: &str, name: &str) -> (Verdict, String) {
    let e = name_at(p, Stage::NewOrder, profile, None, name).await;
    (e.verdict, e.rule_name().to_owned())
}

#[tokio::test]
async fn a_wildcard_is_allowed_only_when_every_name_it_covers_is_and_denied_when_one_could_be() {
    let checks = r#"
[profiles.default]
policy_default = "deny"

[policy.checks.lab_names]
type = "identifiers"
allow = ["*.lab.test"]
deny = ["secret.lab.test"]

[policy.checks.secrets]
type = "identifiers"
allow = ["secret.lab.test", "vault.lab.test"]
"#;
    let rule = |name: &str, when: &str, then: &str| {
        format!("[[policy.rules]]\nname = \"{name}\"\nwhen = \"{when}\"\nthen = \"{then}\"\n")
    };
    let at = |v: Verdict, rule: &str| (v, rule.to_owned());
    // The lab rule alone: its own deny entry names one of the wildcard's
    // names, so the wildcard is not allowed by it.
    let p = policy(&format!("{checks}{}", rule("lab", "lab_names", "allow")));
    assert_eq!(
        verdict(&p, "default", "www.lab.test").await,
        at(Verdict::Allow, "lab")
    );
    assert_eq!(
        verdict(&p, "default", "secret.lab.test").await,
        at(Verdict::Deny, "default")
    );
    assert_eq!(
        verdict(&p, "default", "*.lab.test").await,
        at(Verdict::Deny, "default")
    );
    // A deny rule naming some lab names refuses the wildcard covering them.
    let p = policy(&format!(
        "{checks}{}{}",
        rule("no-secrets", "secrets", "deny"),
        rule("all", "not secrets or secrets", "allow")
    ));
    assert_eq!(
        verdict(&p, "default", "*.lab.test").await,
        at(Verdict::Deny, "no-secrets")
    );
    assert_eq!(
        verdict(&p, "default", "*.other.test").await,
        at(Verdict::Allow, "all")
    );
    assert_eq!(
        verdict(&p, "default", "www.lab.test").await,
        at(Verdict::Allow, "all")
    );
    // Under `not` in an allow rule: the wildcard is not "not a secret".
    let p = policy(&format!(
        "{checks}{}",
        rule("non-secrets", "not secrets", "allow")
    ));
    assert_eq!(
        verdict(&p, "default", "*.lab.test").await,
        at(Verdict::Deny, "default")
    );
    assert_eq!(
        verdict(&p, "default", "www.lab.test").await,
        at(Verdict::Allow, "non-secrets")
    );
}

#[tokio::test]
async fn a_check_already_answered_false_spares_a_later_rule_the_program() {
    let dir = tempfile::tempdir().unwrap();
    let program = program(&dir);
    let p = policy(&format!(
        r#"{CHECKS}
[policy.checks.approver]
type = "program"
command = "{program}"
args = ["sleep"]
timeout = "3s"

[[policy.rules]]
name = "first"
when = "lab_net and approver"
then = "deny"

[[policy.rules]]
name = "second"
when = "approver and lab_net"
then = "deny"
"#
    ));
    let started = std::time::Instant::now();
    let e = name_at(
        &p,
        Stage::NewOrder,
        "default",
        Some("172.16.0.9"),
        "a.example.test",
    )
    .await;
    assert_eq!(
        e.summary(),
        "policy allow at new_order: rule default; checks: lab_net=false"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
}

#[tokio::test]
async fn a_check_program_reads_the_request_it_decides_on_from_its_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("expect");
    // True only for exactly this input: what the documentation promises.
    let want = r#"{"account":"acct-1","client_ip":"10.20.0.5","eab_key_id":"kid-9","eab_label":"partner","identifier":{"type":"dns","value":"a.lab.test"},"profile":"default","stage":"new_order"}"#;
    std::fs::write(
        &path,
        format!("#!/bin/sh\nread -r line\n[ \"$line\" = '{want}' ] && exit 0\necho \"got $line\"\nexit 1\n"),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = policy(&format!(
        "{CHECKS}\n[policy.checks.p]\ntype = \"program\"\ncommand = \"{}\"\n[[policy.rules]]\nname = \"ask\"\nwhen = \"not p\"\nthen = \"deny\"\n",
        path.display()
    ));
    let id = dns("a.lab.test");
    let e = p
        .evaluate(
            Stage::NewOrder,
            &Subject {
                profile: "default",
                client_ip: Some("::ffff:10.20.0.5".parse().unwrap()),
                account: Some("acct-1"),
                eab: Some(("kid-9", Some("partner"))),
                identifier: Some(&id),
            },
        )
        .await;
    assert_eq!(e.verdict, Verdict::Allow, "{}", e.summary());
}

#[test]
fn an_ipam_check_is_refused_at_the_connection_and_with_bad_settings() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "nbt_abc.def\n").unwrap();
    let check = |extra: &str| {
        format!(
            "[profiles.default]\n[policy.checks.netbox]\ntype = \"ipam\"\nsource = \"netbox\"\nurl = \"http://127.0.0.1:1\"\ntoken_file = \"{}\"\n{extra}",
            token.display()
        )
    };
    for (extra, says) in [
        (
            "[[policy.rules]]\nname = \"r\"\nstages = [\"connection\"]\nwhen = \"netbox\"\nthen = \"allow\"",
            "the check \"netbox\" (ipam) cannot run at stage connection: no identifier is known before a newOrder is read",
        ),
        ("timeout = \"30s\"", "timeout must be between 10ms and 10s"),
        ("cache_for = \"1h\"", "cache_for must be at most 10m"),
        ("statuses = []", "statuses is empty"),
    ] {
        let text = problems(&check(extra));
        assert!(text.contains(says), "{extra}\n→ {text}");
    }
    let text = problems(
        &check("")
            .replace(&token.display().to_string(), "/nonexistent/token")
            .replace("http://127.0.0.1:1", "netbox.lab.test"),
    );
    assert!(
        text.contains(
            "policy.checks.netbox.url \"netbox.lab.test\" must be an http:// or https:// URL"
        ),
        "{text}"
    );
    // One problem at a time for the source: the URL is read first.
    let text = problems(&check("").replace(&token.display().to_string(), "/nonexistent/token"));
    assert!(
        text.contains("policy.checks.netbox.token_file /nonexistent/token: cannot be read"),
        "{text}"
    );
    // Built, it runs at new_order and finalize.
    let built = policy(&check(
        "[[policy.rules]]\nname = \"r\"\nwhen = \"not netbox\"\nthen = \"deny\"",
    ));
    assert!(built.asks_at(Stage::NewOrder) && built.asks_at(Stage::Finalize));
}
