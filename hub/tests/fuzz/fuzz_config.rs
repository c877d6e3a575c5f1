//! Property-based fuzzing of the hub's configuration file (`hub.toml`, its `[limits]` table).
//!
//! What must hold: no panic; an unknown key, at the top or in a table, is refused by name; a
//! value of the wrong type is refused naming its key; whole numbers and durations are accepted
//! only within their documented range, and any refusal names the key that was set.
//!
//! Long run: `BATON_FUZZ_CASES=1000000 cargo test --release -p baton-hub --all-features --test fuzz -- fuzz_config::`.

use baton_hub::config::{HubConfig, KEYS, Key, KeyKind};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// See `shared/tests/suite/fuzz_ids.rs`: `default` cases unless `BATON_FUZZ_CASES` says otherwise.
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("BATON_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct("proptest-regressions/fuzz_config.txt"))),
        ..ProptestConfig::default()
    }
}

/// A TOML value, written as TOML, with the type it has.
#[derive(Debug, Clone)]
enum Toml {
    Int(i64),
    Str(String),
    Bool(bool),
    Float(f64),
    Array,
    Table,
}

impl Toml {
    fn text(&self) -> String {
        match self {
            Toml::Int(n) => n.to_string(),
            Toml::Str(s) => toml::Value::String(s.clone()).to_string(),
            Toml::Bool(b) => b.to_string(),
            Toml::Float(f) => toml::Value::Float(*f).to_string(),
            Toml::Array => "[\"30s\"]".to_string(),
            Toml::Table => "{ a = 1 }".to_string(),
        }
    }

    /// Whether a value of this type can be right for `kind` (the range is checked apart).
    fn fits(&self, kind: KeyKind) -> bool {
        matches!((kind, self), (KeyKind::Int { .. }, Toml::Int(_)))
            || (!matches!(kind, KeyKind::Int { .. }) && matches!(self, Toml::Str(_)))
            // A list of names may also be written as an array of strings.
            || matches!((kind, self), (KeyKind::Names, Toml::Array))
    }
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[0-9]{1,12}(ns|ms|s|m|h|d|w|y|days)",
        1 => prop::sample::select(vec!["full", "normal", "text", "json", "off", "", "0s", "127.0.0.1:0", "[::1]:7443", "0.0.0.0:99999", "localhost:7443"])
            .prop_map(str::to_string),
        1 => "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}:[0-9]{1,6}",
        1 => "[0-9]{1,20}",
        2 => any::<String>(),
    ]
}

fn toml_value() -> impl Strategy<Value = Toml> {
    prop_oneof![
        3 => prop_oneof![any::<i64>(), -2i64..300_000, 4_294_967_200i64..4_294_967_400].prop_map(Toml::Int),
        4 => text().prop_map(Toml::Str),
        1 => any::<bool>().prop_map(Toml::Bool),
        1 => any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Toml::Float),
        1 => Just(Toml::Array),
        1 => Just(Toml::Table),
    ]
}

/// A file setting one key, in its table when it has one.
fn file(section: Option<&str>, name: &str, value: &str) -> String {
    match section {
        Some(s) => format!("[{s}]\n{name} = {value}\n"),
        None => format!("{name} = {value}\n"),
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// One key set to any value: accepted, or refused with a message naming the key; wrong
    /// types always refused; numbers, durations and words accepted exactly within their range
    /// (a number or duration in range may still be refused by a rule tying two keys, which
    /// names both).
    #[test]
    fn fuzz_each_key_is_checked_by_name(key in prop::sample::select(KEYS.to_vec()), value in toml_value()) {
        let key: &Key = key;
        let field = key.name.field();
        let got = HubConfig::from_toml(&file(key.name.section, key.name.name, &value.text()));
        match &got {
            Ok(_) => prop_assert!(value.fits(key.kind), "{field} = {} was accepted", value.text()),
            Err(e) => prop_assert!(e.contains(&field), "{field} = {}: {e}", value.text()),
        }
        match (key.kind, &value) {
            (KeyKind::Int { min, max, .. }, Toml::Int(n)) if !u64::try_from(*n).is_ok_and(|n| (min..=max).contains(&n)) => {
                prop_assert!(got.is_err(), "{field} = {n} is outside {min}..={max} but was accepted");
            }
            (KeyKind::Duration { min, max, .. }, Toml::Str(s)) => match baton_shared::duration::parse("f", s) {
                Ok(d) if !(min..=max).contains(&d) => prop_assert!(got.is_err(), "{field} = {s:?} is out of range"),
                Err(_) => prop_assert!(got.is_err(), "{field} = {s:?} is no duration"),
                Ok(_) => {}
            },
            (KeyKind::Choice { allowed, .. }, Toml::Str(s)) => {
                prop_assert_eq!(got.is_ok(), allowed.contains(&s.as_str()), "{} = {:?}", field, s);
            }
            _ => {}
        }
    }

    /// A key no declaration names, at the top or in a key's table, is refused by its name.
    #[test]
    fn fuzz_unknown_keys_are_refused_by_name(
        name in "[a-z][a-z0-9_]{0,20}",
        section in prop::option::of(prop::sample::select(vec!["limits", "tls", "server"])),
        value in toml_value(),
    ) {
        let known = KEYS.iter().any(|k| k.name.section == section && k.name.name == name)
            || (section.is_none() && KEYS.iter().any(|k| k.name.section == Some(name.as_str())));
        prop_assume!(!known);
        let got = HubConfig::from_toml(&file(section, &name, &value.text()));
        let shown = match section {
            Some(s) if KEYS.iter().any(|k| k.name.section == Some(s)) => format!("unknown key {s}.{name}"),
            Some(s) => format!("unknown key {s}"),
            None => format!("unknown key {name}"),
        };
        match got {
            Err(e) => prop_assert!(e.contains(&shown), "{e} should say {shown}"),
            Ok(_) => prop_assert!(false, "{shown} was accepted"),
        }
    }

    /// Text that may not be TOML at all: no panic, and an answer either way.
    #[test]
    fn fuzz_any_text_is_parsed_or_refused(
        text in prop_oneof![any::<String>(), "(\\[limits\\]\n)?([a-z_]{1,24} = (\"[^\"\\\\]{0,8}\"|-?[0-9]{1,20}|true|\\[\\])\n){0,4}"],
    ) {
        if let Err(e) = HubConfig::from_toml(&text) {
            prop_assert!(!e.is_empty());
        }
    }
}
