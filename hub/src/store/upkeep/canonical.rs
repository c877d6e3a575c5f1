//! The canonical form of a payload: what the idempotency hash reads, so that two payloads are
//! "the same content" exactly when they are the same JSON value written differently.
//!
//! The form, applied recursively:
//! - an object's members are sorted by key (the decoded key, by Unicode code point), written
//!   `{"k":v,...}`; two members with the same decoded key are refused (`DuplicateKey`);
//! - an array's elements keep their order, written `[v,...]`;
//! - a string is decoded and written again with one escape form: `\"`, `\\`, `\b`, `\f`, `\n`,
//!   `\r`, `\t`, other control characters as `\u00xx` (lowercase hex), everything else as its
//!   UTF-8 bytes (so `"\u00e9"`, `"é"` and `"\u00E9"` are one string; `"\/"` is `"/"`). A lone
//!   surrogate escape is not a Unicode string and is refused;
//! - a number is kept as its literal text: never converted to a float, so
//!   `12345678901234567890123` and `12345678901234567890124`, or `1.0` and `1.00`, stay
//!   different (the latter two are different content, never a duplicate);
//! - `true`, `false`, `null` as themselves; whitespace between tokens is removed.
//!
//! For a payload whose numbers are written as `serde_json` prints them (integers within 64
//! bits, decimals in their shortest form such as `1.5`), the canonical form is the compact
//! sorted text the hub hashed before payloads were kept exactly, so such a message's replay
//! still matches the hash stored for it.
//!
//! Nesting deeper than `PAYLOAD_DEPTH_MAX` objects and arrays is refused (`TooDeep`).

use baton_shared::limits::PAYLOAD_DEPTH_MAX;

/// Why a payload has no canonical form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonicalError {
    /// The text is not one JSON value.
    #[error("not JSON at byte {at}: {what}")]
    NotJson {
        /// The byte offset where parsing stopped.
        at: usize,
        /// What was wrong there.
        what: String,
    },
    /// An object names the same key twice (after decoding escapes).
    #[error("duplicate key {0:?} in one object; a payload object names each key once")]
    DuplicateKey(String),
    /// Objects and arrays nest deeper than the bound.
    #[error("nested deeper than {max} objects and arrays (PAYLOAD_DEPTH_MAX)")]
    TooDeep {
        /// The bound.
        max: usize,
    },
}

