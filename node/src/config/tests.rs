//! The key table, the layers and validation: messages that name the key and the range.

use super::*;
use std::collections::HashMap;

const BASE: &str = r#"
hub_url = "https://hub.example:7443"
ca_file = "/etc/baton/ca.crt"
cert_file = "/etc/baton/h.crt"
key_file = "/etc/baton/h.key"
data_dir = "/var/lib/baton-node"
command = ["/usr/bin/harness", "--turn"]
"#;

fn parse(extra: &str) -> Result<NodeConfig, ConfigError> {
    let layer = Layer::from_toml("test.toml", &format!("{BASE}{extra}"))?;
    NodeConfig::validate(layer)
}

/// Checks that `extra` appended to a valid file is refused with a message containing every
/// one of `expected`.
fn check_refused(extra: &str, expected: &[&str]) {
    let err = parse(extra).expect_err(extra).to_string();
    for e in expected {
        assert!(err.contains(e), "{extra:?}: {err:?} lacks {e:?}");
    }
}

#[test]
fn defaults_fill_the_optional_keys() {
    let c = parse("").unwrap();
    assert_eq!(c.hub_url.urls(), ["https://hub.example:7443"]);
    assert_eq!(c.command, ["/usr/bin/harness", "--turn"]);
    assert_eq!(c.parallel_conversations, 4);
    assert_eq!(c.exec_timeout, Duration::from_secs(600));
    assert_eq!(c.claim_wait, Duration::from_secs(30));
    assert_eq!(c.claim_batch_max, 16);
    assert_eq!(c.result_bytes_max, 65536);
    assert_eq!(c.stderr_tail_bytes, 4096);
    assert_eq!(parse("stderr_tail_bytes = 0\n").unwrap().stderr_tail_bytes, 0, "0 sends none");
    assert_eq!(c.shutdown_grace, Duration::from_secs(10));
    assert_eq!(c.backoff_max, Duration::from_secs(30));
    assert_eq!(c.kill_grace, Duration::from_secs(10));
    assert_eq!(c.local_retention, Duration::from_secs(7 * 24 * 3600));
    assert_eq!(c.log_format, LogFormat::Text);
    assert_eq!(c.harness, Harness::Command);
    assert_eq!(c.handoff, Handoff::Combined);
    assert_eq!(parse("handoff = \"separate\"\n").unwrap().handoff, Handoff::Separate);
    assert_eq!(c.metrics_listen, None, "no metrics listener unless configured");
}

#[test]
fn metrics_listen_is_an_address_a_loopback_port_or_off() {
    let at = |text: &str| parse(&format!("metrics_listen = {text}\n")).map(|c| c.metrics_listen);
    assert_eq!(at("\"off\"").unwrap(), None);
    assert_eq!(at("\"127.0.0.1:9465\"").unwrap(), Some("127.0.0.1:9465".parse().unwrap()));
    assert_eq!(at("\"9465\"").unwrap(), Some("127.0.0.1:9465".parse().unwrap()), "a port alone is loopback");
    assert_eq!(at("9465").unwrap(), Some("127.0.0.1:9465".parse().unwrap()), "as a TOML integer too");
    assert_eq!(at("\"[::1]:0\"").unwrap(), Some("[::1]:0".parse().unwrap()));
    check_refused("metrics_listen = \"localhost:9465\"\n", &["metrics_listen", "is not ADDR:PORT", "\"off\""]);
    check_refused("metrics_listen = \"70000\"\n", &["metrics_listen", "out of the range 0..=65535"]);
    check_refused("metrics_listen = true\n", &["metrics_listen", "expected a string"]);
    let env = Layer::from_env(|k| (k == "BATON_NODE_METRICS_LISTEN").then(|| "9999".to_string())).unwrap();
    let c = NodeConfig::resolve(Layer::from_toml("t", BASE).unwrap(), env, Layer::default()).unwrap();
    assert_eq!(c.metrics_listen, Some("127.0.0.1:9999".parse().unwrap()));
}

#[test]
fn unknown_key_is_refused_by_name() {
    check_refused("ca_fiel = \"x\"\n", &["test.toml", "unknown key", "ca_fiel", "ca_file"]);
}

