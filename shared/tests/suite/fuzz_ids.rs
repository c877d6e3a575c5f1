//! Property-based fuzzing of the identifier grammar, roles, error codes, payload text and human
//! durations: every input a request or a configuration can carry.
//!
//! Each property says what must hold, not only that nothing panics: an identifier is accepted
//! exactly when it matches its documented pattern and length, a refusal is the typed error that
//! names the field, and an accepted payload keeps its exact text.
//!
//! Short run (the default, part of `cargo test`): a few hundred cases per property. Long run:
//! `BATON_FUZZ_CASES=1000000 cargo test --release -p baton-shared --all-features --test suite fuzz_ids`.
//! A failure is saved under `proptest-regressions/` and replayed first on every later run.

use baton_shared::duration;
use baton_shared::error::ErrorCode;
use baton_shared::ids::{
    INSTANCE_ID_CHARS_MAX, IdError, KEY_CHARS_MAX, NAME_CHARS_MAX, Role, check_key, check_name, check_token,
};
use baton_shared::wire::{Payload, SubmitRequest};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// The property runner's settings: `default` cases unless `BATON_FUZZ_CASES` says otherwise,
/// failures saved beside the crate so they are replayed as regression cases.
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("BATON_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct("proptest-regressions/fuzz_ids.txt"))),
        ..ProptestConfig::default()
    }
}

/// Characters an attacker reaches for: separators, traversal, NUL and controls, percent
/// escapes, SQL meta-characters, uppercase, non-ASCII look-alikes (Cyrillic `а`, fullwidth `ａ`),
/// combining marks and astral characters.
const HOSTILE: &[char] = &[
    '/', '\\', '.', ' ', '\0', '\n', '\t', '%', '\'', '"', ';', '*', '?', '#', '&', '=', '+', ',', '@', '$', 'A', 'Z',
    'é', 'а', 'ａ', '\u{301}', '\u{200b}', '😀', '\u{7f}', '_', '-', ':', '0', '9', 'a', 'z',
];

/// Strings near `valid`: the valid pattern with hostile characters spliced in, plus anything at
/// all, plus long runs around the length bounds.
fn near(valid: &'static str) -> impl Strategy<Value = String> {
    let spliced = (valid, prop::collection::vec((any::<prop::sample::Index>(), prop::sample::select(HOSTILE)), 0..3))
        .prop_map(|(s, edits)| {
            let mut chars: Vec<char> = s.chars().collect();
            for (at, c) in edits {
                let i = at.index(chars.len() + 1);
                chars.insert(i, c);
            }
            chars.into_iter().collect::<String>()
        });
    let long = (prop::sample::select(HOSTILE), 60usize..140).prop_map(|(c, n)| c.to_string().repeat(n));
    prop_oneof![4 => spliced, 2 => any::<String>(), 1 => long, 1 => valid]
}

/// The documented grammar of a name, `^[a-z][a-z0-9_-]*$` and 1..=64 characters, written out
/// independently of the code under test.
fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= NAME_CHARS_MAX
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'))
}

