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

/// Log targets held at `info` whatever the filter asks: at `debug` the PostgreSQL client
/// writes every statement's parameters, and those carry claim tokens (bearer secrets: whoever
/// shows one may mirror, ack and report the delivery), payloads and results. Nothing of ours
/// needs them in a log; the statements themselves are in the code.
pub const SECRET_BEARING_TARGETS: [&str; 1] = ["tokio_postgres=info"];

/// The filter for `BATON_LOG`'s value (`None`: unset, or `default` where it does not parse),
/// with `SECRET_BEARING_TARGETS` held down.
fn filter(value: Option<&str>, default: &str) -> tracing_subscriber::EnvFilter {
    let mut filter = value
        .and_then(|v| tracing_subscriber::EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(default));
    for target in SECRET_BEARING_TARGETS {
        if let Ok(d) = target.parse() {
            filter = filter.add_directive(d);
        }
    }
    filter
}

/// Installs the process-wide subscriber writing to stderr. A second call does nothing.
pub fn init(format: LogFormat) {
    init_with_default(format, FILTER_DEFAULT);
}

/// `init`, with `default` as the filter when `BATON_LOG` is unset or invalid.
pub fn init_with_default(format: LogFormat, default: &str) {
    let value = std::env::var(FILTER_VAR).ok();
    let filter = filter(value.as_deref(), default);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever `BATON_LOG` asks, the PostgreSQL client's statement parameters (claim tokens
    /// among them) never reach a log: its target stays at `info`.
    #[test]
    fn the_postgres_client_s_parameters_stay_out_of_every_log() {
        for value in [None, Some("debug"), Some("trace"), Some("tokio_postgres=trace"), Some("not a filter[")] {
            let shown = filter(value, FILTER_DEFAULT).to_string();
            assert!(shown.contains("tokio_postgres=info"), "{value:?}: {shown}");
            assert!(
                !shown.contains("tokio_postgres=trace") && !shown.contains("tokio_postgres=debug"),
                "{value:?}: {shown}"
            );
        }
    }
}
