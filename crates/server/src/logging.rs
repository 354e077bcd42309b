//! Structured logs: every line has `event` and `outcome` fields (by
//! convention at each call site), a request's lines carry its `request_id`
//! through the request span, and `log_format = "json"` emits one JSON object
//! per line. `RUST_LOG` overrides the level filter. Text lines are coloured
//! only for a person: when stderr is a terminal and `NO_COLOR` is unset or
//! empty (<https://no-color.org>), never in a file or a journal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber; a second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
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
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
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
