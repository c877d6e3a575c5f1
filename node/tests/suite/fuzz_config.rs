//! Property-based fuzzing of the node's configuration: the TOML file, and the text a flag or a
//! `BATON_NODE_<KEY>` variable carries.
//!
//! What must hold: no panic; an unknown key is refused by name; a value of the wrong type or
//! out of range is refused with the typed error naming its key; a value of the right type within
//! its range is accepted; text that is not TOML is a parse error naming the file.
//!
//! Long run: `BATON_FUZZ_CASES=1000000 cargo test --release -p baton-node --all-features --test suite fuzz_config`.

use baton_node::config::{ConfigError, KEYS, Key, Kind, Layer, NodeConfig};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::time::Duration;

/// See `shared/tests/suite/fuzz_ids.rs`: `default` cases unless `BATON_FUZZ_CASES` says otherwise.
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("BATON_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct("proptest-regressions/fuzz_config.txt"))),
        ..ProptestConfig::default()
    }
}

/// The keys every valid file sets, with valid values.
const BASE: &[(&str, &str)] = &[
    ("hub_url", "\"https://hub.example:7443\""),
    ("ca_file", "\"/etc/baton/ca.crt\""),
    ("cert_file", "\"/etc/baton/h.crt\""),
    ("key_file", "\"/etc/baton/h.key\""),
    ("data_dir", "\"/var/lib/baton-node\""),
    ("command", "[\"/usr/bin/harness\", \"--turn\"]"),
];

/// A valid file with `name = value` instead of (or beside) the base keys.
fn file_with(name: &str, value: &str) -> String {
    let mut text: String = BASE.iter().filter(|(k, _)| *k != name).map(|(k, v)| format!("{k} = {v}\n")).collect();
    text.push_str(&format!("{name} = {value}\n"));
    text
}

/// A TOML value, written as TOML, with the type it has.
#[derive(Debug, Clone)]
enum Toml {
    Int(i64),
    Str(String),
    Bool(bool),
    Float(f64),
    Strings(Vec<String>),
    Mixed,
    Table,
    Date,
}

impl Toml {
    fn text(&self) -> String {
        match self {
            Toml::Int(n) => n.to_string(),
            Toml::Str(s) => toml::Value::String(s.clone()).to_string(),
            Toml::Bool(b) => b.to_string(),
            Toml::Float(f) => toml::Value::Float(*f).to_string(),
            Toml::Strings(items) => {
                toml::Value::Array(items.iter().cloned().map(toml::Value::String).collect()).to_string()
            }
            Toml::Mixed => "[\"sh\", 1, true]".to_string(),
            Toml::Table => "{ a = 1 }".to_string(),
            Toml::Date => "1979-05-27T07:32:00Z".to_string(),
        }
    }

    /// Whether a value of this type can be right for `kind` (the range is checked apart).
    fn fits(&self, kind: Kind) -> bool {
        matches!(
            (kind, self),
            (Kind::Count { .. }, Toml::Int(_))
                | (Kind::Argv | Kind::HttpsUrl, Toml::Strings(_))
                | (
                    Kind::HttpsUrl | Kind::OtlpUrl | Kind::Path | Kind::Duration { .. } | Kind::Word(_) | Kind::Listen,
                    Toml::Str(_)
                )
                // A listening address may be a port alone, written as a number.
                | (Kind::Listen, Toml::Int(0..=65_535))
        )
    }
}

/// Strings a key's value may be: durations, words, URLs, paths, and garbage.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => "[0-9]{1,12}(ns|us|ms|s|m|h|d|w|y|day|days|year)",
        1 => "[0-9]{1,3}(h|m) [0-9]{1,3}(m|s)",
        1 => prop::sample::select(vec!["text", "json", "command", "noop", "full", "normal", "off", "", " 30s", "30s ", "-1s", "1.5s"])
            .prop_map(str::to_string),
        2 => "(https?|ftp)://[a-z.]{0,12}(:[0-9]{1,6})?(/[a-z]{0,4}){0,2}(\\?q|#f)?/?",
        1 => "/[a-z/._ -]{0,20}",
        1 => "\\[\"[a-z/]{0,8}\"(, *\"[a-z-]{0,5}\"){0,2}\\]",
        2 => any::<String>(),
    ]
}

fn toml_value() -> impl Strategy<Value = Toml> {
    prop_oneof![
        2 => prop_oneof![any::<i64>(), -5i64..2000, 16_777_200i64..16_777_300].prop_map(Toml::Int),
        4 => text().prop_map(Toml::Str),
        1 => any::<bool>().prop_map(Toml::Bool),
        1 => prop_oneof![any::<f64>().prop_filter("finite", |f| f.is_finite()), Just(1.0)].prop_map(Toml::Float),
        2 => prop::collection::vec(text(), 0..3).prop_map(Toml::Strings),
        1 => Just(Toml::Mixed),
        1 => Just(Toml::Table),
        1 => Just(Toml::Date),
    ]
}

/// A key: every real one, often; sometimes a near miss or an unknown name.
fn key_name() -> impl Strategy<Value = String> {
    let known: Vec<String> = KEYS.iter().map(|k| k.name.to_string()).collect();
    prop_oneof![
        6 => prop::sample::select(known.clone()),
        1 => prop::sample::select(known).prop_map(|k| format!("{k}s")),
        1 => "[a-z][a-z_]{0,15}",
    ]
}