/// The canonical text of the JSON value `text` (see the module documentation).
pub fn canonical(text: &str) -> Result<String, CanonicalError> {
    let mut p = Parser { s: text.as_bytes(), text, at: 0 };
    p.ws();
    let mut out = String::with_capacity(text.len());
    p.value(0, &mut out)?;
    p.ws();
    if p.at != p.s.len() {
        return Err(p.err("trailing characters after the value"));
    }
    Ok(out)
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    at: usize,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> CanonicalError {
        CanonicalError::NotJson { at: self.at, what: what.to_string() }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Result<(), CanonicalError> {
        if self.peek() == Some(b) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.err(&format!("expected {:?}", b as char)))
        }
    }

    fn value(&mut self, depth: usize, out: &mut String) -> Result<(), CanonicalError> {
        match self.peek() {
            Some(b'{') => self.object(depth + 1, out),
            Some(b'[') => self.array(depth + 1, out),
            Some(b'"') => {
                let s = self.string()?;
                write_string(&s, out);
                Ok(())
            }
            Some(b't') => self.literal("true", out),
            Some(b'f') => self.literal("false", out),
            Some(b'n') => self.literal("null", out),
            Some(b'-' | b'0'..=b'9') => self.number(out),
            _ => Err(self.err("expected a value")),
        }
    }

    fn literal(&mut self, word: &str, out: &mut String) -> Result<(), CanonicalError> {
        if self.s[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            out.push_str(word);
            Ok(())
        } else {
            Err(self.err("expected true, false or null"))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        self.at - start
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, copied as written.
    fn number(&mut self, out: &mut String) -> Result<(), CanonicalError> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("expected a digit")),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return Err(self.err("expected a digit after the decimal point"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("expected a digit in the exponent"));
            }
        }
        out.push_str(&self.text[start..self.at]);
        Ok(())
    }

    /// A string token, decoded.
    fn string(&mut self) -> Result<String, CanonicalError> {
        let start = self.at;
        self.eat(b'"')?;
        loop {
            match self.peek() {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => break,
                Some(b'\\') => self.at += 2,
                Some(b) if b < 0x20 => return Err(self.err("control character in a string")),
                Some(_) => self.at += 1,
            }
        }
        self.at += 1;
        let token = self.text.get(start..self.at).ok_or_else(|| self.err("unterminated string"))?;
        serde_json::from_str::<String>(token).map_err(|e| CanonicalError::NotJson { at: start, what: e.to_string() })
    }

    fn array(&mut self, depth: usize, out: &mut String) -> Result<(), CanonicalError> {
        if depth > PAYLOAD_DEPTH_MAX {
            return Err(CanonicalError::TooDeep { max: PAYLOAD_DEPTH_MAX });
        }
        self.eat(b'[')?;
        out.push('[');
        self.ws();
        if self.peek() == Some(b']') {
            self.at += 1;
            out.push(']');
            return Ok(());
        }
        loop {
            self.ws();
            self.value(depth, out)?;
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.at += 1;
                    out.push(',');
                }
                Some(b']') => {
                    self.at += 1;
                    out.push(']');
                    return Ok(());
                }
                _ => return Err(self.err("expected ',' or ']'")),
            }
        }
    }

    fn object(&mut self, depth: usize, out: &mut String) -> Result<(), CanonicalError> {
        if depth > PAYLOAD_DEPTH_MAX {
            return Err(CanonicalError::TooDeep { max: PAYLOAD_DEPTH_MAX });
        }
        self.eat(b'{')?;
        self.ws();
        let mut members: Vec<(String, String)> = Vec::new();
        if self.peek() == Some(b'}') {
            self.at += 1;
        } else {
            loop {
                self.ws();
                let key = self.string()?;
                self.ws();
                self.eat(b':')?;
                self.ws();
                let mut v = String::new();
                self.value(depth, &mut v)?;
                members.push((key, v));
                self.ws();
                match self.peek() {
                    Some(b',') => self.at += 1,
                    Some(b'}') => {
                        self.at += 1;
                        break;
                    }
                    _ => return Err(self.err("expected ',' or '}'")),
                }
            }
        }
        members.sort_by(|a, b| a.0.cmp(&b.0));
        out.push('{');
        for (i, (k, v)) in members.iter().enumerate() {
            if i > 0 {
                if members[i - 1].0 == *k {
                    return Err(CanonicalError::DuplicateKey(k.clone()));
                }
                out.push(',');
            }
            write_string(k, out);
            out.push(':');
            out.push_str(v);
        }
        out.push('}');
        Ok(())
    }
}

