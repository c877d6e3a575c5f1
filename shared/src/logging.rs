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

/// The filter of a command run at a terminal (every `baton-hub` command but `serve`) when
/// `BATON_LOG` is unset: the schema migration runner's own line ("Database migrated to version
/// N") is a service's log line, not a command's output, and the command says what it did.
pub const FILTER_COMMAND_DEFAULT: &str = "info,rusqlite_migration=warn";

/// Installs the process-wide subscriber writing to stderr. A second call does nothing.
pub fn init(format: LogFormat) {
    init_with_default(format, FILTER_DEFAULT);
}

/// `init`, with `default` as the filter when `BATON_LOG` is unset or invalid.
pub fn init_with_default(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(FILTER_VAR)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
