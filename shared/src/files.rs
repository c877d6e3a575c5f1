//! Reading a file whose path a user gave (a configuration file, a CA, certificate or key file,
//! a payload file), within a bound: at most the bound and one byte more are ever read, so a
//! path such as `/dev/zero`, or a file that is not what its setting says, fails at once with
//! an error naming the bound instead of filling memory. The bounds are the `…_FILE_BYTES_MAX`
//! constants of `limits`; the caller names the file in its own message, as it does for any
//! other I/O error, and this module's error names the bound.

use std::io::Read;
use std::path::Path;

/// Why a bounded read stopped: the file (or stream) holds more than its bound. Carried inside
/// the `std::io::Error` (kind `FileTooLarge`) the readers return.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("larger than {bound} ({}); read no further", shown(*max_bytes))]
pub struct TooLarge {
    /// The bound's name, as `limits` declares it (`PEM_FILE_BYTES_MAX`).
    pub bound: &'static str,
    /// Its value.
    pub max_bytes: u64,
}

/// The whole of `path`, when it holds at most `max_bytes` (`bound` names that constant);
/// reads no more than `max_bytes + 1` bytes either way.
pub fn read_bounded(path: &Path, max_bytes: u64, bound: &'static str) -> std::io::Result<Vec<u8>> {
    read_all_bounded(std::fs::File::open(path)?, max_bytes, bound)
}

/// `read_bounded` as UTF-8 text (invalid UTF-8 is an `InvalidData` error, as
/// `std::fs::read_to_string` says it).
pub fn read_text_bounded(path: &Path, max_bytes: u64, bound: &'static str) -> std::io::Result<String> {
    text(read_bounded(path, max_bytes, bound)?)
}

/// All of `reader` (standard input, say), when it yields at most `max_bytes`; reads no more
/// than `max_bytes + 1` bytes either way.
pub fn read_all_bounded(reader: impl Read, max_bytes: u64, bound: &'static str) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader.take(max_bytes.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(std::io::Error::new(std::io::ErrorKind::FileTooLarge, TooLarge { bound, max_bytes }));
    }
    Ok(bytes)
}

/// `read_all_bounded` as UTF-8 text.
pub fn read_all_text_bounded(reader: impl Read, max_bytes: u64, bound: &'static str) -> std::io::Result<String> {
    text(read_all_bounded(reader, max_bytes, bound)?)
}

fn text(bytes: Vec<u8>) -> std::io::Result<String> {
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "stream did not contain valid UTF-8"))
}

/// A bound as people read it: `1 MiB (1048576 bytes)`, or `N bytes`.
fn shown(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    match bytes {
        0 => "0 bytes".to_string(),
        b if b % MIB == 0 => format!("{} MiB = {b} bytes", b / MIB),
        b if b % KIB == 0 => format!("{} KiB = {b} bytes", b / KIB),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file within its bound is read whole; one byte over is refused naming the bound; an
    /// endless file is refused after the bound and one byte, not read to its end.
    #[test]
    fn reads_stop_at_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        assert_eq!(read_bounded(&path, 10, "TEN_BYTES_MAX").unwrap(), b"0123456789");
        let e = read_bounded(&path, 9, "NINE_BYTES_MAX").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::FileTooLarge);
        assert_eq!(e.to_string(), "larger than NINE_BYTES_MAX (9 bytes); read no further");
        let e = read_text_bounded(Path::new("/dev/zero"), 1024 * 1024, "PEM_FILE_BYTES_MAX").unwrap_err();
        assert_eq!(e.to_string(), "larger than PEM_FILE_BYTES_MAX (1 MiB = 1048576 bytes); read no further");
        // An endless reader: counted, it is read only to the bound and one byte more.
        let mut counted = 0u64;
        let endless = std::io::repeat(b'x').take(u64::MAX);
        let counting = CountingReader { inner: endless, read: &mut counted };
        assert!(read_all_bounded(counting, 4096, "FOUR_KIB_MAX").is_err());
        assert_eq!(counted, 4097);
        assert_eq!(read_all_text_bounded(&b"ok"[..], 2, "TWO").unwrap(), "ok");
        let e = read_all_text_bounded(&[0xff_u8][..], 2, "TWO").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(
            read_bounded(&dir.path().join("absent"), 1, "ONE").unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
    }

    struct CountingReader<'a, R> {
        inner: R,
        read: &'a mut u64,
    }

    impl<R: Read> Read for CountingReader<'_, R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            *self.read += n as u64;
            Ok(n)
        }
    }
}