#[test]
fn out_of_range_values_name_the_field_and_range() {
    check_refused("parallel_conversations = 0\n", &["parallel_conversations", "1..=256"]);
    check_refused("parallel_conversations = 257\n", &["parallel_conversations", "1..=256"]);
    check_refused("claim_batch_max = 1001\n", &["claim_batch_max", "1..=1000"]);
    check_refused("queue_ahead_batches = 0\n", &["queue_ahead_batches", "1..=1000"]);
    check_refused("handoffs_in_flight = 0\n", &["handoffs_in_flight", "1..=16"]);
    check_refused("handoffs_in_flight = 17\n", &["handoffs_in_flight", "1..=16"]);
    check_refused("result_bytes_max = 16777217\n", &["result_bytes_max", "1..=16777216"]);
    check_refused("stderr_tail_bytes = 65537\n", &["stderr_tail_bytes", "0..=65536"]);
    check_refused("exec_timeout = \"0s\"\n", &["exec_timeout", "1s..=1day"]);
    check_refused("exec_timeout = \"25h\"\n", &["exec_timeout", "out of the allowed range"]);
    check_refused("claim_wait = \"6m\"\n", &["claim_wait", "0s..=5m"]);
    check_refused("checkpoint_interval = \"5ms\"\n", &["checkpoint_interval", "10ms..=1h"]);
    check_refused("checkpoint_interval = \"2h\"\n", &["checkpoint_interval", "10ms..=1h"]);
    check_refused("claim_wait = \"soon\"\n", &["claim_wait", "not a duration"]);
    check_refused("kill_grace = \"11m\"\n", &["kill_grace", "0s..=10m"]);
    check_refused("local_retention = \"59m\"\n", &["local_retention", "1h..=1year"]);
    check_refused("log_format = \"xml\"\n", &["log_format", "\"text\""]);
    check_refused("harness = \"magic\"\n", &["harness", "\"noop\""]);
    check_refused("parallel_conversations = \"4\"\n", &["parallel_conversations", "expected a whole number"]);
    check_refused(
        "parallel_conversations = -1\n",
        &["parallel_conversations", "-1 is out of the allowed range 1..=256"],
    );
    check_refused("claim_wait = 30\n", &["claim_wait", "expected a duration"]);
    check_refused("synchronous = \"off\"\n", &["synchronous", "\"full\", \"normal\""]);
    check_refused("handoff = \"both\"\n", &["handoff", "\"combined\", \"separate\""]);
    for (alone, expected) in [
        ("command = [\"sh\", 1]", "command: expected an array of strings"),
        ("data_dir = \"\"", "data_dir: must not be empty"),
    ] {
        let err = Layer::from_toml("t", alone).unwrap_err().to_string();
        assert!(err.contains(expected), "{alone}: {err}");
    }
}

#[test]
fn http_hub_url_is_refused() {
    let mut layer = Layer::from_toml("t", BASE).unwrap();
    let err = layer.set("hub_url", "http://hub:7443").unwrap_err().to_string();
    assert!(err.starts_with("hub_url:") && err.contains("only https://"), "{err}");
}

/// `hub_url` from the file (`toml` is its TOML value) or as a flag (`text`): the URLs it
/// resolves to, or the error's text.
fn hub_urls(toml: Option<&str>, text: Option<&str>) -> Result<Vec<String>, String> {
    let base: String = BASE.lines().filter(|l| !l.starts_with("hub_url")).map(|l| format!("{l}\n")).collect();
    let file = match toml {
        Some(v) => Layer::from_toml("t", &format!("{base}hub_url = {v}\n")),
        None => Layer::from_toml("t", &base),
    }
    .map_err(|e| e.to_string())?;
    let mut flags = Layer::default();
    if let Some(t) = text {
        flags.set("hub_url", t).map_err(|e| e.to_string())?;
    }
    let c = NodeConfig::resolve(file, Layer::default(), flags).map_err(|e| e.to_string())?;
    Ok(c.hub_url.urls().to_vec())
}

#[test]
fn hub_url_is_one_url_or_a_list() {
    let urls = |v: &[&str]| Ok(v.iter().map(|u| u.to_string()).collect::<Vec<_>>());
    assert_eq!(hub_urls(Some("\"https://a:7443/\""), None), urls(&["https://a:7443"]), "a string, as ever");
    assert_eq!(
        hub_urls(Some("[\"https://a:7443\", \"https://b:7443/\"]"), None),
        urls(&["https://a:7443", "https://b:7443"]),
        "an array, in order"
    );
    assert_eq!(
        hub_urls(None, Some("https://a:7443, https://b:7443")),
        urls(&["https://a:7443", "https://b:7443"]),
        "a comma-separated flag or variable"
    );
    assert_eq!(hub_urls(None, Some("https://b:1")), urls(&["https://b:1"]));
    let max: Vec<String> = (0..crate::limits::HUB_URLS_MAX).map(|i| format!("https://h{i}:1")).collect();
    assert_eq!(hub_urls(None, Some(&max.join(","))), Ok(max.clone()), "HUB_URLS_MAX hubs");
    let parsed: HubUrls = "https://a:1,https://b:1".parse().unwrap();
    assert_eq!((parsed.urls().len(), parsed.to_string()), (2, "https://a:1,https://b:1".to_string()));
}