/// Holds a refusal of key `key`: the typed error naming it.
fn names_key(err: &ConfigError, key: &Key) -> Result<(), TestCaseError> {
    match err {
        ConfigError::Invalid { field, message } => {
            prop_assert_eq!(*field, key.name, "{}", message);
            prop_assert!(err.to_string().starts_with(key.name), "{err}");
        }
        other => prop_assert!(false, "{}: expected the error naming the key, got {other:?}", key.name),
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    /// One key of a valid file set to any value: accepted, or refused naming that key; unknown
    /// keys are refused by name; a wrong type is always refused.
    #[test]
    fn fuzz_file_keys_are_checked_by_name(name in key_name(), value in toml_value()) {
        let file = file_with(&name, &value.text());
        let got = Layer::from_toml("node.toml", &file).and_then(NodeConfig::validate);
        let Some(key) = Key::find(&name) else {
            match got {
                Err(ConfigError::Parse { path, message }) => {
                    prop_assert_eq!(path, "node.toml");
                    prop_assert!(message.contains(&format!("unknown key {name:?}")), "{message}");
                }
                other => prop_assert!(false, "unknown key {name:?} gave {other:?}"),
            }
            return Ok(());
        };
        match &got {
            Ok(_) => prop_assert!(value.fits(key.kind), "{name} = {} was accepted", value.text()),
            Err(e) => names_key(e, key)?,
        }
        // Whole numbers and durations: accepted exactly within the documented range.
        match (key.kind, &value) {
            (Kind::Count { range: (min, max), .. }, Toml::Int(n)) => {
                let within = u64::try_from(*n).is_ok_and(|n| (min..=max).contains(&n));
                prop_assert_eq!(got.is_ok(), within, "{} = {}: {:?}", name, n, got.err());
            }
            (Kind::Duration { range: (min, max), .. }, Toml::Str(s)) => {
                if let Ok(d) = humantime::parse_duration(s.trim()) {
                    prop_assert_eq!(got.is_ok(), (min..=max).contains(&d), "{} = {:?}: {:?}", name, s, got.err());
                } else {
                    prop_assert!(got.is_err(), "{name} = {s:?} is no duration but was accepted");
                }
            }
            (Kind::Word(words), Toml::Str(s)) => {
                prop_assert_eq!(got.is_ok(), words.contains(&s.as_str()), "{} = {:?}", name, s);
            }
            _ => {}
        }
    }

    /// The same key as a flag or variable: accepted, or refused naming the key.
    #[test]
    fn fuzz_flag_and_env_text_is_checked_by_name(name in prop::sample::select(KEYS.iter().map(|k| k.name).collect::<Vec<_>>()), value in text()) {
        let key = Key::find(name).ok_or_else(|| TestCaseError::fail("a key"))?;
        let mut flags = Layer::default();
        if let Err(e) = flags.set(name, &value) {
            names_key(&e, key)?;
        }
        let env = Layer::from_env(|var| (var == key.env_var()).then(|| value.clone()));
        match env {
            Ok(layer) => {
                let file = Layer::from_toml("node.toml", &file_with("log_format", "\"text\"")).map_err(|e| TestCaseError::fail(e.to_string()))?;
                if let Err(e) = NodeConfig::resolve(file, layer, Layer::default()) {
                    names_key(&e, key)?;
                }
            }
            Err(e) => names_key(&e, key)?,
        }
    }

    /// Text that may not be TOML at all: no panic; a parse error names the file.
    #[test]
    fn fuzz_any_text_is_parsed_or_refused_naming_the_file(
        text in prop_oneof![any::<String>(), "([a-z_]{1,12} = (\"[^\"\\\\]{0,8}\"|[0-9]{1,4}|\\[\\]|true)\n){0,4}(\\[[a-z]{1,6}\\]\n)?"],
    ) {
        match Layer::from_toml("node.toml", &text) {
            Ok(layer) => {
                let _ = NodeConfig::validate(layer);
            }
            Err(ConfigError::Parse { path, .. }) => prop_assert_eq!(path, "node.toml"),
            Err(ConfigError::Invalid { field, .. }) => prop_assert!(Key::find(field).is_some(), "{field}"),
            Err(other) => prop_assert!(false, "{other:?}"),
        }
    }
}

/// A duration at each end of every key's range is accepted, one step outside is refused.
#[test]
fn duration_ranges_hold_at_their_ends() {
    for key in KEYS {
        if let Kind::Duration { range: (min, max), .. } = key.kind {
            for (d, ok) in [(min, true), (max, true), (max + Duration::from_millis(1), false)] {
                let value = format!("\"{}ms\"", d.as_millis());
                let got = Layer::from_toml("node.toml", &file_with(key.name, &value)).and_then(NodeConfig::validate);
                assert_eq!(got.is_ok(), ok, "{} = {value}: {:?}", key.name, got.err());
            }
        }
    }
}

/// README's example `node.toml` (the block that sets `hub_url`) is a configuration the node
/// takes: every key known, none twice, every value in range. A key added to the example by hand
/// (or twice, by a merge) fails here rather than on an operator's host.
#[test]
fn readme_node_example_is_a_valid_configuration() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let block = readme
        .split("```toml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.lines().any(|l| l.starts_with("hub_url")) && b.lines().any(|l| l.starts_with("command")))
        .expect("README has the node's example node.toml");
    let config = Layer::from_toml("README.md", block).and_then(NodeConfig::validate);
    assert!(config.is_ok(), "README's node.toml is refused: {:?}\n{block}", config.err());
}
