//! Logging, the same for both binaries: one filter variable (`BATON_LOG`, tracing's
//! `EnvFilter` syntax, default `info`), text or JSON lines on stderr, colour only on a terminal.

use std::io::IsTerminal;

/// The environment variable both binaries read their log filter from.
pub const FILTER_VAR: &str = "BATON_LOG";

/// The filter used when `BATON_LOG` is unset or invalid.
pub const FILTER_DEFAULT: &str = "info";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the process-wide subscriber writing to stderr. A second call does nothing.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(FILTER_VAR)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(FILTER_DEFAULT));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
