//! The agent's log: `key=value` text lines (coloured on a terminal), or one JSON object per
//! line (`--log-format json`) for log pipelines. Events a pipeline may want to match carry
//! an `event` field (docs/observability.md).
//!
//! Log fields carry text tenants chose (cgroup names, in fields and in messages). The text
//! format writes every field, the message and span fields included, through [`InertFields`]:
//! control characters (ESC, CR, LF, TAB...) and invisible format characters (bidi
//! overrides...) come out as visible escapes ([`fgpu_common::inert`]), so a line read on a
//! terminal or in a journal is the line the agent wrote. The JSON format is escaped by
//! serde.

use std::fmt::{self, Write as _};

use anyhow::Result;
use fgpu_common::inert::Escaping;
use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// Rations the log lines of one repeated event that a tenant can cause at its own pace: the
/// first is logged, then at most one per period, carrying how many went unlogged since.
#[derive(Debug, Default)]
pub struct Ration {
    /// Until when (CLOCK_MONOTONIC ms) the event is not logged.
    quiet_until_ms: u64,
    /// How many were not logged since the last line.
    unlogged: u64,
}

impl Ration {
    /// Whether the event that happened at `now_ms` is logged: `Some(n)`, with n not logged
    /// since the last line; `None`: counted, not logged (at most one line per `every_ms`).
    pub fn admit(&mut self, now_ms: u64, every_ms: u64) -> Option<u64> {
        if now_ms < self.quiet_until_ms {
            self.unlogged += 1;
            return None;
        }
        self.quiet_until_ms = now_ms.saturating_add(every_ms);
        Some(std::mem::take(&mut self.unlogged))
    }

    /// Whether the event is still in its quiet period at `now_ms`.
    pub fn quiet(&self, now_ms: u64) -> bool {
        now_ms < self.quiet_until_ms
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `time level target: message key=value...`
    Text,
    /// `{"timestamp":...,"level":...,"fields":{"message":...,"event":...},"target":...}`
    Json,
}

pub fn init(filter: &str, format: LogFormat) -> Result<()> {
    let filter = EnvFilter::try_new(filter)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .fmt_fields(InertFields)
            // Colour only on a terminal: log files and journals get plain `key=value` fields.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().with_current_span(false).init(),
    }
    Ok(())
}

/// The text format's fields: `message key=value ...` as tracing-subscriber writes them
/// (strings quoted, `%` values as they display), every value escaped by
/// [`fgpu_common::inert`]; the field names in italic and `=` dimmed on a terminal.
pub struct InertFields;

impl<'writer> FormatFields<'writer> for InertFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let ansi = writer.has_ansi_escapes();
        let mut visitor = Visitor {
            out: &mut writer,
            ansi,
            empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Visitor<'a, 'w> {
    out: &'a mut Writer<'w>,
    ansi: bool,
    empty: bool,
    result: fmt::Result,
}

impl Visitor<'_, '_> {
    fn write(&mut self, name: &str, value: fmt::Arguments<'_>) -> fmt::Result {
        if !std::mem::take(&mut self.empty) {
            self.out.write_char(' ')?;
        }
        if name != "message" {
            let name = name.strip_prefix("r#").unwrap_or(name);
            if self.ansi {
                write!(self.out, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m")?;
            } else {
                write!(self.out, "{name}=")?;
            }
        }
        write!(Escaping(&mut *self.out), "{value}")
    }
}

impl Visit for Visitor<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        self.result = if field.name() == "message" {
            self.write(field.name(), format_args!("{value}"))
        } else {
            self.write(field.name(), format_args!("{value:?}"))
        };
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.result.is_err() {
            return;
        }
        let mut text = value.to_string();
        let mut source = value.source();
        while let Some(s) = source {
            let _ = write!(text, ": {s}");
            source = s.source();
        }
        self.result = self.write(field.name(), format_args!("{text}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        self.result = self.write(field.name(), format_args!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the text format writes for one event (with or without colour).
    fn text_line(ansi: bool, emit: impl FnOnce()) -> String {
        let buf = Buffer::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(InertFields)
            .with_ansi(ansi)
            .without_time()
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn tenant_text_in_fields_and_messages_comes_out_escaped() {
        // A cgroup named to clear the screen, set the clipboard (OSC 52) and overwrite the
        // line, with a bidi override.
        let evil = "/t/a\x1b[2J\x1b]52;c;cm0gLXJmIH4K\x07\rb\u{202e}c\nd";
        let line = text_line(false, || {
            let err = std::io::Error::other(evil);
            tracing::warn!(
                event = "alloc_denied",
                cgroup = %evil,
                path = evil,
                why = ?evil,
                error = &err as &(dyn std::error::Error + 'static),
                "{evil} refused"
            );
        });
        let body = line.strip_suffix('\n').unwrap();
        assert!(
            body.chars().all(|c| (' '..='~').contains(&c)),
            "raw control or format characters in {line:?}"
        );
        assert!(
            body.contains("/t/a\\x1b[2J\\x1b]52;c;cm0gLXJmIH4K\\x07\\x0db\\u{202e}c\\x0ad refused"),
            "{line}"
        );
        assert!(
            body.contains("cgroup=/t/a\\x1b[2J\\x1b]52;")
                && body.contains("event=\"alloc_denied\""),
            "{line}"
        );
        // With colour: the formatter's own sequences only.
        let line = text_line(true, || tracing::warn!(cgroup = %evil, "{evil}"));
        let escs = line.matches('\x1b').count();
        assert!(
            !line.contains("\x1b[2J") && !line.contains("\x1b]") && !line.contains('\r'),
            "{line:?}"
        );
        assert!(escs > 0 && line.contains("\\x1b[2J"), "{line:?}");
    }
}
