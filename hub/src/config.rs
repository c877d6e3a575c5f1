//! The hub's configuration: an optional TOML file (`DIR/hub.toml` or `--config`), validated at
//! start. Unknown keys and out-of-range values are refused with a message that names the field
//! and its allowed range.

use baton_shared::limits::*;
use baton_shared::sqlite::Synchronous;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The listen address used when neither the file nor `--listen` names one.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7443";
/// How long a TLS handshake may take before the connection is dropped (slowloris guard).
pub const HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// How long shutdown waits for open requests.
pub const SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(10);

/// Every bound the hub enforces, with its configured value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload (serialised JSON), bytes.
    pub payload_bytes_max: u64,
    /// Largest result body in a report, bytes.
    pub result_bytes_max: u64,
    /// Most deliveries one claim returns.
    pub claim_batch_max: u32,
    /// Longest a long-poll (claim or message read) waits.
    pub long_poll_wait_max: Duration,
    /// Most recipients one message may name.
    pub recipients_max: u32,
    /// Most deliveries waiting (queued or held) per host.
    pub queued_per_host_max: u64,
    /// How long messages (and their idempotency keys) are kept once settled.
    pub retention: Duration,
    /// Largest request body read, bytes.
    pub request_body_bytes_max: u64,
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            payload_bytes_max: PAYLOAD_BYTES_MAX_DEFAULT,
            result_bytes_max: RESULT_BYTES_MAX_DEFAULT,
            claim_batch_max: CLAIM_BATCH_MAX_DEFAULT,
            long_poll_wait_max: LONG_POLL_WAIT_MAX_DEFAULT,
            recipients_max: RECIPIENTS_MAX_DEFAULT,
            queued_per_host_max: QUEUED_PER_HOST_MAX_DEFAULT,
            retention: RETENTION_DEFAULT,
            request_body_bytes_max: REQUEST_BODY_BYTES_MAX_DEFAULT,
            handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT,
        }
    }
}

/// The validated hub configuration.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// SQLite `synchronous`; anything below full is warned about at start.
    pub synchronous: Synchronous,
    /// Bounds.
    pub limits: Limits,
    /// How long shutdown waits for open requests.
    pub shutdown_grace: Duration,
    /// Logs as JSON lines instead of text.
    pub log_json: bool,
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            listen: LISTEN_DEFAULT.parse().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 7443))),
            synchronous: Synchronous::Full,
            limits: Limits::default(),
            shutdown_grace: SHUTDOWN_GRACE_DEFAULT,
            log_json: false,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    synchronous: Option<Synchronous>,
    shutdown_grace: Option<String>,
    log_format: Option<String>,
    #[serde(default)]
    limits: RawLimits,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    payload_bytes_max: Option<u64>,
    result_bytes_max: Option<u64>,
    claim_batch_max: Option<u32>,
    long_poll_wait_max: Option<String>,
    recipients_max: Option<u32>,
    queued_per_host_max: Option<u64>,
    retention: Option<String>,
    request_body_bytes_max: Option<u64>,
    handshake_timeout: Option<String>,
}

const MIB: u64 = 1024 * 1024;

fn ranged<T: PartialOrd + std::fmt::Display + Copy>(
    field: &str,
    v: Option<T>,
    default: T,
    lo: T,
    hi: T,
) -> Result<T, String> {
    let v = v.unwrap_or(default);
    if v < lo || v > hi {
        return Err(format!("{field} = {v} is out of range; allowed {lo}..={hi}"));
    }
    Ok(v)
}

fn ranged_duration(
    field: &str,
    v: Option<&str>,
    default: Duration,
    lo: Duration,
    hi: Duration,
) -> Result<Duration, String> {
    let d = match v {
        Some(s) => baton_shared::duration::parse(field, s)?,
        None => default,
    };
    if d < lo || d > hi {
        return Err(format!("{field} = {} is out of range; allowed {}..={}", humanize(d), humanize(lo), humanize(hi)));
    }
    Ok(d)
}

fn humanize(d: Duration) -> String {
    if d.subsec_millis() != 0 { format!("{}ms", d.as_millis()) } else { format!("{}s", d.as_secs()) }
}

