//! The agent's log: `key=value` text lines (coloured on a terminal), or one JSON object per
//! line (`--log-format json`) for log pipelines. Events a pipeline may want to match carry
//! an `event` field (docs/observability.md).

use anyhow::Result;
use tracing_subscriber::EnvFilter;

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
            // Colour only on a terminal: log files and journals get plain `key=value` fields.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().with_current_span(false).init(),
    }
    Ok(())
}
