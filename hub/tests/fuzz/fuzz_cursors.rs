//! Property-based fuzzing of the operator's text inputs the hub parses: audit cursors
//! (`audit --after`), publish-scope patterns, and the stored names of fences, scopes, states,
//! outcomes and actors.
//!
//! What must hold: no panic; every cursor the hub prints reads back as itself; a parsed cursor
//! prints as what it read; a refusal names the flag; a scope pattern is accepted exactly when it
//! is a conversation name, `*`, or a name prefix ending in `*`, and covers exactly the names
//! the documentation says.
//!
//! Long run: `BATON_FUZZ_CASES=1000000 cargo test --release -p baton-hub --all-features --test fuzz -- fuzz_cursors::`.

use baton_hub::store::ActorKind;
use baton_hub::store::registry::audit::{AuditCursor, AuditSource};
use baton_hub::store::registry::fences::{FenceKind, FenceScope};
use baton_hub::store::registry::producers::{check_pattern, covers};
use baton_shared::ids::{NAME_CHARS_MAX, check_name};
use baton_shared::states::{DeliveryState, Outcome};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// See `shared/tests/suite/fuzz_ids.rs`: `default` cases unless `BATON_FUZZ_CASES` says otherwise.
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("BATON_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct("proptest-regressions/fuzz_cursors.txt"))),
        ..ProptestConfig::default()
    }
}

fn source() -> impl Strategy<Value = AuditSource> {
    prop_oneof![Just(AuditSource::Operator), Just(AuditSource::Delivery)]
}

/// Text shaped like a cursor, often damaged.
fn cursor_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "-?[0-9]{0,21}-[odx]?-[+-]?[0-9]{0,21}(-[0-9]{1,3})?",
        1 => "[ -~]{0,30}",
        1 => any::<String>(),
    ]
}

proptest! {
    #![proptest_config(config(1024))]

    /// Every cursor reads back as itself, whatever its id and time. Times are never negative:
    /// the hub's clock reads a time before 1970 as 0, so no audit row is written before it.
    #[test]
    fn fuzz_printed_cursors_read_back(at_ms in 0..=i64::MAX, source in source(), id in any::<i64>()) {
        let c = AuditCursor { at_ms, source, id };
        prop_assert_eq!(AuditCursor::parse(&c.to_string()), Ok(c));
    }

    /// Any text: a cursor that prints as a cursor reading back as the same, or a refusal that
    /// names `--after`.
    #[test]
    fn fuzz_cursor_text_is_read_or_refused(text in cursor_text()) {
        match AuditCursor::parse(&text) {
            Ok(c) => prop_assert_eq!(AuditCursor::parse(&c.to_string()), Ok(c)),
            Err(e) => prop_assert!(e.starts_with("--after "), "{e}"),
        }
    }

    /// Scope patterns: accepted iff `*`, a name, or a name prefix (shorter than a whole name)
    /// then `*`; an accepted one covers exactly the conversations the rule says.
    #[test]
    fn fuzz_scope_patterns_match_their_rule(
        pattern in prop_oneof!["[a-z][a-z0-9_-]{0,66}\\*?", "[a-z*]{0,3}\\*", "[ -~]{0,10}", any::<String>()],
        conversation in "[a-z][a-z0-9_-]{0,8}",
    ) {
        let expected = match pattern.strip_suffix('*') {
            Some("") => true,
            Some(prefix) => !prefix.contains('*') && prefix.chars().count() < NAME_CHARS_MAX && check_name("p", prefix).is_ok(),
            None => check_name("p", &pattern).is_ok(),
        };
        let got = check_pattern(&pattern);
        prop_assert_eq!(got.is_ok(), expected, "{:?}: {:?}", pattern, got);
        if let Err(e) = got {
            prop_assert!(e.starts_with("conversation pattern "), "{e}");
        } else {
            let want = match pattern.strip_suffix('*') {
                Some(prefix) => conversation.starts_with(prefix),
                None => conversation == pattern,
            };
            prop_assert_eq!(covers(&pattern, &conversation), want);
            prop_assert!(covers(&pattern, pattern.trim_end_matches('*')) || pattern.ends_with('*'));
        }
    }

    /// Stored names parse back from exactly their own strings.
    #[test]
    fn fuzz_stored_names_parse_only_themselves(s in prop_oneof!["[a-z_]{0,12}", any::<String>()]) {
        if let Some(k) = FenceKind::parse(&s) { prop_assert_eq!(k.as_str(), s.as_str()); }
        if let Some(k) = FenceScope::parse(&s) { prop_assert_eq!(k.as_str(), s.as_str()); }
        if let Some(k) = ActorKind::parse(&s) { prop_assert_eq!(k.as_str(), s.as_str()); }
        if let Some(k) = DeliveryState::parse(&s) { prop_assert_eq!(k.as_str(), s.as_str()); }
        if let Some(k) = Outcome::parse(&s) { prop_assert_eq!(k.as_str(), s.as_str()); }
    }
}
