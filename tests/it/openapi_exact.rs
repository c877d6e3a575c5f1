//! `docs/openapi.json` held to the validation code, not only to the router: the bounds it
//! states are the constants in `baton_shared`, every error code it lists is sent with the status
//! it is listed under, and, against a real hub, every stated constraint is enforced exactly.
//!
//! The schema-driven check walks each operation's parameters and body schema and, from the
//! document alone, makes requests that break one constraint each (too long, too short, a
//! pattern broken, a number out of range or of the wrong type, a required field missing, a
//! null where none is allowed, an unknown property, too many or too few items, a payload over
//! its byte or depth bound): the hub must refuse each with a status the document lists for
//! that operation (400 or 413) and a code listed under it, naming the field when a value was at
//! fault. Requests at each boundary the document accepts must not be refused as invalid. Every
//! answer, refusal or not, must have a status and an error code the document lists.
//!
//! Batch items are checked by their single endpoint's code after the batch is parsed: a shape
//! error refuses the batch whole, a value error is answered in the item's own result; both are
//! what the document says.

use crate::harness::Hub;
use baton_shared::error::ErrorCode;
use baton_shared::ids::{INSTANCE_ID_CHARS_MAX, KEY_CHARS_MAX, NAME_CHARS_MAX};
use baton_shared::limits::{
    BATCH_BYTES_MAX, BATCH_ITEMS_MAX, CLAIM_BATCH_MAX_DEFAULT, PAYLOAD_BYTES_MAX_DEFAULT, PAYLOAD_DEPTH_MAX,
    REASON_CHARS_MAX, RECIPIENTS_MAX_DEFAULT, RESULT_BYTES_MAX_DEFAULT, STDERR_TAIL_BYTES_MAX_DEFAULT,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;

const OPENAPI: &str = include_str!("../../docs/openapi.json");

fn doc() -> Value {
    serde_json::from_str(OPENAPI).expect("docs/openapi.json is JSON")
}

/// Follows a `$ref` (local only).
fn resolve<'a>(doc: &'a Value, s: &'a Value) -> &'a Value {
    match s.get("$ref").and_then(Value::as_str) {
        Some(r) => doc.pointer(r.trim_start_matches('#')).unwrap_or_else(|| panic!("dangling $ref {r}")),
        None => s,
    }
}

/// Every schema in the document (parameters', bodies', components'), each with where it is.
fn all_schemas(doc: &Value) -> Vec<(String, Value)> {
    fn walk(v: &Value, at: &str, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) => {
                if m.contains_key("type") || m.contains_key("pattern") || m.contains_key("x-baton-limit") {
                    out.push((at.to_string(), v.clone()));
                }
                for (k, x) in m {
                    walk(x, &format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    walk(x, &format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(doc, "", &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// The document's patterns: the small subset of regular expressions it uses, matched here so
// that a refused value is known to break the pattern and an accepted one to keep it.

/// One element of a pattern: a set of characters and how many times it repeats.
struct Atom {
    chars: Vec<(char, char)>,
    min: usize,
    max: usize,
}

fn parse_pattern(p: &str) -> Vec<Atom> {
    let body = p
        .strip_prefix('^')
        .and_then(|p| p.strip_suffix('$'))
        .unwrap_or_else(|| panic!("pattern {p:?} is not anchored: teach this test its grammar"));
    let chars: Vec<char> = body.chars().collect();
    let mut i = 0;
    let mut atoms = Vec::new();
    while i < chars.len() {
        let mut set = Vec::new();
        if chars[i] == '[' {
            i += 1;
            while chars[i] != ']' {
                let c = chars[i];
                if i + 2 < chars.len() && chars[i + 1] == '-' && chars[i + 2] != ']' {
                    set.push((c, chars[i + 2]));
                    i += 3;
                } else {
                    set.push((c, c));
                    i += 1;
                }
            }
            i += 1;
        } else {
            assert!(chars[i].is_alphanumeric() || chars[i] == '-', "pattern {p:?}: unknown syntax at {i}");
            set.push((chars[i], chars[i]));
            i += 1;
        }
        let (min, max, used) = match chars.get(i) {
            Some('*') => (0, usize::MAX, 1),
            Some('+') => (1, usize::MAX, 1),
            Some('{') => {
                let end = chars[i..].iter().position(|c| *c == '}').expect("closed quantifier") + i;
                let n: usize = chars[i + 1..end].iter().collect::<String>().parse().expect("a count");
                (n, n, end + 1 - i)
            }
            _ => (1, 1, 0),
        };
        i += used;
        atoms.push(Atom { chars: set, min, max });
    }
    atoms
}

/// Whether `s` matches the document's `pattern` (ECMA-262, the subset the document uses).
/// The `traceparent` the base submissions carry.
const BASE_TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The pattern of a W3C `traceparent` (the `traceparent` header, and the field that shows it).
const TRACEPARENT_PATTERN: &str = "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$";

fn matches(pattern: &str, s: &str) -> bool {
    if pattern == r"\S" {
        return s.chars().any(|c| !c.is_whitespace());
    }
    fn go(atoms: &[Atom], s: &[char]) -> bool {
        let Some((a, rest)) = atoms.split_first() else { return s.is_empty() };
        let ok = |c: char| a.chars.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c));
        let most = s.iter().take(a.max).take_while(|c| ok(**c)).count();
        (a.min..=most).rev().any(|n| go(rest, &s[n..]))
    }
    let s: Vec<char> = s.chars().collect();
    go(&parse_pattern(pattern), &s)
}

#[test]
fn the_pattern_matcher_reads_the_document_s_patterns() {
    assert!(matches("^[a-z][a-z0-9_-]*$", "host-1_b"));
    assert!(!matches("^[a-z][a-z0-9_-]*$", "1host"));
    assert!(!matches("^[a-z][a-z0-9_-]*$", "Host"));
    assert!(matches("^[A-Za-z0-9._:-]+$", "Order:42.v1-x_y"));
    assert!(!matches("^[A-Za-z0-9._:-]+$", "a b"));
    let uuid = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$";
    assert!(matches(uuid, &uuid::Uuid::now_v7().to_string()));
    assert!(!matches(uuid, &uuid::Uuid::now_v7().simple().to_string()));
    assert!(!matches(uuid, &uuid::Uuid::now_v7().to_string().to_uppercase()));
    assert!(matches(r"\S", " x "));
    assert!(!matches(r"\S", "  \t"));
}

// ---------------------------------------------------------------------------------------------
// Constants

/// The bounds the document states are the constants the code enforces, and every error code it
/// lists is one the code has, under the status the code sends it with.
#[test]
fn documented_bounds_and_codes_are_the_code_s() {
    // What `baton_shared::traceparent::TraceParent::parse` reads as version 00.
    assert!(
        baton_shared::traceparent::TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .is_ok()
    );
    let doc = doc();
    let by_pattern: BTreeMap<&str, usize> = [
        ("^[a-z][a-z0-9_-]*$", NAME_CHARS_MAX),
        ("^[A-Za-z0-9._:-]+$", KEY_CHARS_MAX),
        ("^[A-Za-z0-9-]+$", INSTANCE_ID_CHARS_MAX),
        (r"\S", REASON_CHARS_MAX),
    ]
    .into();
    let by_limit: BTreeMap<&str, (&str, u64)> = [
        ("limits.payload_bytes_max", ("x-baton-max-bytes", PAYLOAD_BYTES_MAX_DEFAULT)),
        ("limits.result_bytes_max", ("x-baton-max-bytes", RESULT_BYTES_MAX_DEFAULT)),
        ("limits.stderr_tail_bytes_max", ("x-baton-kept-bytes", STDERR_TAIL_BYTES_MAX_DEFAULT)),
        ("limits.recipients_max", ("maxItems", u64::from(RECIPIENTS_MAX_DEFAULT))),
        ("limits.claim_batch_max", ("maxItems", u64::from(CLAIM_BATCH_MAX_DEFAULT))),
    ]
    .into();
    let mut seen_limits = std::collections::BTreeSet::new();
    let schemas = all_schemas(&doc);
    for (at, s) in &schemas {
        if let Some(p) = s.get("pattern").and_then(Value::as_str)
            && let Some(max) = by_pattern.get(p)
        {
            assert_eq!(s["maxLength"].as_u64(), Some(*max as u64), "{at}: maxLength of pattern {p}");
            assert_eq!(s["minLength"].as_u64(), Some(1), "{at}: minLength of pattern {p}");
        } else if let Some(p) = s.get("pattern").and_then(Value::as_str) {
            assert!(
                p.contains("{8}-") || p == TRACEPARENT_PATTERN,
                "{at}: pattern {p} is neither an identifier's, an id's nor a traceparent's"
            );
            assert!(s.get("maxLength").is_none(), "{at}: an id's length is its pattern's");
        }
        if at.contains("Request/properties/reason") || at.contains("Item/properties/reason") {
            assert_eq!(s["maxLength"].as_u64(), Some(REASON_CHARS_MAX as u64), "{at}");
        }
        if let Some(limit) = s.get("x-baton-limit").and_then(Value::as_str)
            && let Some((key, value)) = by_limit.get(limit)
        {
            assert_eq!(s[*key].as_u64(), Some(*value), "{at}: {key} is the default of {limit}");
            seen_limits.insert(limit);
        }
        if let Some(bytes) = s.get("x-baton-max-bytes-body") {
            assert_eq!(bytes.as_u64(), Some(BATCH_BYTES_MAX), "{at}");
            assert_eq!(s["maxItems"].as_u64(), Some(BATCH_ITEMS_MAX as u64), "{at}: maxItems is BATCH_ITEMS_MAX");
            assert_eq!(s["minItems"].as_u64(), Some(1), "{at}");
        }
        if let Some(depth) = s.get("x-baton-max-depth") {
            assert_eq!(depth.as_u64(), Some(PAYLOAD_DEPTH_MAX as u64), "{at}");
        }
    }
    assert_eq!(seen_limits.len(), by_limit.len(), "every shared limit is stated somewhere");
    // The error codes: the document's list is the code's, and each is listed under its status.
    let all: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    let listed: Vec<&str> = doc["components"]["schemas"]["Error"]["properties"]["code"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(listed, all);
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            if let Some((statuses, codes)) = item_errors(&doc, op) {
                let sent: std::collections::BTreeSet<u64> =
                    codes.iter().map(|c| u64::from(ErrorCode::parse(c).expect("a code").status())).collect();
                assert_eq!(sent, statuses.into_iter().collect(), "{method} {path}: item statuses are their codes'");
            }
            for (status, r) in op["responses"].as_object().unwrap() {
                for code in response_codes(r) {
                    let c = ErrorCode::parse(&code).unwrap_or_else(|| panic!("{method} {path} {status}: {code}"));
                    assert_eq!(c.status().to_string(), *status, "{method} {path}: {code} is sent with {}", c.status());
                }
            }
        }
    }
}

/// Whether the wire type a request schema is named after reads `v`.
fn reads(name: &str, v: &Value) -> bool {
    use baton_shared::wire::*;
    fn ok<T: serde::de::DeserializeOwned>(v: &Value) -> bool {
        serde_json::from_value::<T>(v.clone()).is_ok()
    }
    match name {
        "SubmitRequest" => ok::<SubmitRequest>(v),
        "ClaimRequest" => ok::<ClaimRequest>(v),
        "HolderRequest" => ok::<HolderRequest>(v),
        "RejectRequest" => ok::<RejectRequest>(v),
        "ReportRequest" => ok::<ReportRequest>(v),
        "SessionRequest" => ok::<SessionRequest>(v),
        "SessionEndRequest" => ok::<SessionEndRequest>(v),
        "StartItem" => ok::<StartItem>(v),
        "StartRequest" => ok::<StartRequest>(v),
        "CancelRequest" => ok::<CancelRequest>(v),
        "ApprovalRequest" => ok::<ApprovalRequest>(v),
        "BatchSubmitRequest" => ok::<BatchSubmitRequest>(v),
        "HolderItem" => ok::<HolderItem>(v),
        "BatchHolderRequest" => ok::<BatchHolderRequest>(v),
        "RejectItem" => ok::<RejectItem>(v),
        "BatchRejectRequest" => ok::<BatchRejectRequest>(v),
        "BatchReportRequest" => ok::<BatchReportRequest>(v),
        "RunningRequest" => ok::<RunningRequest>(v),
        "RunningTurnItem" => ok::<RunningTurnItem>(v),
        "ProgressItem" => ok::<ProgressItem>(v),
        other => panic!("request schema {other} has no wire type here: add it"),
    }
}

/// The smallest value of a schema: only its required properties, each at its smallest.
fn smallest(doc: &Value, s: &Value) -> Value {
    let s = resolve(doc, s);
    if let Some(e) = s.get("enum").and_then(|e| e.get(0)) {
        return e.clone();
    }
    let t = match &s["type"] {
        Value::Array(a) => a[0].as_str().unwrap_or(""),
        t => t.as_str().unwrap_or(""),
    };
    match t {
        "string" => json!("a"),
        "integer" => s.get("minimum").cloned().unwrap_or(json!(1)),
        "array" => json!([]),
        "object" => {
            let mut o = serde_json::Map::new();
            for r in s["required"].as_array().into_iter().flatten() {
                let r = r.as_str().unwrap();
                o.insert(r.to_string(), smallest(doc, &s["properties"][r]));
            }
            Value::Object(o)
        }
        _ => json!(1),
    }
}

/// Each request schema's `required`, nullable types and `additionalProperties` are what its
/// serde type reads: the required fields alone are read; without any one of them, or with an
/// unknown field, it is not; a field whose type includes null reads null.
#[test]
fn request_schemas_are_what_serde_reads() {
    let doc = doc();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut checked = 0;
    for (name, s) in schemas.iter().filter(|(n, _)| n.ends_with("Request") || n.ends_with("Item")) {
        let least = smallest(&doc, s);
        assert!(reads(name, &least), "{name} reads its required fields alone: {least}");
        for r in s["required"].as_array().into_iter().flatten() {
            let mut v = least.clone();
            v.as_object_mut().unwrap().remove(r.as_str().unwrap());
            assert!(!reads(name, &v), "{name} does not read without {r}");
        }
        for (p, ps) in s["properties"].as_object().unwrap() {
            let nullable = ps["type"].as_array().is_some_and(|t| t.contains(&json!("null")));
            let mut v = least.clone();
            v[p] = Value::Null;
            let typed = ps.get("type").is_some() || ps.get("$ref").is_some();
            if typed {
                assert_eq!(reads(name, &v), nullable, "{name}.{p}: null is read exactly when the type includes null");
            }
        }
        assert_eq!(s["additionalProperties"], json!(false), "{name} refuses unknown fields");
        let mut v = least.clone();
        v["zz_unknown"] = json!(1);
        assert!(!reads(name, &v), "{name} refuses an unknown field");
        checked += 1;
    }
    assert_eq!(checked, 20);
}

/// The error codes a response lists (none for a success).
fn response_codes(r: &Value) -> Vec<String> {
    r.pointer("/content/application~1json/schema/properties/code/enum")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|c| c.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Requests generated from the document

/// Where a generated value goes.
#[derive(Debug, Clone)]
enum Loc {
    Path(String),
    Query(String),
    Header(String),
    /// A JSON pointer's segments into the body.
    Body(Vec<String>),
}

/// What a case does at its place: set raw JSON text (numbers of any size), or remove.
#[derive(Debug, Clone)]
enum Change {
    Set(String),
    Remove,
}

/// What the document says of a case.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Breaks a constraint: refused, and when `names_field`, the message names the field.
    Refused { names_field: bool },
    /// At a boundary the document accepts.
    Accepted,
}

#[derive(Debug, Clone)]
struct Case {
    what: String,
    loc: Loc,
    change: Change,
    expect: Expect,
}

/// One request: the operation's method and path template, and its parts.
#[derive(Debug, Clone)]
struct Call {
    caller: &'static str,
    path: BTreeMap<String, String>,
    query: BTreeMap<String, String>,
    headers: BTreeMap<String, String>,
    body: Option<Value>,
}

fn json_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// A string of `n` characters that keeps `pattern` (when the base value does).
fn filled(pattern: Option<&str>, n: usize) -> String {
    let s = "a".repeat(n);
    if let Some(p) = pattern {
        assert!(n == 0 || matches(p, &s), "{p} refuses {s:?}");
    }
    s
}

/// Nested arrays `depth` levels deep.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// The cases one schema yields at `loc`, given the base value there.
fn cases_for(doc: &Value, s: &Value, loc: &Loc, base: Option<&Value>, required: bool, out: &mut Vec<Case>) {
    let s = resolve(doc, s);
    let mut push = |what: String, change: Change, expect: Expect| {
        out.push(Case { what, loc: loc.clone(), change, expect });
    };
    let is_body = matches!(loc, Loc::Body(_));
    let types: Vec<&str> = match &s["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if required {
        push("missing".into(), Change::Remove, Expect::Refused { names_field: false });
    }
    if is_body && !types.is_empty() && !types.contains(&"null") {
        push("null".into(), Change::Set("null".into()), Expect::Refused { names_field: false });
    }
    if is_body && types.contains(&"null") {
        push("null".into(), Change::Set("null".into()), Expect::Accepted);
    }
    let refused = Expect::Refused { names_field: true };
    if types.contains(&"string") {
        let pattern = s.get("pattern").and_then(Value::as_str);
        if is_body {
            push("a number for a string".into(), Change::Set("7".into()), Expect::Refused { names_field: false });
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64) {
            let max = max as usize;
            push(format!("{max} characters"), Change::Set(json_str(&filled(pattern, max))), Expect::Accepted);
            push(format!("{} characters", max + 1), Change::Set(json_str(&filled(pattern, max + 1))), refused);
        }
        // An empty path parameter is another path, not this operation with a bad value.
        if let Some(min) = s.get("minLength").and_then(Value::as_u64).filter(|_| !matches!(loc, Loc::Path(_))) {
            let min = min as usize;
            push(format!("{} characters", min - 1), Change::Set(json_str(&filled(None, min - 1))), refused);
        }
        if let Some(bytes) = s.get("x-baton-max-bytes").and_then(Value::as_u64) {
            let n = bytes as usize;
            push(format!("{n} bytes"), Change::Set(json_str(&"a".repeat(n))), Expect::Accepted);
            push(format!("{} bytes", n + 1), Change::Set(json_str(&"a".repeat(n + 1))), refused);
        }
        // A bound the hub keeps to by cutting, never by refusing.
        if let Some(bytes) = s.get("x-baton-kept-bytes").and_then(Value::as_u64) {
            let n = bytes as usize;
            push(format!("{n} bytes"), Change::Set(json_str(&"a".repeat(n))), Expect::Accepted);
            push(format!("{} bytes, cut", n + 1), Change::Set(json_str(&"a".repeat(n + 1))), Expect::Accepted);
        }
        if let Some(p) = pattern {
            let base = base.and_then(Value::as_str).expect("a base value for a pattern");
            assert!(matches(p, base), "the base value {base:?} keeps {p}");
            let bad = if p == r"\S" {
                " ".repeat(base.chars().count().max(1))
            } else {
                [' ', 'A', '1', '/', 'é', '_', '.', 'G', '{']
                    .iter()
                    .map(|c| format!("{c}{}", base.chars().skip(1).collect::<String>()))
                    .chain(std::iter::once(format!("{base} x")))
                    .find(|b| !matches(p, b))
                    .expect("a value that breaks the pattern")
            };
            // Also the same value spelled otherwise (an id uppercase or without its hyphens),
            // when that breaks the pattern.
            let others = [base.to_uppercase(), base.replace('-', "")];
            for bad in std::iter::once(bad).chain(others.into_iter().filter(|b| b != base && !matches(p, b))) {
                push(format!("{bad:?} breaks {p}"), Change::Set(json_str(&bad)), refused);
            }
        }
    }
    if types.contains(&"integer") {
        if is_body {
            push("a fraction".into(), Change::Set("1.5".into()), refused);
            push("a string for a number".into(), Change::Set("\"1\"".into()), Expect::Refused { names_field: false });
        } else {
            push("not a number".into(), Change::Set("x1".into()), Expect::Refused { names_field: false });
        }
        if is_body {
            // JSON Schema's `integer` is any number whose fractional part is zero.
            let whole = s.get("minimum").and_then(|v| v.as_i64()).unwrap_or(1).max(1);
            push(format!("{whole}.0"), Change::Set(format!("{whole}.0")), Expect::Accepted);
            push(format!("{whole}e0"), Change::Set(format!("{whole}e0")), Expect::Accepted);
        }
        if let Some(min) = s.get("minimum").and_then(|v| v.as_i64()) {
            push(format!("{min}"), Change::Set(min.to_string()), Expect::Accepted);
            push(format!("{}", i128::from(min) - 1), Change::Set((i128::from(min) - 1).to_string()), refused);
        }
        if let Some(max) = s.get("maximum").and_then(|v| v.as_u64().map(i128::from).or(v.as_i64().map(i128::from))) {
            push(format!("{max}"), Change::Set(max.to_string()), Expect::Accepted);
            push(format!("{}", max + 1), Change::Set((max + 1).to_string()), refused);
        }
    }
    if let Some(bytes) = s.get("x-baton-max-bytes").and_then(Value::as_u64)
        && types.is_empty()
    {
        // Any JSON value (a payload): a string whose JSON text is exactly the bound.
        let n = bytes as usize - 2;
        push(format!("{bytes} bytes of JSON"), Change::Set(json_str(&"p".repeat(n))), Expect::Accepted);
        push(format!("{} bytes of JSON", bytes + 1), Change::Set(json_str(&"p".repeat(n + 1))), refused);
    }
    if let Some(depth) = s.get("x-baton-max-depth").and_then(Value::as_u64) {
        let depth = depth as usize;
        push(format!("{depth} levels"), Change::Set(nested(depth)), Expect::Accepted);
        push(format!("{} levels", depth + 1), Change::Set(nested(depth + 1)), refused);
    }
    if types.contains(&"array") {
        let first = base.and_then(|b| b.get(0)).cloned().expect("a base array with an item");
        let copies = |n: usize| Value::Array(vec![first.clone(); n]).to_string();
        if let Some(max) = s.get("maxItems").and_then(Value::as_u64) {
            let max = max as usize;
            push(format!("{max} items"), Change::Set(copies(max)), Expect::Accepted);
            push(format!("{} items", max + 1), Change::Set(copies(max + 1)), refused);
        }
        if let Some(min) = s.get("minItems").and_then(Value::as_u64).filter(|m| *m > 0) {
            push(format!("{} items", min - 1), Change::Set(copies(min as usize - 1)), refused);
        }
        if is_body {
            push("an object for an array".into(), Change::Set("{}".into()), Expect::Refused { names_field: false });
        }
        if let Loc::Body(at) = loc {
            let mut at = at.clone();
            at.push("0".into());
            cases_for(doc, &s["items"], &Loc::Body(at), Some(&first), false, out);
        }
    }
    if types.contains(&"object") || s.get("properties").is_some() {
        let Loc::Body(at) = loc else { panic!("an object outside a body") };
        let required: Vec<&str> =
            s["required"].as_array().map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        if s["additionalProperties"] == json!(false) {
            let mut extra = at.clone();
            extra.push("zz_unknown".into());
            out.push(Case {
                what: "an unknown property".into(),
                loc: Loc::Body(extra),
                change: Change::Set("1".into()),
                expect: Expect::Refused { names_field: false },
            });
        }
        for (name, ps) in s["properties"].as_object().into_iter().flatten() {
            let mut p = at.clone();
            p.push(name.clone());
            let base_v = base.and_then(|b| b.get(name));
            cases_for(doc, ps, &Loc::Body(p), base_v, required.contains(&name.as_str()), out);
        }
    }
}

/// The forms of an operation's query (`x-baton-form` of its parameters: `GET /v1/messages` reads
/// by key or lists), each exercised from a base request of its own; `[None]` for one form.
fn forms(op: &Value) -> Vec<Option<String>> {
    let mut forms: Vec<Option<String>> = op["parameters"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["x-baton-form"].as_str().map(|f| Some(f.to_string())))
        .collect();
    forms.sort();
    forms.dedup();
    if forms.is_empty() { vec![None] } else { forms }
}

/// Every case of one operation in one form of its query (`forms`): its parameters' (those of
/// another form left out; `x-baton-form-required` makes one required in its own) and its
/// body's.
fn cases(doc: &Value, op: &Value, base: &Call, form: Option<&str>) -> Vec<Case> {
    let mut out = Vec::new();
    for p in op["parameters"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap().to_string();
        let own = p["x-baton-form"].as_str();
        if own.is_some() && own != form {
            continue;
        }
        let required = p["required"] == json!(true) || (own.is_some() && p["x-baton-form-required"] == json!(true));
        let (loc, base_v) = match p["in"].as_str().unwrap() {
            "path" => (Loc::Path(name.clone()), base.path.get(&name)),
            "query" => (Loc::Query(name.clone()), base.query.get(&name)),
            "header" => (Loc::Header(name.clone()), base.headers.get(&name)),
            other => panic!("parameter in {other}"),
        };
        let base_v = base_v.map(|v| Value::String(v.clone()));
        cases_for(doc, &p["schema"], &loc, base_v.as_ref(), required && !matches!(loc, Loc::Path(_)), &mut out);
    }
    if let Some(s) = op.pointer("/requestBody/content/application~1json/schema") {
        cases_for(doc, s, &Loc::Body(vec![]), base.body.as_ref(), false, &mut out);
    }
    out
}

/// The call with the case applied; the body as raw text.
fn apply(base: &Call, case: &Case) -> (Call, Option<String>) {
    let mut call = base.clone();
    let unquote = |raw: &str| match serde_json::from_str::<Value>(raw) {
        Ok(Value::String(s)) => s,
        _ => raw.to_string(),
    };
    let mut raw_body = None;
    match (&case.loc, &case.change) {
        (Loc::Path(n), Change::Set(v)) => {
            call.path.insert(n.clone(), unquote(v));
        }
        (Loc::Query(n), Change::Set(v)) => {
            call.query.insert(n.clone(), unquote(v));
        }
        (Loc::Query(n), Change::Remove) => {
            call.query.remove(n);
        }
        (Loc::Header(n), Change::Set(v)) => {
            call.headers.insert(n.clone(), unquote(v));
        }
        (Loc::Header(n), Change::Remove) => {
            call.headers.remove(n);
        }
        (Loc::Body(at), Change::Set(v)) if at.is_empty() => raw_body = Some(v.clone()),
        (Loc::Body(at), change) => {
            const MARK: &str = "@@generated@@";
            let mut body = call.body.clone().expect("a body");
            let (last, parents) = at.split_last().expect("a field, not the whole body");
            let mut here = &mut body;
            for seg in parents {
                here = match here {
                    Value::Array(a) => &mut a[seg.parse::<usize>().unwrap()],
                    v => &mut v[seg.as_str()],
                };
            }
            match (here, change) {
                (Value::Array(a), Change::Set(v)) => {
                    a[last.parse::<usize>().unwrap()] = Value::String(MARK.into());
                    raw_body = Some(body.to_string().replace(&json_str(MARK), v));
                }
                (Value::Object(obj), Change::Remove) => {
                    obj.remove(last);
                    raw_body = Some(body.to_string());
                }
                (Value::Object(obj), Change::Set(v)) => {
                    obj.insert(last.clone(), Value::String(MARK.into()));
                    raw_body = Some(body.to_string().replace(&json_str(MARK), v));
                }
                (other, _) => panic!("{at:?}: cannot change {other}"),
            }
        }
        (Loc::Path(_), Change::Remove) => unreachable!("path parameters are always there"),
    }
    if raw_body.is_none() {
        raw_body = call.body.as_ref().map(Value::to_string);
    }
    (call, raw_body)
}

fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An answer: status and body.
struct Answer {
    status: u16,
    body: Value,
    text: String,
}

/// Sends a call with the certificate of its caller.
async fn send(
    clients: &BTreeMap<&str, reqwest::Client>,
    base_url: &str,
    method: &str,
    template: &str,
    call: &Call,
    body: Option<String>,
) -> Answer {
    let mut path = template.to_string();
    for (k, v) in &call.path {
        path = path.replace(&format!("{{{k}}}"), &escape(v));
    }
    let query: Vec<String> = call.query.iter().map(|(k, v)| format!("{k}={}", escape(v))).collect();
    let url =
        if query.is_empty() { format!("{base_url}{path}") } else { format!("{base_url}{path}?{}", query.join("&")) };
    let client = &clients[call.caller];
    let mut req = match method {
        "get" => client.get(&url),
        "post" => client.post(&url),
        m => panic!("method {m}"),
    };
    for (k, v) in &call.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    let r = req.send().await.unwrap_or_else(|e| panic!("{method} {url}: {e:?}"));
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    Answer { status, body: serde_json::from_str(&text).unwrap_or(Value::Null), text }
}

/// The codes the document lists for `status` in `responses` (None: the status is not listed).
fn listed(responses: &Value, status: u16) -> Option<Vec<String>> {
    responses.get(status.to_string()).map(response_codes)
}

/// The field a case is about, as an error message would name it.
fn field_of(loc: &Loc) -> String {
    match loc {
        Loc::Path(n) | Loc::Query(n) | Loc::Header(n) => n.clone(),
        Loc::Body(at) => at.iter().rev().find(|s| s.parse::<usize>().is_err()).cloned().unwrap_or_default(),
    }
}

/// The item result schema's documented error statuses and codes for a batch operation.
fn item_errors(doc: &Value, op: &Value) -> Option<(Vec<u64>, Vec<String>)> {
    let results = op.pointer("/responses/200/content/application~1json/schema")?;
    let results = resolve(doc, results);
    let item = resolve(doc, results.pointer("/properties/results/items")?);
    let alt = item["oneOf"]
        .as_array()?
        .iter()
        .find(|a| a["required"].as_array().is_some_and(|r| r.contains(&json!("error"))))?;
    let statuses = alt["properties"]["status"]["enum"].as_array()?.iter().filter_map(Value::as_u64).collect();
    let codes = alt["properties"]["error"]["properties"]["code"]["enum"]
        .as_array()?
        .iter()
        .filter_map(|c| c.as_str().map(str::to_string))
        .collect();
    Some((statuses, codes))
}

/// A good request for every operation, made fresh for each use (new idempotency keys and report
/// ids, so a boundary case is never a conflict with an earlier one).
struct Bases {
    message_id: String,
    /// The base message's one delivery.
    delivery_id: String,
    key: String,
    n: std::cell::Cell<u32>,
}

impl Bases {
    fn fresh(&self, what: &str) -> String {
        self.n.set(self.n.get() + 1);
        format!("{what}-{}", self.n.get())
    }

    fn submit(&self) -> Value {
        json!({
            "conversation": "talk",
            "idempotency_key": self.fresh("k"),
            "payload": {"n": 1},
            "to": ["host-a"],
            "pools": ["pool-a"],
            "max_attempts": 2,
            "retry_backoff_ms": 10,
            "approval": "required",
            "approval_timeout_ms": 60_000,
        })
    }

    fn report(&self) -> Value {
        json!({
            "delivery_id": uuid::Uuid::now_v7().to_string(),
            "instance_id": "inst-b",
            "claim_token": "tok-1",
            "report_id": self.fresh("r"),
            "outcome": "failed",
            "exit_code": 1,
            "duration_ms": 5,
            "result": "out",
            "reason": "why",
            "attempt": 1,
            "signal": 15,
            "stderr_tail": "err",
            "stderr_dropped_bytes": 0,
        })
    }

    /// The base request of an operation in one form of its query (see `forms`).
    fn call_in(&self, method: &str, path: &str, form: Option<&str>) -> Call {
        match (method, path, form) {
            ("get", "/v1/messages", Some("list")) => Call {
                caller: "prod",
                path: BTreeMap::new(),
                query: [("conversation".to_string(), "talk".to_string())].into(),
                headers: BTreeMap::new(),
                body: None,
            },
            _ => self.call(method, path),
        }
    }

    fn call(&self, method: &str, path: &str) -> Call {
        let producer = |body: Option<Value>| Call {
            caller: "prod",
            path: BTreeMap::new(),
            query: BTreeMap::new(),
            headers: BTreeMap::new(),
            body,
        };
        let node = |body: Value| Call { caller: "host-b", body: Some(body), ..producer(None) };
        let holder = || json!({"delivery_id": uuid::Uuid::now_v7().to_string(), "claim_token": "tok-1"});
        let id = || uuid::Uuid::now_v7().to_string();
        let mut c = match (method, path) {
            ("post", "/v1/messages") => {
                let mut c = producer(Some(self.submit()));
                c.headers.insert("traceparent".into(), BASE_TRACEPARENT.into());
                c
            }
            ("get", "/v1/messages") => {
                let mut c = producer(None);
                c.query.insert("idempotency_key".into(), self.key.clone());
                c.query.insert("wait_ms".into(), "0".into());
                c
            }
            ("get", "/v1/messages/{message_id}") => {
                let mut c = producer(None);
                c.path.insert("message_id".into(), self.message_id.clone());
                c.query.insert("wait_ms".into(), "0".into());
                c
            }
            ("get", "/v1/messages/{message_id}/deliveries/{delivery_id}") => {
                let mut c = producer(None);
                c.path.insert("message_id".into(), self.message_id.clone());
                c.path.insert("delivery_id".into(), self.delivery_id.clone());
                c
            }
            ("post", "/v1/messages/{message_id}/cancel") => {
                let mut c = producer(Some(json!({"reason": "not needed"})));
                c.path.insert("message_id".into(), self.message_id.clone());
                c
            }
            // A message that needs no approval: a request the document accepts is answered 409.
            ("post", "/v1/messages/{message_id}/approve") | ("post", "/v1/messages/{message_id}/reject") => {
                let mut c = producer(Some(json!({"reason": "looked at it"})));
                c.path.insert("message_id".into(), self.message_id.clone());
                c
            }
            ("get", "/v1/conversations/{conversation}") => {
                let mut c = producer(None);
                c.path.insert("conversation".into(), "talk".into());
                c
            }
            ("get", "/v1/messages/{message_id}/events") => {
                let mut c = producer(None);
                c.path.insert("message_id".into(), self.message_id.clone());
                c.query.insert("wait_ms".into(), "0".into());
                c
            }
            ("get", "/v1/conversations/{conversation}/events") => {
                let mut c = producer(None);
                c.path.insert("conversation".into(), "talk".into());
                c.query.insert("wait_ms".into(), "0".into());
                c
            }
            // A turn this instance does not hold: accepted (200), answered `running: false`.
            ("post", "/v1/running") => node(json!({
                "instance_id": "inst-b",
                "turns": [{"delivery_id": id(), "claim_token": "tok-1", "attempt": 1,
                           "events": [{"seq": 1, "progress": {"step": 1}}], "dropped": 0}],
            })),
            // Sessions are opened for host-a, which takes nothing else here: once a host has a
            // session, every node request of its must name one, and host-b's cases name none.
            ("post", "/v1/sessions") => {
                Call { caller: "host-a", ..node(json!({"instance_id": "inst-a", "node_version": "1.0"})) }
            }
            ("post", "/v1/sessions/end") => {
                let mut c = Call { caller: "host-a", ..node(json!({"instance_id": "inst-a", "session": 1})) };
                c.headers.insert("baton-session".into(), "1".into());
                c
            }
            ("post", "/v1/claims") => node(json!({"instance_id": "inst-b", "max": 1, "wait_ms": 0})),
            ("post", "/v1/starts") => node(json!({
                "instance_id": "inst-b",
                "starts": [{"delivery_id": id(), "claim_token": "tok-1", "attempt": 1}],
            })),
            ("get", "/v1/holdings") => {
                let mut c = producer(None);
                c.caller = "host-b";
                c.query.insert("instance_id".into(), "inst-b".into());
                c
            }
            ("post", p) if p.starts_with("/v1/deliveries/") => {
                let body = if p.ends_with("/reject") {
                    json!({"instance_id": "inst-b", "claim_token": "tok-1", "reason": "no"})
                } else {
                    json!({"instance_id": "inst-b", "claim_token": "tok-1"})
                };
                let mut c = node(body);
                c.path.insert("delivery_id".into(), id());
                c
            }
            ("post", "/delivery-report") => node(self.report()),
            ("post", "/v1/batch/messages") => {
                let mut c = producer(Some(json!({"messages": [self.submit()]})));
                c.headers.insert("traceparent".into(), BASE_TRACEPARENT.into());
                c
            }
            ("post", "/v1/batch/mirrored" | "/v1/batch/ack" | "/v1/batch/handoff") => {
                node(json!({"instance_id": "inst-b", "deliveries": [holder()]}))
            }
            ("post", "/v1/batch/reject") => node(json!({
                "instance_id": "inst-b",
                "deliveries": [{"delivery_id": id(), "claim_token": "tok-1", "reason": "no"}],
            })),
            ("post", "/v1/batch/reports") => node(json!({"reports": [self.report()]})),
            ("get", "/healthz" | "/readyz" | "/metrics") => producer(None),
            other => panic!("no base request for {other:?}: add one"),
        };
        if path == "/v1/starts" || path == "/v1/running" {
            // Required there; any session number in range is well-formed.
            c.headers.insert("baton-session".into(), "1".into());
        }
        c
    }
}

/// Against a real hub: every constraint the document states is enforced with a status and code
/// it lists, and every boundary it accepts is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_enforces_exactly_what_the_document_states() {
    // Waits are capped to nothing: a boundary `wait_ms` answers at once.
    // A host with the longest name, so a boundary `to` names an enrolled host.
    let longest = "a".repeat(NAME_CHARS_MAX);
    let hub = Hub::builder()
        .nodes(&["host-a", "host-b", &longest])
        .producers(&["prod"])
        .config("[limits]\nlong_poll_wait_max = \"0s\"\n")
        .start();
    // Pools by the base's name and the longest, so a boundary `pools` names pools that exist.
    for pool in ["pool-a", longest.as_str()] {
        hub.cli_ok(["pools", "add", "--pool", pool, "host-b", "--reason", "openapi"]);
    }
    let doc = doc();
    let mut clients = BTreeMap::new();
    for name in ["prod", "host-a", "host-b"] {
        let id = hub.identity(name);
        let b = baton_testkit::identity::client_builder(&id.ca_pem().unwrap(), Some(&id.pem().unwrap())).unwrap();
        clients.insert(name, b.timeout(std::time::Duration::from_secs(60)).build().unwrap());
    }
    let prod = hub.client("prod");
    let sub = prod.submit("talk", "k-base", json!({"n": 0}), &["host-a"]).await;
    let message_id = sub.ok(201)["message_id"].as_str().unwrap().to_string();
    let delivery_id = sub.ok(201)["deliveries"][0]["delivery_id"].as_str().unwrap().to_string();
    let bases = Bases { message_id, delivery_id, key: "k-base".into(), n: Default::default() };
    let url = hub.url();

    let mut failures = Vec::new();
    let mut sent = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            for form in forms(op) {
                let form = form.as_deref();
                let template = bases.call_in(method, path, form);
                let responses = &op["responses"];
                let batch_items = item_errors(&doc, op);
                let mut all = vec![Case {
                    what: "the base request".into(),
                    loc: Loc::Path(String::new()),
                    change: Change::Remove,
                    expect: Expect::Accepted,
                }];
                all.extend(cases(&doc, op, &template, form));
                for case in all {
                    let base = bases.call_in(method, path, form);
                    let (call, body) = if case.what == "the base request" {
                        let b = base.body.as_ref().map(Value::to_string);
                        (base, b)
                    } else {
                        apply(&base, &case)
                    };
                    let a = send(&clients, &url, method, path, &call, body).await;
                    sent += 1;
                    let label = format!("{} {path} with {:?} {}", method.to_uppercase(), case.loc, case.what);
                    // Whatever the case, the answer is one the document lists.
                    let Some(codes) = listed(responses, a.status) else {
                        failures.push(format!("{label}: status {} is not listed: {}", a.status, a.text));
                        continue;
                    };
                    let code = a.body["code"].as_str().map(str::to_string);
                    if a.status >= 400 {
                        let shape = a.body.as_object().is_some_and(|o| o.len() == 2 && o.contains_key("message"));
                        if !shape || !code.as_ref().is_some_and(|c| codes.contains(c)) {
                            failures.push(format!(
                                "{label}: {} {:?} is not a listed {{code, message}}: {}",
                                a.status, code, a.text
                            ));
                            continue;
                        }
                    }
                    // Every item's answer in a batch is one its item result lists.
                    if let (Some((statuses, codes)), Some(results)) =
                        (&batch_items, a.body["results"].as_array().filter(|_| a.status == 200))
                    {
                        for r in results.iter().filter(|r| r.get("error").is_some()) {
                            let code = r["error"]["code"].as_str().unwrap_or("").to_string();
                            if !r["status"].as_u64().is_some_and(|s| statuses.contains(&s)) || !codes.contains(&code) {
                                failures.push(format!("{label}: item answer {r} is not listed"));
                            }
                        }
                    }
                    // The first item's own answer, in a batch.
                    let item = a.body.pointer("/results/0").filter(|_| a.status == 200);
                    match case.expect {
                        Expect::Accepted => {
                            // Refused as invalid: a shape or value error, not what the record
                            // makes of a valid request (`no_recipients` for a conversation without
                            // members, `not_found`, a conflict).
                            let invalid = |code: Option<&str>| {
                                matches!(code, Some("invalid_json" | "invalid_field" | "too_large"))
                            };
                            let item_refused = item.is_some_and(|i| invalid(i["error"]["code"].as_str()));
                            if invalid(a.body["code"].as_str()) || item_refused || a.status >= 500 {
                                failures.push(format!(
                                    "{label}: a boundary the document accepts was refused: {} {}",
                                    a.status,
                                    &a.text[..a.text.len().min(300)]
                                ));
                            }
                        }
                        Expect::Refused { names_field } => {
                            let (status, code, message) = match item {
                                Some(i) if batch_items.is_some() => {
                                    let (statuses, codes) = batch_items.clone().unwrap();
                                    let s = i["status"].as_u64().unwrap_or(0);
                                    let c = i["error"]["code"].as_str().unwrap_or("").to_string();
                                    if !statuses.contains(&s) || !codes.contains(&c) {
                                        failures.push(format!("{label}: item answer {s} {c} is not listed: {i}"));
                                        continue;
                                    }
                                    (s as u16, Some(c), i["error"]["message"].as_str().unwrap_or("").to_string())
                                }
                                _ => (a.status, code, a.body["message"].as_str().unwrap_or("").to_string()),
                            };
                            if !matches!(status, 400 | 413) {
                                failures.push(format!(
                                    "{label}: not refused as invalid: {status} {:?} {}",
                                    code,
                                    a.text.chars().take(300).collect::<String>()
                                ));
                                continue;
                            }
                            let field = field_of(&case.loc);
                            if names_field && !message.contains(&field) {
                                failures.push(format!("{label}: the message does not name {field}: {message}"));
                            }
                        }
                    }
                }
            }
        }
    }
    // Valid requests for things that do not exist: their answers are listed too.
    for (method, path, param, value) in [
        ("get", "/v1/conversations/{conversation}", "conversation", "never-posted-to".to_string()),
        ("get", "/v1/messages/{message_id}", "message_id", uuid::Uuid::now_v7().to_string()),
        ("post", "/v1/messages/{message_id}/cancel", "message_id", uuid::Uuid::now_v7().to_string()),
    ] {
        let mut call = bases.call(method, path);
        call.path.insert(param.into(), value);
        let body = call.body.as_ref().map(Value::to_string);
        let a = send(&clients, &url, method, path, &call, body).await;
        let responses = &doc["paths"][path][method]["responses"];
        let code = a.body["code"].as_str().unwrap_or("").to_string();
        if !listed(responses, a.status).is_some_and(|codes| codes.contains(&code)) {
            failures.push(format!("{method} {path} for an unknown {param}: {} {} is not listed", a.status, a.text));
        }
    }
    // A schema-valid submission the record refuses: `to` empty (or absent) on a conversation
    // without members. The document says so where a schema tester reads it: under `to` and
    // under the 400 that answers it.
    let submit = &doc["paths"]["/v1/messages"]["post"];
    let to_doc = doc["components"]["schemas"]["SubmitRequest"]["properties"]["to"]["description"].as_str().unwrap();
    let refusal = submit["responses"]["400"]["description"].as_str().unwrap();
    for (what, text) in [("`to`", to_doc), ("the 400 answer", refusal)] {
        if !(text.contains("no_recipients") && text.contains("members")) {
            failures.push(format!("{what} does not say when no_recipients answers a schema-valid body: {text}"));
        }
    }
    for to in [json!([]), Value::Null] {
        let mut call = bases.call("post", "/v1/messages");
        let body = call.body.as_mut().unwrap();
        body["conversation"] = json!(format!("memberless-{}", bases.fresh("c")));
        body["to"] = to.clone();
        body.as_object_mut().unwrap().remove("pools");
        let body = call.body.as_ref().map(Value::to_string);
        let a = send(&clients, &url, "post", "/v1/messages", &call, body).await;
        if (a.status, a.body["code"].as_str()) != (400, Some("no_recipients")) {
            failures.push(format!("to = {to} without members: {} {}", a.status, a.text));
        }
    }
    println!("{sent} generated requests");
    assert!(
        failures.is_empty(),
        "{} of {sent} answers differ from docs/openapi.json:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