#[test]
fn a_bad_hub_url_entry_is_named() {
    let refused = |toml: Option<&str>, text: Option<&str>, says: &[&str]| {
        let err = hub_urls(toml, text).expect_err(&format!("{toml:?} {text:?}"));
        assert!(err.starts_with("hub_url: "), "{err}");
        for s in says {
            assert!(err.contains(s), "{toml:?} {text:?}: {err:?} lacks {s:?}");
        }
    };
    refused(None, Some("https://a:1,http://b:1"), &["entry 2 of 2", "\"http://b:1\"", "only https://"]);
    refused(Some("[\"https://a:1\", \"ftp://b\"]"), None, &["entry 2 of 2", "\"ftp://b\"", "only https://"]);
    refused(None, Some("https://a:1,https://A:1/"), &["entry 2 of 2", "same hub as entry 1", "\"https://a:1\""]);
    refused(Some("[\"https://a\", \"https://a:443\"]"), None, &["same hub as entry 1"]);
    refused(None, Some("https://a:1,,https://b:1"), &["entry 2 of 3", "empty entry"]);
    refused(None, Some("https://a:1,"), &["entry 2 of 2", "empty entry"]);
    refused(Some("[]"), None, &["names no hub"]);
    refused(Some("[\"https://a:1\", 7]"), None, &["expected an array of strings, found a integer"]);
    refused(Some("7"), None, &["expected a string or an array of strings"]);
    refused(Some("\"https://a:1,https://b:1\""), None, &["holds a comma", "hub_url = ["]);
    let over: Vec<String> = (0..=crate::limits::HUB_URLS_MAX).map(|i| format!("https://h{i}:1")).collect();
    refused(None, Some(&over.join(",")), &[&format!("names {} hubs; at most 16", over.len())]);
    let over = format!("[{}]", over.iter().map(|u| format!("{u:?}")).collect::<Vec<_>>().join(", "));
    refused(Some(&over), None, &["at most 16"]);
    // A single URL reads as before: no entry number.
    refused(None, Some("http://hub:7443"), &["\"http://hub:7443\" uses http://"]);
    assert!(!hub_urls(None, Some("http://hub:7443")).unwrap_err().contains("entry"));
}

#[test]
fn empty_command_is_refused_unless_noop() {
    let mut layer = Layer::from_toml("t", BASE).unwrap();
    layer.set("command", "[]").unwrap();
    let err = NodeConfig::validate(layer.clone()).unwrap_err().to_string();
    assert!(err.starts_with("command:"), "{err}");
    layer.set("harness", "noop").unwrap();
    assert_eq!(NodeConfig::validate(layer).unwrap().harness, Harness::Noop);
}

#[test]
fn missing_required_key_names_flag_and_env() {
    let err = NodeConfig::validate(Layer::default()).unwrap_err().to_string();
    assert!(err.contains("hub_url is required") && err.contains("--hub-url") && err.contains("BATON_NODE_HUB_URL"));
}

