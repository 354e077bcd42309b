//! The policy engine (`[policy]`): who may ask for what.
//!
//! Named *checks* answer a question about a request (its client address,
//! an identifier, the account's External Account Binding credential, the
//! profile, an operator's program, the IP address management system of
//! record) with true, false or undecided. Ordered
//! *rules* combine them (`when`, Kleene's logic, `expr.rs`) and the first
//! rule true at a stage decides; when none is, the profile's
//! `policy_default` does.
//!
//! A check that cannot answer never decides silently: an undecided rule
//! whose answer could change the outcome makes the whole decision
//! undecided, which the server answers 503 with `Retry-After`. One whose
//! answer could not change it (both ways lead to the same verdict) does
//! not hold the request up.
//!
//! A rule that names a check which cannot run at one of its stages (an
//! identifier check at the connection, before any identifier is known) is
//! refused when the policy is built, so start-up and `config check` say so.

mod checks;
pub mod expr;
mod ipam;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use acme_proxy_protocol::types::Identifier;
use serde::Serialize;

use crate::config::{Config, Effect, RuleMode, Stage};
use crate::metrics::Metrics;
use checks::{Check, Flavour};
pub use expr::Truth;

/// The rule name of a profile's `policy_default`.
const DEFAULT: &str = "default";
/// The rule name of a decision the checks ran out of time for.
const TIMEOUT: &str = "timeout";

/// One leaf of a built condition: a check, asked in the sense that makes
/// its rule the stricter (see [`Flavour`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Leaf {
    check: usize,
    flavour: Flavour,
}

impl Leaf {
    /// Where its answer is kept during one evaluation.
    fn slot(self) -> usize {
        self.check * 2 + self.flavour as usize
    }
}

/// The built policy of one configuration generation.
#[derive(Debug)]
pub struct Policy {
    checks: Vec<(String, Check)>,
    rules: Vec<Rule>,
    defaults: BTreeMap<String, Effect>,
    /// Whether any rule is asked at each stage (indexed as `Stage::ALL`):
    /// without one the default decides at once.
    staged: [bool; 3],
    /// Whether an `eab` check names labels, so that the account's
    /// credential must be read.
    wants_eab_label: bool,
}

#[derive(Debug)]
struct Rule {
    name: String,
    stages: Vec<Stage>,
    when: expr::Expr<Leaf>,
    then: Effect,
    message: String,
    mode: RuleMode,
}

/// What a decision is about.
#[derive(Clone, Debug, Default)]
pub struct Subject<'a> {
    pub profile: &'a str,
    pub client_ip: Option<IpAddr>,
    pub account: Option<&'a str>,
    /// The account's External Account Binding credential: key id and label.
    pub eab: Option<(&'a str, Option<&'a str>)>,
    /// At `new_order` and `finalize`, the one identifier decided on.
    pub identifier: Option<&'a Identifier>,
}

impl<'a> Subject<'a> {
    /// The same subject about `identifier`.
    pub fn with_identifier(self, identifier: Option<&'a Identifier>) -> Self {
        Self { identifier, ..self }
    }
}

/// The verdict of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Deny,
    Undecided,
}

