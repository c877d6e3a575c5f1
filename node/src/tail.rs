//! The end of a harness's stderr, kept for its attempt's report (`stderr_tail_bytes`).
//!
//! `Tail` is fed every byte the harness writes to stderr and keeps only the last ones, in
//! memory bounded by twice its limit; `finish` gives the text of at most the limit's bytes,
//! starting on a UTF-8 character boundary (a character cut at the front is dropped whole), with
//! how many bytes the harness wrote before it. Bytes that are not UTF-8 become U+FFFD, as the
//! log shows them, and still the text never passes the limit: each replacement counts its own
//! three bytes, and what no longer fits is counted as dropped.

/// The end of one attempt's stderr, as reported (`stderr_tail`, `stderr_dropped_bytes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StderrTail {
    /// The last bytes, as text: at most the limit's bytes.
    pub text: String,
    /// How many bytes the harness wrote before `text` (0: `text` is all of it).
    pub dropped_bytes: u64,
}

/// The last bytes of a stream, at most `max` of them kept for the text.
#[derive(Debug)]
pub struct Tail {
    max: usize,
    kept: Vec<u8>,
    total: u64,
}

impl Tail {
    /// A tail that keeps at most `max` bytes (0 keeps nothing: `finish` gives none).
    pub fn new(max: usize) -> Tail {
        Tail { max, kept: Vec::new(), total: 0 }
    }

    /// Takes the next bytes of the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.max == 0 {
            return;
        }
        if bytes.len() >= self.max {
            self.kept.clear();
            self.kept.extend_from_slice(&bytes[bytes.len() - self.max..]);
            return;
        }
        self.kept.extend_from_slice(bytes);
        // Trimmed in steps of `max`, so each byte is moved a bounded number of times.
        if self.kept.len() > 2 * self.max {
            self.kept.drain(..self.kept.len() - self.max);
        }
    }

    /// The tail, or `None` when the stream was empty or the limit is 0.
    pub fn finish(self) -> Option<StderrTail> {
        if self.total == 0 || self.max == 0 {
            return None;
        }
        let mut raw = &self.kept[self.kept.len().saturating_sub(self.max)..];
        // A character whose first bytes were dropped is dropped whole.
        if (raw.len() as u64) < self.total {
            let partial = raw.iter().take(3).take_while(|b| (**b & 0xC0) == 0x80).count();
            raw = &raw[partial..];
        }
        // Each character with the offset of its bytes in `raw`; an invalid sequence is one U+FFFD.
        let mut chars: Vec<(usize, char)> = Vec::with_capacity(raw.len());
        let mut at = 0;
        for chunk in raw.utf8_chunks() {
            for c in chunk.valid().chars() {
                chars.push((at, c));
                at += c.len_utf8();
            }
            if !chunk.invalid().is_empty() {
                chars.push((at, char::REPLACEMENT_CHARACTER));
                at += chunk.invalid().len();
            }
        }
        // The last characters whose text fits in `max` bytes.
        let mut bytes = 0;
        let mut first = chars.len();
        while first > 0 && bytes + chars[first - 1].1.len_utf8() <= self.max {
            first -= 1;
            bytes += chars[first].1.len_utf8();
        }
        let start = chars.get(first).map_or(raw.len(), |(offset, _)| *offset);
        let text: String = chars[first..].iter().map(|(_, c)| c).collect();
        let kept = (raw.len() - start) as u64;
        Some(StderrTail { text, dropped_bytes: self.total - kept })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `parts` in order to a tail of `max` bytes.
    fn tail(max: usize, parts: &[&[u8]]) -> Option<StderrTail> {
        let mut t = Tail::new(max);
        for p in parts {
            t.push(p);
        }
        t.finish()
    }

    fn of(text: &str, dropped_bytes: u64) -> Option<StderrTail> {
        Some(StderrTail { text: text.into(), dropped_bytes })
    }

    #[test]
    fn a_short_stream_is_kept_whole() {
        assert_eq!(tail(16, &[b"one\n", b"two\n"]), of("one\ntwo\n", 0));
        assert_eq!(tail(8, &[b"12345678"]), of("12345678", 0));
        assert_eq!(tail(16, &[]), None, "nothing written, no tail");
        assert_eq!(tail(16, &[b""]), None);
        assert_eq!(tail(0, &[b"anything"]), None, "a limit of 0 keeps none");
    }

    #[test]
    fn a_long_stream_keeps_exactly_its_last_bytes_and_counts_the_rest() {
        assert_eq!(tail(4, &[b"abcdefgh"]), of("efgh", 4));
        assert_eq!(tail(4, &[b"ab", b"cd", b"ef", b"gh", b"i"]), of("fghi", 5));
        // Many small writes past twice the limit, and one write larger than it.
        let many: Vec<&[u8]> = std::iter::repeat_n(&b"xy"[..], 1000).collect();
        assert_eq!(tail(5, &many), of("yxyxy", 1995));
        let big = vec![b'z'; 100_000];
        assert_eq!(tail(3, &[b"head", &big, b"END"]), of("END", 100_004));
    }

    #[test]
    fn the_cut_falls_on_a_character_boundary() {
        // "é" is two bytes, "😀" four: the last 5 bytes of "aé😀" start inside "é".
        assert_eq!(tail(5, &["aé😀".as_bytes()]), of("😀", 3));
        assert_eq!(tail(6, &["aé😀".as_bytes()]), of("é😀", 1));
        // Split across writes the same.
        let bytes = "xx😀😀".as_bytes();
        assert_eq!(tail(6, &[&bytes[..3], &bytes[3..7], &bytes[7..]]), of("😀", 6));
        // A limit smaller than the last character keeps none of it, and says so.
        assert_eq!(tail(3, &["ab😀".as_bytes()]), of("", 6));
        for max in 1..12 {
            let t = tail(max, &["é😀aé".as_bytes()]).unwrap();
            assert!(t.text.len() <= max, "{max}: {t:?}");
            assert_eq!(t.text.len() as u64 + t.dropped_bytes, "é😀aé".len() as u64, "{max}: {t:?}");
            assert!("é😀aé".ends_with(&t.text), "{max}: {t:?}");
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_are_replaced_within_the_limit() {
        assert_eq!(tail(16, &[b"ok \xff end"]), of("ok \u{fffd} end", 0));
        // One invalid byte becomes three bytes of text: the limit still holds, the rest is
        // counted.
        let t = tail(4, &[b"ab\xffc"]).unwrap();
        assert_eq!(t, StderrTail { text: "\u{fffd}c".into(), dropped_bytes: 2 });
        // A stray continuation byte at the very start of a stream kept whole is the harness's.
        assert_eq!(tail(8, &[b"\x80x"]), of("\u{fffd}x", 0));
    }
}