/// `[A-Za-z0-9._:-]{1,128}`.
fn is_key(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=KEY_CHARS_MAX).contains(&b.len())
        && b.iter().all(|c| matches!(c, b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' | b':' | b'-'))
}

/// `[A-Za-z0-9-]{1,64}`.
fn is_token(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=INSTANCE_ID_CHARS_MAX).contains(&b.len())
        && b.iter().all(|c| matches!(c, b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-'))
}

/// Holds one checker to its grammar on `input`: accepted iff `expected`, and a refusal is the
/// variant that says why, naming the field, with a bounded printable prefix of the value.
fn holds(
    check: fn(&'static str, &str) -> Result<(), IdError>,
    field: &'static str,
    input: &str,
    expected: bool,
    max: usize,
) -> Result<(), TestCaseError> {
    match check(field, input) {
        Ok(()) => prop_assert!(expected, "{field}: {input:?} was accepted but does not match the grammar"),
        Err(e) => {
            prop_assert!(!expected, "{field}: {input:?} matches the grammar but was refused: {e}");
            prop_assert_eq!(e.field(), field);
            prop_assert!(e.to_string().starts_with(field), "{e}");
            let len = input.chars().count();
            match e {
                IdError::Empty { .. } => prop_assert_eq!(len, 0),
                IdError::TooLong { len: seen, max: bound, .. } => {
                    prop_assert_eq!(seen, len);
                    prop_assert_eq!(bound, max);
                    prop_assert!(len > max);
                }
                IdError::Grammar { value, .. } => {
                    prop_assert!((1..=max).contains(&len));
                    prop_assert!(value.chars().count() <= 80);
                    prop_assert!(input.starts_with(&value));
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    /// Host, conversation and producer names: accepted iff `^[a-z][a-z0-9_-]*$`, 1..=64.
    #[test]
    fn fuzz_names_are_accepted_iff_they_match_the_grammar(s in near("[a-z][a-z0-9_-]{0,70}")) {
        holds(check_name, "conversation", &s, is_name(&s), NAME_CHARS_MAX)?;
    }

    /// Idempotency keys and report ids: accepted iff `[A-Za-z0-9._:-]{1,128}`.
    #[test]
    fn fuzz_keys_are_accepted_iff_they_match_the_grammar(s in near("[A-Za-z0-9._:-]{0,135}")) {
        holds(check_key, "idempotency_key", &s, is_key(&s), KEY_CHARS_MAX)?;
    }

    /// Instance ids and claim tokens: accepted iff `[A-Za-z0-9-]{1,64}`.
    #[test]
    fn fuzz_tokens_are_accepted_iff_they_match_the_grammar(s in near("[A-Za-z0-9-]{0,70}")) {
        holds(check_token, "instance_id", &s, is_token(&s), INSTANCE_ID_CHARS_MAX)?;
    }

    /// Roles and error codes parse back from exactly their own strings.
    #[test]
    fn fuzz_roles_and_codes_parse_only_their_own_names(s in near("[a-z_]{1,22}")) {
        let role = Role::parse(&s);
        prop_assert_eq!(role.is_some(), s == "node" || s == "producer");
        if let Some(r) = role {
            prop_assert_eq!(r.as_str(), s.as_str());
        }
        match ErrorCode::parse(&s) {
            Some(code) => {
                prop_assert_eq!(code.as_str(), s.as_str());
                prop_assert!((400..600).contains(&code.status()));
            }
            None => prop_assert!(ErrorCode::ALL.iter().all(|c| c.as_str() != s)),
        }
    }

    /// A human duration either parses or is refused with a message naming the field; a whole
    /// number of milliseconds reads back as itself.
    #[test]
    fn fuzz_durations_parse_or_name_the_field(s in near("[0-9]{1,6}(ms|s|m|h|d| ?[0-9]{1,3}s)?"), ms in any::<u32>()) {
        if let Err(e) = duration::parse("limits.claim_wait", &s) {
            prop_assert!(e.starts_with("limits.claim_wait: "), "{e}");
        }
        let d = std::time::Duration::from_millis(u64::from(ms));
        prop_assert_eq!(duration::parse("f", &format!("{ms}ms")), Ok(d));
        prop_assert!(!duration::human(d).is_empty());
    }

    /// A payload is kept as the exact text sent, inside a request body and alone; text that is
    /// not one JSON value is refused.
    #[test]
    fn fuzz_payload_text_is_kept_exactly(text in json_text(), junk in any::<String>()) {
        let body = format!(r#"{{"conversation":"c","idempotency_key":"k","payload":{text}}}"#);
        let req: SubmitRequest = serde_json::from_str(&body).map_err(|e| TestCaseError::fail(format!("{e}: {body}")))?;
        prop_assert_eq!(req.payload.as_str(), text.as_str());
        let again = serde_json::to_string(&req).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(again.contains(&format!("\"payload\":{text}")), "{again}");
        let alone = Payload::from_text(text.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(alone.as_str(), text.as_str());
        let valid = serde_json::from_str::<serde::de::IgnoredAny>(&junk).is_ok();
        prop_assert_eq!(Payload::from_text(junk.clone()).is_ok(), valid, "{:?}", junk);
    }
}

/// JSON text of any shape: numbers beyond 64 bits and long decimals written as they come,
/// strings with escapes and astral characters, whitespace inside, nesting a few levels deep.
fn json_text() -> impl Strategy<Value = String> {
    let number = "-?(0|[1-9][0-9]{0,40})(\\.[0-9]{1,30})?([eE][+-]?[0-9]{1,3})?";
    let string = prop::collection::vec(
        prop_oneof![
            "[a-zA-Z0-9 ]".prop_map(|s| s),
            Just("\\n".to_string()),
            Just("\\u00e9".to_string()),
            Just("\\u00E9".to_string()),
            Just("\\ud83d\\ude00".to_string()),
            Just("\\u0000".to_string()),
            Just("\\uffff".to_string()),
            Just("\\ud800".to_string()),
            Just("\\\"".to_string()),
            Just("\\/".to_string()),
            Just("é😀\u{ffff}".to_string()),
        ],
        0..6,
    )
    .prop_map(|parts| format!("\"{}\"", parts.concat()));
    let leaf = prop_oneof![
        number.prop_map(|s| s),
        string.clone(),
        Just("true".to_string()),
        Just("false".to_string()),
        Just("null".to_string()),
    ];
    leaf.prop_recursive(6, 48, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("[ {} ]", items.join(" ,"))),
            prop::collection::vec((string.clone(), inner), 0..4).prop_map(|members| {
                let members: Vec<String> = members.into_iter().map(|(k, v)| format!("{k} : {v}")).collect();
                format!("{{\n{}}}", members.join(",\t"))
            }),
        ]
    })
}
