//! The one way `baton-node` writes to stdout. A reader that goes away early
//! (`baton-node status | head -1`) closes the pipe; `println!` would panic on the broken pipe,
//! while `print` treats it as a quiet end of the command.

use std::io::{ErrorKind, Write};

/// Writes `text` to stdout and flushes it. A closed stdout (broken pipe) is not an error: the
/// reader has seen all it wanted, and the command ends normally.
pub fn print(text: &str) -> std::io::Result<()> {
    write_quietly(&mut std::io::stdout().lock(), text)
}

/// Writes `text` to `out` and flushes it, treating a broken pipe as success.
pub fn write_quietly(out: &mut impl Write, text: &str) -> std::io::Result<()> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose reader is gone (or that fails otherwise).
    struct Closed(ErrorKind);

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(self.0.into())
        }
    }

    #[test]
    fn a_broken_pipe_is_a_quiet_end_and_other_errors_are_errors() {
        assert!(write_quietly(&mut Closed(ErrorKind::BrokenPipe), "text\n").is_ok());
        assert!(write_quietly(&mut Closed(ErrorKind::PermissionDenied), "text\n").is_err());
        let mut buf = Vec::new();
        write_quietly(&mut buf, "text\n").unwrap();
        assert_eq!(buf, b"text\n");
    }
}
