//! Structured logs: every line has `event` and `outcome` fields (by
//! convention at each call site), a request's lines carry its `request_id`
//! through the request span, and `log_format = "json"` emits one flat JSON
//! object per line: the time, level and target, the line's fields and
//! those of the spans it is in (`request_id`), all at the top level where
//! collectors look for them. `RUST_LOG` overrides the level filter. Text
//! lines are coloured only for a person: when stderr is a terminal and
//! `NO_COLOR` is unset or empty (<https://no-color.org>), never in a file
//! or a journal.

use std::io::IsTerminal;

use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::LogFormat;

/// The target of the one line per HTTP request (`http.request`), so that
/// `RUST_LOG=info,acme_proxy::request=warn` quiets them alone. SQL
/// statements (PostgreSQL) are logged at trace level on `sqlx::query`.
pub const REQUEST_TARGET: &str = "acme_proxy::request";

/// Installs the global subscriber; a second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    // hickory-server logs two lines at info for every DNS question
    // ([dns_zone]), which anyone who can send a packet would then write.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,hickory_server=warn,hickory_proto=warn"));
    // Logs go to stderr; stdout carries only what `serve` prints for people.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// One JSON object per line with every field at the top level: the line's
/// own, then its spans' (innermost first) where the line has none of that
/// name.
struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let mut line = serde_json::Map::new();
        // Log lines carry the wall clock's time, whatever a test injects.
        let now = crate::clock::Clock::now(&crate::clock::SystemClock);
        line.insert(
            "timestamp".into(),
            now.format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default()
                .into(),
        );
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        event.record(&mut Visitor(&mut line));
        if let Some(scope) = ctx.event_scope() {
            for span in scope {
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else {
                    continue;
                };
                let Ok(serde_json::Value::Object(fields)) =
                    serde_json::from_str::<serde_json::Value>(fields)
                else {
                    continue;
                };
                for (name, value) in fields {
                    line.entry(name).or_insert(value);
                }
            }
        }
        let text = serde_json::to_string(&line).map_err(|_| std::fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// Records an event's fields as JSON values.
struct Visitor<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
}

/// Whether text logs carry ANSI colour codes.
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use super::colour;

    #[test]
    fn colour_is_for_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(
            colour(true, Some("".as_ref())),
            "an empty NO_COLOR is unset"
        );
        assert!(!colour(true, Some("1".as_ref())));
        assert!(!colour(false, None), "a file or a pipe gets no escapes");
    }
}
