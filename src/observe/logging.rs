//! Log output: the tracing subscriber every command installs (one line per event on
//! stderr, pretty or JSON) and the escaping that keeps one event on one line.
//!
//! Keys, task ids and error texts come from producers and handlers, so a field or a message
//! may hold a newline, a carriage return or an ANSI escape sequence. Written as they are,
//! they would forge log lines or rewrite the operator's terminal. Every field value and every
//! message of the pretty format therefore goes through [`crate::util::escape`]; the JSON format is safe
//! already, because JSON strings escape control characters. Output meant for people that
//! shows stored text (`leaderq tasks list`, error messages) uses it too. Knows
//! nothing of tasks or Consul.

use std::fmt::{self, Write as _};

use crate::util::escape::Escaping;

use tracing_subscriber::field::MakeExt as _;
use tracing_subscriber::fmt::format::{debug_fn, Writer};

/// Log formats of `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One human-readable line per event.
    Pretty,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber: events at `default_level` and above (or as `RUST_LOG`
/// says) go to stderr in `format`, colored only when stderr is a terminal.
pub fn init(default_level: &str, format: Format) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let ansi = std::io::stderr().is_terminal();
    let _ =
        tracing::subscriber::set_global_default(subscriber(filter, format, ansi, std::io::stderr));
}

/// The subscriber `init` installs, writing to `writer`; tests give it a buffer.
pub fn subscriber<W>(
    filter: tracing_subscriber::EnvFilter,
    format: Format,
    ansi: bool,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        Format::Pretty => Box::new(
            builder
                .with_ansi(ansi)
                .fmt_fields(debug_fn(write_field).delimited(" "))
                .finish(),
        ),
        Format::Json => Box::new(builder.json().flatten_event(true).finish()),
    }
}

/// One field as the default format writes it (`name=value`, the message bare), escaped.
fn write_field(
    writer: &mut Writer<'_>,
    field: &tracing::field::Field,
    value: &dyn fmt::Debug,
) -> fmt::Result {
    let mut out = Escaping(writer);
    match field.name() {
        "message" => write!(out, "{value:?}"),
        name => write!(out, "{}={value:?}", name.strip_prefix("r#").unwrap_or(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer that keeps what the subscriber wrote.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Captured {
        type Writer = Captured;
        fn make_writer(&'w self) -> Captured {
            self.clone()
        }
    }

    fn logged(format: Format, ansi: bool, emit: impl FnOnce()) -> String {
        let captured = Captured::default();
        let subscriber = subscriber(
            tracing_subscriber::EnvFilter::new("info"),
            format,
            ansi,
            captured.clone(),
        );
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    const KEY: &str = "oracleTask/x\n2030-01-01T00:00:00Z  INFO forged: \u{1b}[31mred\r\u{2028}";

    /// In the pretty format, a key or an error text with a newline, a carriage return or an
    /// ANSI escape stays on its event's line, escaped, whether written with `%`, `?` or
    /// as a plain string, and in the message too; with colors on as well.
    #[test]
    fn pretty_events_stay_on_one_line_whatever_the_fields_hold() {
        for ansi in [false, true] {
            let text = logged(Format::Pretty, ansi, || {
                let error = std::io::Error::other("boom\nFORGED line");
                tracing::warn!(task_key = %KEY, debug = ?KEY, plain = KEY, error = %error, "task failed: {KEY}");
                let span = tracing::info_span!("lead", key = %KEY);
                span.in_scope(|| tracing::info!("inside"));
            });
            assert_eq!(text.lines().count(), 2, "{text}");
            assert!(!text.contains('\r') && !text.contains('\u{2028}'), "{text}");
            let escapes = text.matches('\u{1b}').count();
            if !ansi {
                assert_eq!(escapes, 0, "{text}");
            }
            assert!(text.contains(r"task_key=oracleTask/x\n2030-01-01T00:00:00Z  INFO forged: \u{1b}[31mred\r\u{2028}"), "{text}");
            assert!(text.contains(r"error=boom\nFORGED line"), "{text}");
            assert!(text.contains(r"task failed: oracleTask/x\n2030"), "{text}");
            assert!(text.contains(r#"plain="oracleTask/x\n2030"#), "{text}");
        }
    }

    /// The JSON format escapes control characters by itself: one object per line, and the
    /// values read back exactly.
    #[test]
    fn json_events_stay_on_one_line_and_keep_the_exact_text() {
        let text = logged(Format::Json, false, || {
            tracing::warn!(task_key = %KEY, "task failed: {KEY}");
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        let event: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(event["task_key"], KEY);
        assert_eq!(event["message"], format!("task failed: {KEY}"));
        assert!(!text.contains('\u{1b}'));
    }
}
