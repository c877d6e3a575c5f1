//! W3C Trace Context's `traceparent` (<https://www.w3.org/TR/trace-context/>): the trace a
//! producer's request belongs to and the producer's span that made it. The hub keeps one with
//! every message (the producer's, or one it starts), hands it out with each claim, and the node
//! gives it to the harness as `TRACEPARENT`, so a turn's work joins the producer's trace.
//!
//! Only `traceparent` travels; `tracestate` (vendors' own entries) is not kept: a claim carries
//! one trace field, and a vendor's state is meaningful to that vendor's tracer alone.

use std::fmt;

/// The HTTP request header a producer's submission carries its trace context in.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// The environment variable the harness finds the trace context in (the name OpenTelemetry's
/// environment propagation reads).
pub const TRACEPARENT_ENV: &str = "TRACEPARENT";

/// Length of a version-00 `traceparent`: `00-` 32 hex `-` 16 hex `-` 2 hex.
const TRACEPARENT_CHARS: usize = 55;

/// The `sampled` bit of the trace flags.
const FLAG_SAMPLED: u8 = 0x01;

/// A parsed `traceparent`: trace id, parent span id, flags. Always written in version 00.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace's id (never all zero).
    pub trace_id: [u8; 16],
    /// The id of the span that is the parent of what follows (never all zero).
    pub parent_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

/// Why a `traceparent` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("traceparent: {0} (expected 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>)")]
pub struct TraceParentError(&'static str);

impl TraceParent {
    /// Parses a header value. Version 00 must be exactly its 55 characters; a later version
    /// (not `ff`) is read by its version-00 prefix, as the specification asks, and kept as
    /// version 00. Hex must be lowercase; an all-zero trace or span id is refused.
    pub fn parse(text: &str) -> Result<TraceParent, TraceParentError> {
        let text = text.trim_matches([' ', '\t']);
        let b = text.as_bytes();
        if b.len() < TRACEPARENT_CHARS {
            return Err(TraceParentError("too short"));
        }
        let version = hex_byte(&b[0..2]).ok_or(TraceParentError("the version is not two lowercase hex digits"))?;
        if version == 0xff {
            return Err(TraceParentError("version ff is invalid"));
        }
        if version == 0 && b.len() != TRACEPARENT_CHARS {
            return Err(TraceParentError("version 00 is exactly 55 characters"));
        }
        if b.len() > TRACEPARENT_CHARS && b[TRACEPARENT_CHARS] != b'-' {
            return Err(TraceParentError("a later version's extra fields follow a '-'"));
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(TraceParentError("fields are separated by '-'"));
        }
        let mut trace_id = [0u8; 16];
        for (i, out) in trace_id.iter_mut().enumerate() {
            *out = hex_byte(&b[3 + 2 * i..5 + 2 * i])
                .ok_or(TraceParentError("the trace id is not 32 lowercase hex digits"))?;
        }
        let mut parent_id = [0u8; 8];
        for (i, out) in parent_id.iter_mut().enumerate() {
            *out = hex_byte(&b[36 + 2 * i..38 + 2 * i])
                .ok_or(TraceParentError("the span id is not 16 lowercase hex digits"))?;
        }
        let flags = hex_byte(&b[53..55]).ok_or(TraceParentError("the flags are not two lowercase hex digits"))?;
        if trace_id == [0; 16] {
            return Err(TraceParentError("the trace id is all zeros"));
        }
        if parent_id == [0; 8] {
            return Err(TraceParentError("the span id is all zeros"));
        }
        // Version 00 defines only the sampled bit; other bits of a later version are dropped
        // with the version.
        let flags = if version == 0 { flags } else { flags & FLAG_SAMPLED };
        Ok(TraceParent { trace_id, parent_id, flags })
    }

    /// A new trace: random trace and span ids (never all zero), sampled or not.
    pub fn generate(sampled: bool) -> TraceParent {
        let mut trace_id: [u8; 16] = rand::random();
        let mut parent_id: [u8; 8] = rand::random();
        // An all-zero id is invalid; its odds are nil, and a fixed last byte keeps it so.
        if trace_id == [0; 16] {
            trace_id[15] = 1;
        }
        if parent_id == [0; 8] {
            parent_id[7] = 1;
        }
        TraceParent { trace_id, parent_id, flags: if sampled { FLAG_SAMPLED } else { 0 } }
    }

    /// Whether the caller may have recorded its span (the sampled flag).
    pub fn sampled(&self) -> bool {
        self.flags & FLAG_SAMPLED != 0
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The parent span id as 16 lowercase hex digits.
    pub fn parent_id_hex(&self) -> String {
        hex(&self.parent_id)
    }
}

impl fmt::Display for TraceParent {
    /// The version-00 header value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{}-{}-{:02x}", hex(&self.trace_id), hex(&self.parent_id), self.flags)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Two lowercase hex digits as a byte.
fn hex_byte(pair: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(*pair.first()?)? << 4 | digit(*pair.get(1)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn check(text: &str, expected: Result<&str, &str>) {
        match (TraceParent::parse(text), expected) {
            (Ok(tp), Ok(shown)) => assert_eq!(tp.to_string(), shown, "{text}"),
            (Err(e), Err(why)) => assert!(e.to_string().contains(why), "{text}: {e}"),
            (got, want) => panic!("{text}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn traceparents_parse_as_the_specification_reads_them() {
        check(GOOD, Ok(GOOD));
        check(&format!(" {GOOD}\t"), Ok(GOOD));
        check(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            Ok("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
        );
        // A later version is read by its version-00 prefix and kept as 00.
        check("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-extra", Ok(GOOD));
        check("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Ok(GOOD));
        check("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Err("version ff"));
        check(&format!("{GOOD}-x"), Err("exactly 55"));
        check("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", Err("follow a '-'"));
        check("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", Err("trace id is not"));
        check("00-00000000000000000000000000000000-00f067aa0ba902b7-01", Err("all zeros"));
        check("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", Err("span id is all zeros"));
        check("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bg-01", Err("span id is not"));
        check("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Err("separated"));
        check("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0", Err("too short"));
        check("", Err("too short"));
        check("zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Err("version"));
        check("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", Err("flags"));
    }

    #[test]
    fn a_generated_traceparent_round_trips_and_says_whether_it_is_sampled() {
        for sampled in [true, false] {
            let tp = TraceParent::generate(sampled);
            assert_eq!(tp.sampled(), sampled);
            assert_eq!(TraceParent::parse(&tp.to_string()), Ok(tp));
            assert_eq!(tp.trace_id_hex().len(), 32);
            assert_eq!(tp.parent_id_hex().len(), 16);
        }
        assert_ne!(TraceParent::generate(true).trace_id, TraceParent::generate(true).trace_id);
    }
}