#[test]
fn precedence_is_flag_then_env_then_file_then_default() {
    let file =
        Layer::from_toml("t", &format!("{BASE}claim_wait = \"5s\"\nexec_timeout = \"1m\"\nclaim_batch_max = 3\n"))
            .unwrap();
    let vars: HashMap<String, String> = [
        ("BATON_NODE_CLAIM_WAIT", "7s"),
        ("BATON_NODE_EXEC_TIMEOUT", "2m"),
        ("BATON_NODE_COMMAND", r#"["sh", "-c", "cat"]"#),
        ("OTHER", "x"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let env = Layer::from_env(|k| vars.get(k).cloned()).unwrap();
    let mut flags = Layer::default();
    flags.set("claim_wait", "9s").unwrap();
    let c = NodeConfig::resolve(file, env, flags).unwrap();
    assert_eq!(c.claim_wait, Duration::from_secs(9), "flag beats env and file");
    assert_eq!(c.exec_timeout, Duration::from_secs(120), "env beats file");
    assert_eq!(c.claim_batch_max, 3, "file beats default");
    assert_eq!(c.parallel_conversations, 4, "default");
    assert_eq!(c.command, ["sh", "-c", "cat"]);
}

#[test]
fn everything_can_come_from_env_without_a_file() {
    let vars: HashMap<String, String> = [
        ("BATON_NODE_HUB_URL", "https://127.0.0.1:9/"),
        ("BATON_NODE_CA_FILE", "ca.crt"),
        ("BATON_NODE_CERT_FILE", "h.crt"),
        ("BATON_NODE_KEY_FILE", "h.key"),
        ("BATON_NODE_DATA_DIR", "d"),
        ("BATON_NODE_COMMAND", "/bin/true"),
        ("BATON_NODE_PARALLEL_CONVERSATIONS", "8"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let env = Layer::from_env(|k| vars.get(k).cloned()).unwrap();
    let c = NodeConfig::resolve(Layer::default(), env, Layer::default()).unwrap();
    assert_eq!(c.hub_url.urls(), ["https://127.0.0.1:9"]);
    assert_eq!(c.command, ["/bin/true"]);
    assert_eq!(c.parallel_conversations, 8);
}

#[test]
fn bad_env_number_names_the_field() {
    let err = Layer::from_env(|k| (k == "BATON_NODE_CLAIM_BATCH_MAX").then(|| "lots".to_string())).unwrap_err();
    assert!(err.to_string().starts_with("claim_batch_max:"), "{err}");
}

/// Every key: its default (when it has one) builds, each allowed word builds into its field's
/// type, the flag and the variable reach the same field, and the help names all three.
#[test]
fn every_key_is_declared_once_and_reaches_its_field() {
    let mut names: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), KEYS.len(), "a key is declared twice");
    for key in KEYS {
        let help = key.help();
        assert!(help.contains(&key.env_var()) && !key.doc.trim().is_empty(), "{}: {help}", key.name);
        let samples: Vec<String> = match key.kind {
            Kind::HttpsUrl => vec!["https://other:1".into()],
            Kind::Path => vec!["/elsewhere".into()],
            Kind::Argv => vec![r#"["x", "y"]"#.into(), "/bin/x".into()],
            Kind::Count { range: (min, max), .. } => vec![min.to_string(), max.to_string()],
            Kind::Duration { range: (min, max), .. } => {
                vec![humantime::format_duration(min).to_string(), humantime::format_duration(max).to_string()]
            }
            Kind::Word(words) => words.iter().map(|w| w.to_string()).collect(),
            Kind::Listen => vec!["off".into(), "9465".into(), "127.0.0.1:0".into(), "[::1]:9465".into()],
            Kind::OtlpUrl => {
                vec!["".into(), "http://127.0.0.1:4318".into(), "https://otel.example.net/v1/traces".into()]
            }
        };
        for sample in samples {
            let base = Layer::from_toml("t", BASE).unwrap();
            let mut flags = Layer::default();
            flags.set(key.name, &sample).unwrap();
            let vars = Layer::from_env(|v| (v == key.env_var()).then(|| sample.clone())).unwrap();
            assert_eq!(flags, vars, "{}: the flag and the variable read {sample:?} alike", key.name);
            let config = NodeConfig::resolve(base, Layer::default(), flags)
                .unwrap_or_else(|e| panic!("{} = {sample:?}: {e}", key.name));
            let shown = format!("{config:?}");
            assert!(shown.contains(&format!("{}: ", key.name)), "{shown}");
        }
    }
}

#[test]
fn flags_are_generated_from_the_table() {
    use clap::{CommandFactory as _, Parser};
    #[derive(Parser)]
    struct Probe {
        #[command(flatten)]
        flags: ConfigFlags,
    }
    let cmd = Probe::command();
    let longs: Vec<String> = cmd.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect();
    let flags: Vec<String> = KEYS.iter().map(Key::flag).collect();
    assert_eq!(longs, flags);
    let probe = Probe::try_parse_from(["probe", "--claim-wait", "3s", "--parallel-conversations", "8"]).unwrap();
    let mut expected = Layer::default();
    expected.set("claim_wait", "3s").unwrap();
    expected.set("parallel_conversations", "8").unwrap();
    assert_eq!(probe.flags.layer().unwrap(), expected);
    let bad = Probe::try_parse_from(["probe", "--claim-wait", "forever"]).unwrap();
    assert!(bad.flags.layer().unwrap_err().to_string().starts_with("claim_wait:"));
}

/// `otlp_endpoint`: empty (no export) by default; an http(s) URL from any layer; anything else
/// refused naming the key and what is wrong.
#[test]
fn otlp_endpoint_is_an_http_url_or_nothing() {
    let base = || Layer::from_toml("t", BASE).unwrap();
    let config = NodeConfig::resolve(base(), Layer::default(), Layer::default()).unwrap();
    assert!(config.otlp_endpoint.is_none(), "off unless configured");
    let file = Layer::from_toml("t", &format!("{BASE}\notlp_endpoint = \"http://127.0.0.1:4318\"\n")).unwrap();
    let config = NodeConfig::resolve(file, Layer::default(), Layer::default()).unwrap();
    assert_eq!(
        config.otlp_endpoint.map(|e| e.traces_url().to_string()).as_deref(),
        Some("http://127.0.0.1:4318/v1/traces")
    );
    for (bad, why) in [("grpc://c:4317", "http:// or https://"), ("http://c:4318/?x=1", "query"), ("c", "not a URL")] {
        let mut flags = Layer::default();
        let e = flags.set("otlp_endpoint", bad).unwrap_err().to_string();
        assert!(e.starts_with("otlp_endpoint:") && e.contains(why), "{bad}: {e}");
    }
}
