//! The hub's certificate authority as operators rotate it: which CA issues, and files replaced
//! with the old ones kept aside.
//!
//! `ca.crt` holds every CA the hub trusts (one, or during a rotation the new and the old);
//! `ca.key` is the key of the one that issues, whose certificate is found in `ca.crt` by its
//! public key (`pki::issuing_cert`), so the two files are all the state a rotation has.

use super::CliError;
use crate::datadir::DataDir;
use std::path::Path;

fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|e| CliError::failure(format!("{}: {e}", path.display())))
}

/// The CA file (every trusted CA, PEM) and the issuing CA's key (PEM), as `pki::issue` takes
/// them.
pub(super) fn issuing_ca(dir: &DataDir) -> Result<(String, String), CliError> {
    Ok((read(&dir.ca_cert())?, read(&dir.ca_key())?))
}

/// The UTC time in the names of files kept aside (`hub.crt.replaced-20260501T120000Z`), as
/// `restore` names a replaced database.
pub(super) fn aside_stamp(now_ms: i64) -> String {
    let f = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    time::OffsetDateTime::from_unix_timestamp(now_ms / 1000)
        .ok()
        .and_then(|t| t.format(&f).ok())
        .unwrap_or_else(|| now_ms.to_string())
}