/// A decision, with how it was reached.
#[derive(Clone, Debug, Serialize)]
pub struct Evaluation {
    pub stage: Stage,
    pub verdict: Verdict,
    /// The rule that decided (for `undecided`, the first rule that could
    /// not answer and mattered); `default` for the profile's default.
    pub rule: String,
    /// What the client is told (deny, undecided).
    pub message: String,
    /// A `warn`-mode rule that would have refused what was allowed.
    pub warned: Option<Warned>,
    /// Every rule asked, in order, with its value.
    pub rules: Vec<RuleTrace>,
    /// Every check answered, in the order it was asked.
    pub checks: Vec<CheckTrace>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Warned {
    pub rule: String,
    pub message: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct RuleTrace {
    pub rule: String,
    pub value: Truth,
}

#[derive(Clone, Debug, Serialize)]
pub struct CheckTrace {
    pub check: String,
    pub value: Truth,
    /// Why, when the check said more than its value (a program's reason,
    /// what could not be reached).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Evaluation {
    /// The rule's name as a metric label and in messages.
    pub fn rule_name(&self) -> &str {
        &self.rule
    }

    /// One line for an audit row or a log: the rule, its verdict, and
    /// every check's value.
    pub fn summary(&self) -> String {
        let checks: Vec<String> = self
            .checks
            .iter()
            .map(|c| match &c.note {
                Some(note) => format!("{}={} ({note})", c.check, c.value.as_str()),
                None => format!("{}={}", c.check, c.value.as_str()),
            })
            .collect();
        let verdict = match (&self.verdict, &self.warned) {
            (Verdict::Allow, Some(w)) => format!("allow (rule {} in warn mode would deny)", w.rule),
            (Verdict::Allow, None) => "allow".to_owned(),
            (Verdict::Deny, _) => "deny".to_owned(),
            (Verdict::Undecided, _) => "undecided".to_owned(),
        };
        format!(
            "policy {} at {}: rule {}; checks: {}",
            verdict,
            self.stage,
            self.rule_name(),
            if checks.is_empty() {
                "none".to_owned()
            } else {
                checks.join(", ")
            }
        )
    }

    /// Counts this decision in `policy_decisions`.
    pub fn count(&self, metrics: &Metrics) {
        let decision = match (&self.verdict, &self.warned) {
            (Verdict::Allow, Some(_)) => "warn",
            (Verdict::Allow, None) => "allow",
            (Verdict::Deny, _) => "deny",
            (Verdict::Undecided, _) => "undecided",
        };
        let rule = self.rule.clone();
        metrics
            .policy_decisions
            .get_or_create(&vec![
                ("stage", self.stage.as_str().to_owned()),
                ("rule", rule),
                ("decision", decision.to_owned()),
            ])
            .inc();
    }
}

/// How an evaluation ends before the undecided rules are weighed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Rule(usize),
    Default,
    Undecided(usize),
}

impl Policy {
    /// Builds `config`'s policy, or every reason it cannot be, each saying
    /// what to write.
    /// `resolver` answers `reverse_dns` checks (the validators' own).
    pub fn build(
        config: &Config,
        resolver: Option<&Arc<hickory_resolver::TokioResolver>>,
    ) -> Result<Self, Vec<String>> {
        let mut problems = Vec::new();
        let mut checks = Vec::new();
        let mut index = BTreeMap::new();
        for (name, check) in &config.policy.checks {
            if !valid_check_name(name) {
                problems.push(format!(
                    "policy.checks.{name}: a check name is letters, digits, '_' or '-', and not and, or or not"
                ));
                continue;
            }
            match Check::build(name, check, config, resolver) {
                Ok(c) => {
                    index.insert(name.clone(), checks.len());
                    checks.push((name.clone(), c));
                }
                Err(e) => problems.extend(e),
            }
        }
        let mut rules = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for (i, rule) in config.policy.rules.iter().enumerate() {
            let key = format!("policy.rules[{i}] ({:?})", rule.name);
            if rule.name.is_empty() || !valid_check_name(&rule.name) {
                problems.push(format!(
                    "{key}: name must be letters, digits, '_' or '-', e.g. name = \"lab-only\""
                ));
            }
            if rule.name == DEFAULT || rule.name == TIMEOUT || !names.insert(rule.name.clone()) {
                problems.push(format!(
                    "{key}: another rule has this name, or it is \"default\" or \"timeout\" (which name a profile's policy_default and a decision out of time); give each rule a name of its own"
                ));
            }
            if rule.stages.is_empty() {
                problems.push(format!(
                    "{key}: stages is empty; write some of stages = [\"connection\", \"new_order\", \"finalize\"]"
                ));
            }
            if rule.then == Effect::Allow && rule.mode == RuleMode::Warn {
                problems.push(format!(
                    "{key}: mode = \"warn\" changes only deny rules (what would have been refused is let through and recorded); remove it, or write then = \"deny\""
                ));
            }
            let parsed = match expr::parse(&rule.when) {
                Ok(e) => e,
                Err(e) => {
                    problems.push(format!("{key}: when = {:?} does not parse: {e}", rule.when));
                    continue;
                }
            };
            // A wildcard name covers many: a check is asked so that the
            // rule errs toward refusing (`Flavour`). A deny rule's
            // positive leaves are true when any covered name matches;
            // an allow rule's, only when every one does; `not` swaps.
            let when = parsed.map_polar(true, &mut |name: &String, positive: bool| {
                let flavour = if positive == (rule.then == Effect::Deny) {
                    Flavour::Any
                } else {
                    Flavour::Every
                };
                index.get(name).copied().map(|check| Leaf {
                    check,
                    // Only a name can be a wildcard.
                    flavour: match checks[check].1 {
                        Check::Identifiers(_) => flavour,
                        _ => Flavour::Every,
                    },
                }).ok_or_else(|| {
                    format!(
                        "{key}: when names the check {name:?}, which is not defined; add a [policy.checks.{name}] table{}",
                        if index.is_empty() {
                            String::new()
                        } else {
                            format!(
                                " or use one of {}",
                                index.keys().cloned().collect::<Vec<_>>().join(", ")
                            )
                        }
                    )
                })
            });
            let when = match when {
                Ok(w) => w,
                Err(e) => {
                    problems.push(e);
                    continue;
                }
            };
            for &stage in &rule.stages {
                for leaf in when.leaves() {
                    let (check_name, check) = &checks[leaf.check];
                    if !check.runs_at(stage) {
                        problems.push(format!(
                            "{key}: the check {check_name:?} ({}) cannot run at stage {stage}: {}; take {stage} out of this rule's stages",
                            check.kind(),
                            check.why_not(stage)
                        ));
                    }
                }
            }
            rules.push(Rule {
                name: rule.name.clone(),
                stages: rule.stages.clone(),
                when,
                then: rule.then,
                message: rule.message.clone(),
                mode: rule.mode,
            });
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let mut staged = [false; 3];
        for (i, stage) in Stage::ALL.into_iter().enumerate() {
            staged[i] = rules.iter().any(|r| r.stages.contains(&stage));
        }
        let wants_eab_label = checks
            .iter()
            .any(|(_, c)| matches!(c, Check::Eab { labels, .. } if !labels.is_empty()));
        Ok(Self {
            checks,
            rules,
            defaults: config
                .profiles
                .iter()
                .map(|(name, p)| (name.clone(), p.policy_default))
                .collect(),
            staged,
            wants_eab_label,
        })
    }

    /// Whether anything but the profiles' defaults is configured for
    /// `stage`.
    pub fn asks_at(&self, stage: Stage) -> bool {
        Stage::ALL
            .iter()
            .position(|s| *s == stage)
            .is_some_and(|i| self.staged[i])
    }

    /// Whether an evaluation at `stage` can be anything but allow: false
    /// lets callers skip gathering what the checks would need.
    pub fn matters_at(&self, stage: Stage, profile: &str) -> bool {
        self.asks_at(stage) || self.default_of(stage, profile) == Effect::Deny
    }

    /// Whether an `eab` check names credential labels.
    pub fn wants_eab_label(&self) -> bool {
        self.wants_eab_label
    }

    /// The profile's `policy_default`, which decides identifiers: at the
    /// connection, where a deny default would refuse every request before
    /// any identifier rule could allow one, what no rule denies goes on.
    fn default_of(&self, stage: Stage, profile: &str) -> Effect {
        if stage == Stage::Connection {
            return Effect::Allow;
        }
        self.defaults.get(profile).copied().unwrap_or_default()
    }

    /// Decides `subject` at `stage`, running only the checks the rules
    /// need, each at most once.
    pub async fn evaluate(&self, stage: Stage, subject: &Subject<'_>) -> Evaluation {
        let mut answers: Vec<Option<(Truth, Option<String>)>> = vec![None; self.checks.len() * 2];
        let mut asked: Vec<Leaf> = Vec::new();
        let mut traces = Vec::new();
        let mut decided = None;
        let mut undecided = Vec::new();
        for (i, rule) in self.rules.iter().enumerate() {
            if !rule.stages.contains(&stage) {
                continue;
            }
            let value = loop {
                // What is known may decide already (Kleene's logic is
                // monotone: an answer still missing cannot change a
                // definite value), so no check runs that cannot matter.
                let so_far = rule.when.eval(&|l: &Leaf| {
                    Some(answers[l.slot()].as_ref().map_or(Truth::Undecided, |a| a.0))
                });
                if let Ok(v @ (Truth::True | Truth::False)) = so_far {
                    break v;
                }
                match rule
                    .when
                    .eval(&|l: &Leaf| answers[l.slot()].as_ref().map(|a| a.0))
                {
                    Ok(v) => break v,
                    Err(&leaf) => {
                        let answer = self.checks[leaf.check]
                            .1
                            .answer(stage, subject, leaf.flavour)
                            .await;
                        answers[leaf.slot()] = Some(answer);
                        asked.push(leaf);
                    }
                }
            };
            traces.push(RuleTrace {
                rule: rule.name.clone(),
                value,
            });
            match value {
                Truth::True => {
                    decided = Some(i);
                    break;
                }
                Truth::False => {}
                Truth::Undecided => undecided.push(i),
            }
        }
        let default = self.default_of(stage, subject.profile);
        let outcome = self.weigh(default, decided, &undecided);
        let checks = asked
            .into_iter()
            .filter_map(|leaf| {
                let (value, note) = answers[leaf.slot()].take()?;
                Some(CheckTrace {
                    check: self.checks[leaf.check].0.clone(),
                    value,
                    note,
                })
            })
            .collect();
        self.evaluation(stage, subject, outcome, traces, checks)
    }

    /// The outcome, given the rule that was true (if any) and the rules
    /// before it that could not answer: each of those, from the last,
    /// matters only if its own verdict differs from what follows it.
    fn weigh(&self, default: Effect, decided: Option<usize>, undecided: &[usize]) -> Outcome {
        let passes = |o: Outcome| match o {
            Outcome::Rule(i) => {
                let r = &self.rules[i];
                Some(r.then == Effect::Allow || r.mode == RuleMode::Warn)
            }
            Outcome::Default => Some(default == Effect::Allow),
            Outcome::Undecided(_) => None,
        };
        let mut outcome = decided.map_or(Outcome::Default, Outcome::Rule);
        for &j in undecided.iter().rev() {
            let rest = passes(outcome);
            if rest.is_none() || rest != passes(Outcome::Rule(j)) {
                outcome = Outcome::Undecided(j);
            }
        }
        outcome
    }

    fn evaluation(
        &self,
        stage: Stage,
        subject: &Subject<'_>,
        outcome: Outcome,
        rules: Vec<RuleTrace>,
        checks: Vec<CheckTrace>,
    ) -> Evaluation {
        let (verdict, rule, message, warned) = match outcome {
            Outcome::Default => match self.default_of(stage, subject.profile) {
                Effect::Allow => (Verdict::Allow, DEFAULT.to_owned(), String::new(), None),
                Effect::Deny => (
                    Verdict::Deny,
                    DEFAULT.to_owned(),
                    format!(
                        "no policy rule allows this at profile {}, whose policy_default is deny",
                        subject.profile
                    ),
                    None,
                ),
            },
            Outcome::Rule(i) => {
                let r = &self.rules[i];
                let message = if r.message.is_empty() {
                    format!("refused by the policy rule {}", r.name)
                } else {
                    r.message.clone()
                };
                match (r.then, r.mode) {
                    (Effect::Allow, _) => (Verdict::Allow, r.name.clone(), String::new(), None),
                    (Effect::Deny, RuleMode::Enforce) => {
                        (Verdict::Deny, r.name.clone(), message, None)
                    }
                    (Effect::Deny, RuleMode::Warn) => (
                        Verdict::Allow,
                        r.name.clone(),
                        String::new(),
                        Some(Warned {
                            rule: r.name.clone(),
                            message,
                        }),
                    ),
                }
            }
            Outcome::Undecided(i) => (
                Verdict::Undecided,
                self.rules[i].name.clone(),
                "the policy could not decide, because a check it needs did not answer; retry later"
                    .to_owned(),
                None,
            ),
        };
        Evaluation {
            stage,
            verdict,
            rule,
            message,
            warned,
            rules,
            checks,
        }
    }

    /// The undecided evaluation of a stage whose checks took longer than
    /// `budget`.
    pub fn out_of_time(&self, stage: Stage, budget: std::time::Duration) -> Evaluation {
        Evaluation {
            stage,
            verdict: Verdict::Undecided,
            rule: TIMEOUT.to_owned(),
            message: format!(
                "the policy could not decide within {budget:?}, because its checks were slow to answer; retry later"
            ),
            warned: None,
            rules: Vec::new(),
            checks: Vec::new(),
        }
    }
}

fn valid_check_name(name: &str) -> bool {
    !name.is_empty()
        && !matches!(name, "and" | "or" | "not")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests;