impl HubConfig {
    /// Parses and validates configuration text. The error names the field and its range.
    pub fn from_toml(text: &str) -> Result<HubConfig, String> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        let listen = match raw.listen {
            Some(s) => {
                s.parse().map_err(|_| format!("listen = {s:?} is not an ADDR:PORT such as \"127.0.0.1:7443\""))?
            }
            None => HubConfig::default().listen,
        };
        let l = raw.limits;
        let d = Limits::default();
        let limits = Limits {
            payload_bytes_max: ranged(
                "limits.payload_bytes_max",
                l.payload_bytes_max,
                d.payload_bytes_max,
                1,
                16 * MIB,
            )?,
            result_bytes_max: ranged("limits.result_bytes_max", l.result_bytes_max, d.result_bytes_max, 1, 16 * MIB)?,
            claim_batch_max: ranged("limits.claim_batch_max", l.claim_batch_max, d.claim_batch_max, 1, 1000)?,
            long_poll_wait_max: ranged_duration(
                "limits.long_poll_wait_max",
                l.long_poll_wait_max.as_deref(),
                d.long_poll_wait_max,
                Duration::ZERO,
                Duration::from_secs(300),
            )?,
            recipients_max: ranged("limits.recipients_max", l.recipients_max, d.recipients_max, 1, 1024)?,
            queued_per_host_max: ranged(
                "limits.queued_per_host_max",
                l.queued_per_host_max,
                d.queued_per_host_max,
                1,
                1_000_000_000,
            )?,
            retention: ranged_duration(
                "limits.retention",
                l.retention.as_deref(),
                d.retention,
                Duration::from_secs(3600),
                Duration::from_secs(3650 * 24 * 3600),
            )?,
            request_body_bytes_max: ranged(
                "limits.request_body_bytes_max",
                l.request_body_bytes_max,
                d.request_body_bytes_max,
                1024,
                64 * MIB,
            )?,
            handshake_timeout: ranged_duration(
                "limits.handshake_timeout",
                l.handshake_timeout.as_deref(),
                d.handshake_timeout,
                Duration::from_secs(1),
                Duration::from_secs(60),
            )?,
        };
        for (field, v) in [
            ("limits.payload_bytes_max", limits.payload_bytes_max),
            ("limits.result_bytes_max", limits.result_bytes_max),
        ] {
            if v + 4096 > limits.request_body_bytes_max {
                return Err(format!(
                    "{field} = {v} does not fit in limits.request_body_bytes_max = {} (leave 4096 bytes for the rest of the request)",
                    limits.request_body_bytes_max
                ));
            }
        }
        let shutdown_grace = ranged_duration(
            "shutdown_grace",
            raw.shutdown_grace.as_deref(),
            SHUTDOWN_GRACE_DEFAULT,
            Duration::ZERO,
            Duration::from_secs(600),
        )?;
        let log_json = match raw.log_format.as_deref() {
            None | Some("text") => false,
            Some("json") => true,
            Some(other) => return Err(format!("log_format = {other:?} is not one of \"text\", \"json\"")),
        };
        Ok(HubConfig {
            listen,
            synchronous: raw.synchronous.unwrap_or(Synchronous::Full),
            limits,
            shutdown_grace,
            log_json,
        })
    }

    /// Loads `path` when given (it must exist), else `default_path` when it exists, else defaults.
    pub fn load(path: Option<&Path>, default_path: &Path) -> Result<HubConfig, String> {
        let file = match path {
            Some(p) => Some(p),
            None if default_path.exists() => Some(default_path),
            None => None,
        };
        match file {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
                HubConfig::from_toml(&text).map_err(|e| format!("{}: {e}", p.display()))
            }
            None => Ok(HubConfig::default()),
        }
    }
}

/// The commented configuration `init` writes, listing every key with its default and range.
pub const CONFIG_TEMPLATE: &str = r#"# Baton hub configuration. Every key is optional; the values shown are the defaults.
# Unknown keys and out-of-range values are refused at start.

# listen = "127.0.0.1:7443"        # ADDR:PORT; `serve --listen` overrides it
# synchronous = "full"             # "full" (every answer is on stable storage) or "normal" (warned)
# shutdown_grace = "10s"           # 0s..=600s, how long SIGTERM waits for open requests
# log_format = "text"              # "text" or "json"

[limits]
# payload_bytes_max = 262144       # 1..=16777216, bytes of serialised payload JSON
# result_bytes_max = 65536         # 1..=16777216, bytes of a report's result body
# claim_batch_max = 64             # 1..=1000, deliveries per claim
# long_poll_wait_max = "30s"       # 0s..=300s, longest wait of a claim or message read
# recipients_max = 64              # 1..=1024, recipients per message
# queued_per_host_max = 1000000    # 1..=1000000000, deliveries waiting per host before 429
# retention = "168h"               # 1h..=3650d, how long settled messages and their keys are kept
# request_body_bytes_max = 1048576 # 1024..=67108864, larger bodies get 413 before being read
# handshake_timeout = "10s"        # 1s..=60s
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn check_err(text: &str, needle: &str) {
        let e = HubConfig::from_toml(text).unwrap_err();
        assert!(e.contains(needle), "{e:?} should mention {needle:?}");
    }

    #[test]
    fn defaults_and_template_parse() {
        let c = HubConfig::from_toml("").unwrap();
        assert_eq!(c.limits, Limits::default());
        let c = HubConfig::from_toml(CONFIG_TEMPLATE).unwrap();
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.synchronous, Synchronous::Full);
    }

    #[test]
    fn refusals_name_the_field_and_range() {
        check_err("lisen = \"x\"", "lisen");
        check_err("[limits]\nclaim_batch_max = 0", "limits.claim_batch_max = 0 is out of range; allowed 1..=1000");
        check_err("[limits]\nlong_poll_wait_max = \"1h\"", "limits.long_poll_wait_max");
        check_err("[limits]\nretention = \"soon\"", "limits.retention");
        check_err("[limits]\npayload_bytes_max = 2000000", "limits.payload_bytes_max");
        check_err("synchronous = \"off\"", "synchronous");
        check_err("listen = \"nowhere\"", "listen");
        check_err("[limits]\nbogus = 1", "bogus");
    }

    #[test]
    fn values_are_taken() {
        let c = HubConfig::from_toml(
            "synchronous = \"normal\"\n[limits]\nclaim_batch_max = 5\nlong_poll_wait_max = \"2s\"",
        )
        .unwrap();
        assert_eq!(c.synchronous, Synchronous::Normal);
        assert_eq!(c.limits.claim_batch_max, 5);
        assert_eq!(c.limits.long_poll_wait_max, Duration::from_secs(2));
    }
}
