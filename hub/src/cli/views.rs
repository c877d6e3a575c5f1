//! What the CLI's commands show that is not a record's row: facts read from the data directory
//! (which CA issued a certificate) and about the record (its size against its bound), shared by
//! the commands that gather them and `output`, which prints them.

/// Which CA issued a certificate, as `certs list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct IssuedBy {
    /// The issuing CA's key identifier (hex); `None` when no copy of the certificate was kept
    /// (issued before the hub kept them).
    pub(super) key_id: Option<String>,
    /// Whether that CA is in `ca.crt` (false once `ca retire-old` dropped it).
    pub(super) trusted: bool,
}

impl std::fmt::Display for IssuedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.key_id {
            None => f.write_str("-"),
            Some(k) if self.trusted => write!(f, "{}", &k[..k.len().min(KEY_ID_SHOWN_CHARS)]),
            Some(k) => write!(f, "{} (retired)", &k[..k.len().min(KEY_ID_SHOWN_CHARS)]),
        }
    }
}

/// How much of a CA's key identifier the `certs list` table shows (JSON has all of it).
const KEY_ID_SHOWN_CHARS: usize = 8;

/// The record's size against its bound, as `status` shows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct StoreSize {
    /// The bytes the record takes (`store::views::read::store_bytes`).
    pub(super) bytes: u64,
    /// `limits.store_bytes_max`.
    pub(super) bytes_max: u64,
}