/// Writes `s` as a JSON string in the one escape form (`serde_json`'s).
fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn check(input: &str, expected: Result<&str, CanonicalError>) {
        assert_eq!(canonical(input).as_deref().map_err(Clone::clone), expected, "{input}");
    }

    #[test]
    fn canonical_forms() {
        check(r#" { "b" : 1 , "a" : [ true , null ] } "#, Ok(r#"{"a":[true,null],"b":1}"#));
        check("12345678901234567890123", Ok("12345678901234567890123"));
        check("1.000000000000000000001", Ok("1.000000000000000000001"));
        check("-0.5e+10", Ok("-0.5e+10"));
        check(r#""\u00e9\u00E9é\/\n\u001f""#, Ok("\"ééé/\\n\\u001f\""));
        check(r#"{"\u0061":1,"a":2}"#, Err(CanonicalError::DuplicateKey("a".into())));
        check(r#"{"a":{"x":1,"x":1}}"#, Err(CanonicalError::DuplicateKey("x".into())));
        check("[]", Ok("[]"));
        check("{}", Ok("{}"));
        // "😀" as a surrogate pair and as UTF-8 are one string.
        check(r#""\ud83d\ude00""#, Ok("\"😀\""));
        for bad in ["", "01", "1.", "-", "1e", "[1,]", "{\"a\"}", "tru", "\"\\ud800\"", "\"a", "1 2", "{\"a\":1,}"] {
            assert!(matches!(canonical(bad), Err(CanonicalError::NotJson { .. })), "{bad:?}");
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(canonical(&deep(PAYLOAD_DEPTH_MAX)).is_ok());
        assert_eq!(canonical(&deep(PAYLOAD_DEPTH_MAX + 1)), Err(CanonicalError::TooDeep { max: PAYLOAD_DEPTH_MAX }));
        let objects = format!("{}1{}", "{\"a\":".repeat(PAYLOAD_DEPTH_MAX), "}".repeat(PAYLOAD_DEPTH_MAX));
        assert!(canonical(&objects).is_ok());
        assert!(canonical(&format!("[{objects}]")).is_err());
    }

    /// A generated JSON value: its tree, written two different ways.
    #[derive(Debug, Clone)]
    enum Gen {
        Num(String),
        Str(String),
        Lit(&'static str),
        Arr(Vec<Gen>),
        Obj(Vec<(String, Gen)>),
    }

    fn gen_string(rng: &mut StdRng) -> String {
        let pool =
            ['a', 'z', 'é', '😀', '"', '\\', '/', '\n', '\u{0}', '\u{1}', '\u{7f}', '\u{2028}', '\u{ffff}', ' ', 'Ω'];
        (0..rng.random_range(0..6)).map(|_| pool[rng.random_range(0..pool.len())]).collect()
    }

    fn gen_number(rng: &mut StdRng) -> String {
        let digits = |rng: &mut StdRng, n: usize| -> String {
            (0..n).map(|_| char::from(b'0' + rng.random_range(0..10u8))).collect()
        };
        let mut s = String::new();
        if rng.random_bool(0.3) {
            s.push('-');
        }
        let n = rng.random_range(1..40);
        let int = digits(rng, n);
        s.push_str(if int.starts_with('0') { "0" } else { &int });
        if rng.random_bool(0.4) {
            s.push('.');
            let n = rng.random_range(1..30);
            s.push_str(&digits(rng, n));
        }
        if rng.random_bool(0.2) {
            s.push_str(["e", "E+", "e-"][rng.random_range(0..3)]);
            let n = rng.random_range(1..4);
            s.push_str(&digits(rng, n));
        }
        s
    }

    fn generate(rng: &mut StdRng, depth: usize) -> Gen {
        let leaf = depth >= PAYLOAD_DEPTH_MAX || rng.random_bool(if depth > 3 { 0.7 } else { 0.3 });
        match (leaf, rng.random_range(0..3)) {
            (true, 0) => Gen::Num(gen_number(rng)),
            (true, 1) => Gen::Str(gen_string(rng)),
            (true, _) => Gen::Lit(["true", "false", "null"][rng.random_range(0..3)]),
            (false, 0) => Gen::Arr((0..rng.random_range(0..4)).map(|_| generate(rng, depth + 1)).collect()),
            (false, _) => {
                let mut keys: Vec<String> = (0..rng.random_range(0..4)).map(|_| gen_string(rng)).collect();
                keys.sort();
                keys.dedup();
                Gen::Obj(keys.into_iter().map(|k| (k, generate(rng, depth + 1))).collect())
            }
        }
    }

    /// Writes a string with random but equivalent escapes.
    fn write_str_any(rng: &mut StdRng, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            let must = c == '"' || c == '\\' || (c as u32) < 0x20;
            if must || rng.random_bool(0.3) {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&if rng.random_bool(0.5) { format!("\\u{u:04x}") } else { format!("\\u{u:04X}") });
                }
            } else {
                out.push(c);
            }
        }
        out.push('"');
    }

    fn ws(rng: &mut StdRng, out: &mut String) {
        for _ in 0..rng.random_range(0..2) {
            out.push([' ', '\n', '\t', '\r'][rng.random_range(0..4)]);
        }
    }

    /// Writes `g` with random whitespace, escapes and member order.
    fn write_any(rng: &mut StdRng, g: &Gen, out: &mut String) {
        ws(rng, out);
        match g {
            Gen::Num(n) => out.push_str(n),
            Gen::Lit(l) => out.push_str(l),
            Gen::Str(s) => write_str_any(rng, s, out),
            Gen::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_any(rng, item, out);
                }
                ws(rng, out);
                out.push(']');
            }
            Gen::Obj(members) => {
                let mut order: Vec<usize> = (0..members.len()).collect();
                order.reverse();
                if rng.random_bool(0.5) && !order.is_empty() {
                    order.rotate_left(1);
                }
                out.push('{');
                for (i, &m) in order.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    ws(rng, out);
                    write_str_any(rng, &members[m].0, out);
                    ws(rng, out);
                    out.push(':');
                    write_any(rng, &members[m].1, out);
                }
                ws(rng, out);
                out.push('}');
            }
        }
        ws(rng, out);
    }

    /// Changes one number literal of `g`, if it has one.
    fn mutate_number(g: &mut Gen) -> bool {
        match g {
            Gen::Num(n) => {
                // The same value written otherwise (`12` → `12.0`, `1.5` → `1.50`) or another
                // value (`1e5` → `1e50`): either way, not the same content.
                if n.contains(['.', 'e', 'E']) {
                    n.push('0');
                } else {
                    n.push_str(".0");
                }
                true
            }
            Gen::Arr(items) => items.iter_mut().any(mutate_number),
            Gen::Obj(members) => members.iter_mut().any(|(_, v)| mutate_number(v)),
            _ => false,
        }
    }

    /// Property, over generated JSON (huge integers, long decimals, deep nesting up to the
    /// bound, unicode escapes): every writing of one value has the same canonical form, which
    /// is itself valid JSON and canonical, and numbers survive it as written; changing one
    /// number changes it.
    #[test]
    fn every_writing_of_a_value_has_one_canonical_form_and_numbers_are_kept() {
        let mut rng = StdRng::seed_from_u64(0xBA70);
        for case in 0..400 {
            let g = generate(&mut rng, 0);
            let (mut a, mut b) = (String::new(), String::new());
            write_any(&mut rng, &g, &mut a);
            write_any(&mut rng, &g, &mut b);
            let ca = canonical(&a).unwrap_or_else(|e| panic!("case {case}: {e}: {a}"));
            assert_eq!(ca, canonical(&b).unwrap(), "case {case}: {a} vs {b}");
            assert_eq!(canonical(&ca).unwrap(), ca, "case {case}: the form is a fixed point");
            assert!(serde_json::from_str::<&serde_json::value::RawValue>(&ca).is_ok(), "case {case}: {ca}");
            let mut changed = g.clone();
            if mutate_number(&mut changed) {
                let mut c = String::new();
                write_any(&mut rng, &changed, &mut c);
                assert_ne!(canonical(&c).unwrap(), ca, "case {case}: a changed number merged: {a} vs {c}");
            }
        }
    }

    /// Property: for payloads `serde_json` itself writes (the hub's encoding before payloads
    /// were kept exactly), the canonical form is that text, so their stored hashes still match.
    #[test]
    fn serde_json_written_payloads_are_already_canonical() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..300 {
            let v = serde_json::json!({
                "i": rng.random::<i64>(), "u": rng.random::<u64>(), "f": rng.random::<f64>() * 1e6,
                "s": gen_string(&mut rng), "nested": {"z": [gen_string(&mut rng), null, true], "a": -1},
            });
            let text = v.to_string();
            assert_eq!(canonical(&text).unwrap(), text);
        }
    }
}
