//! The checks `config check` makes from the files alone: the certificate files, the harness
//! program, the key, the identity and the chain.

use super::{Check, EXPIRY_WARNING, Status};
use crate::config::{Harness, NodeConfig};
use baton_shared::ids::Role;
use baton_shared::pki::{self, PkiError};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::{CertificateError, InconsistentKeys};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// The three files, each parsed or the sentence saying why not.
pub(super) struct Files {
    /// `ca_file`: every certificate in it (more than one during a CA rotation).
    ca: Result<Vec<CertificateDer<'static>>, String>,
    /// `cert_file`: this node's certificate first, then any intermediates.
    certs: Result<Vec<CertificateDer<'static>>, String>,
    /// `key_file`: the private key.
    key: Result<PrivateKeyDer<'static>, String>,
    /// The end of this node's certificate's validity (unix seconds), when it could be read.
    not_after_s: Option<i64>,
}

impl Files {
    pub(super) fn read(config: &NodeConfig) -> Files {
        let certs = |field: &'static str, path: &Path| -> Result<Vec<CertificateDer<'static>>, String> {
            let bytes = read(field, path)?;
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("{field}: {} is not valid PEM ({e})", path.display()))?;
            if certs.is_empty() {
                return Err(format!(
                    "{field}: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----); point {field} at the \
                     file baton-hub enroll wrote",
                    path.display()
                ));
            }
            Ok(certs)
        };
        let key = read("key_file", &config.key_file).and_then(|bytes| {
            PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
                format!(
                    "key_file: {} holds no PEM private key ({e}); point key_file at the NAME.key baton-hub enroll \
                     wrote beside the certificate",
                    config.key_file.display()
                )
            })
        });
        let not_after_s = read("cert_file", &config.cert_file)
            .ok()
            .and_then(|pem| pki::cert_facts(&String::from_utf8_lossy(&pem)).ok())
            .map(|(_, not_after)| not_after);
        Files { ca: certs("ca_file", &config.ca_file), certs: certs("cert_file", &config.cert_file), key, not_after_s }
    }

    /// `files`: ok when all three read and parsed, else every problem.
    pub(super) fn check(&self) -> Check {
        let problems: Vec<&str> = [self.ca.as_ref().err(), self.certs.as_ref().err(), self.key.as_ref().err()]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        let field = if self.ca.is_err() {
            "ca_file"
        } else if self.certs.is_err() {
            "cert_file"
        } else {
            "key_file"
        };
        if problems.is_empty() {
            let n = self.ca.as_ref().map_or(0, Vec::len);
            Check::new(
                "files",
                Status::Ok,
                "ca_file",
                format!("ca_file ({n} CA certificate{}), cert_file and key_file read", if n == 1 { "" } else { "s" }),
            )
        } else {
            Check::new("files", Status::Fail, field, problems.join("; "))
        }
    }
}

/// Reads one of the node's PEM files, at most `PEM_FILE_BYTES_MAX` of it.
pub(super) fn read(field: &'static str, path: &Path) -> Result<Vec<u8>, String> {
    use baton_shared::limits::PEM_FILE_BYTES_MAX;
    baton_shared::files::read_bounded(path, PEM_FILE_BYTES_MAX, "PEM_FILE_BYTES_MAX")
        .map_err(|e| format!("{field}: cannot read {}: {e}", path.display()))
}

/// The detail of a check that needs a file `files` could not read.
fn unread(field: &'static str) -> String {
    format!("not checked: {field} could not be read (see files)")
}

// ---------------------------------------------------------------------------------------------
// harness

/// `harness`: the program in `command[0]`, found as the node finds it when it starts a turn (a
/// name with a slash as it is, relative to the working directory; else the first match on
/// `PATH`), is a file this user may execute.
pub(super) fn harness(config: &NodeConfig) -> Check {
    let fail = |detail: String| Check::new("harness", Status::Fail, "command", detail);
    if config.harness == Harness::Noop {
        return Check::new("harness", Status::Ok, "harness", "harness = noop: turns run in-process, no command to run");
    }
    let Some(program) = config.command.first() else {
        return fail("command: no program given; set command = [\"/path/to/harness\", …]".into());
    };
    if program.contains('/') {
        let path = PathBuf::from(program);
        return match runnable(&path) {
            Ok(()) => Check::new("harness", Status::Ok, "command", format!("command: {program} is executable")),
            Err(why) => {
                let relative = if path.is_relative() {
                    let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default();
                    format!(
                        " (relative to the working directory, here {cwd}; the node's may differ: prefer an absolute path)"
                    )
                } else {
                    String::new()
                };
                fail(format!("command: {program}{relative} {why}"))
            }
        };
    }
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let mut rejected = Vec::new();
    for dir in std::env::split_paths(&path_var) {
        let candidate = dir.join(program);
        if !candidate.exists() {
            continue;
        }
        match runnable(&candidate) {
            Ok(()) => {
                return Check::new(
                    "harness",
                    Status::Ok,
                    "command",
                    format!("command: {program} is {} on PATH, executable", candidate.display()),
                );
            }
            Err(why) => rejected.push(format!("{} {why}", candidate.display())),
        }
    }
    let path_shown = std::env::join_paths(std::env::split_paths(&path_var))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    if rejected.is_empty() {
        fail(format!(
            "command: {program:?} is not found on PATH ({path_shown}); install it there or give its absolute path as \
             the first element of command (the node's service may have another PATH)"
        ))
    } else {
        fail(format!("command: {program:?} on PATH is not runnable: {}", rejected.join("; ")))
    }
}

/// Whether `path` is a regular file this user may execute; the reason, with its fix, if not.
fn runnable(path: &Path) -> Result<(), String> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err("does not exist; install the harness there or fix the first element of command".into());
        }
        Err(e) => return Err(format!("cannot be examined ({e}); check the permissions of its directories")),
    };
    if meta.is_dir() {
        return Err("is a directory, not a program; name the harness executable inside it".into());
    }
    if !meta.is_file() {
        return Err("is not a regular file; name the harness program itself".into());
    }
    match nix::unistd::access(path, nix::unistd::AccessFlags::X_OK) {
        Ok(()) => Ok(()),
        Err(e) => Err(format!(
            "is not executable by this user ({e}); chmod +x it, or run the node as a user allowed to execute it"
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// key

/// `key`: the private key in `key_file` is the one whose public key `cert_file` carries.
pub(super) fn key_matches(config: &NodeConfig, files: &Files) -> Check {
    let fail = |detail: String| Check::new("key", Status::Fail, "key_file", detail);
    let (Ok(certs), Ok(key)) = (&files.certs, &files.key) else {
        let field = if files.certs.is_err() { "cert_file" } else { "key_file" };
        return Check::new("key", Status::Fail, field, unread(field));
    };
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let signing = match provider.key_provider.load_private_key(key.clone_key()) {
        Ok(k) => k,
        Err(e) => {
            return fail(format!(
                "key_file: {} holds a private key this node cannot use ({e}); use the key baton-hub enroll wrote",
                config.key_file.display()
            ));
        }
    };
    let certified = rustls::sign::CertifiedKey::new(certs.clone(), signing);
    match certified.keys_match() {
        Ok(()) => Check::new(
            "key",
            Status::Ok,
            "key_file",
            format!(
                "key_file {} is the private key of cert_file {}",
                config.key_file.display(),
                config.cert_file.display()
            ),
        ),
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => fail(format!(
            "key_file: {} is not the private key of cert_file {} (their public keys differ); point key_file at the \
             key written with this certificate (baton-hub enroll and renew write NAME.key beside NAME.crt)",
            config.key_file.display(),
            config.cert_file.display()
        )),
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => Check::new(
            "key",
            Status::Warn,
            "key_file",
            format!(
                "key_file: cannot tell whether {} belongs to cert_file {} (the key type does not expose its public key)",
                config.key_file.display(),
                config.cert_file.display()
            ),
        ),
        Err(e) => Check::new(
            "key",
            Status::Fail,
            "cert_file",
            format!(
                "cert_file: {} is not a certificate this node can use ({e}); use the NAME.crt baton-hub enroll wrote",
                config.cert_file.display()
            ),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// identity

/// `identity`: the certificate carries exactly one Baton identity, of the node role, with a
/// valid host name: what the hub reads from it.
pub(super) fn identity(config: &NodeConfig, files: &Files) -> Check {
    let Ok(certs) = &files.certs else { return Check::new("identity", Status::Fail, "cert_file", unread("cert_file")) };
    let Some(leaf) = certs.first() else {
        return Check::new("identity", Status::Fail, "cert_file", unread("cert_file"));
    };
    let file = config.cert_file.display();
    let enroll = "enroll this host as a node (baton-hub enroll node HOST --out DIR) and use the certificate it writes";
    let fail = |detail: String| Check::new("identity", Status::Fail, "cert_file", detail);
    match pki::peer_identity(leaf) {
        Ok(id) if id.role == Role::Node => Check::new(
            "identity",
            Status::Ok,
            "cert_file",
            format!(
                "cert_file {file} names the node host {} ({}), serial {}",
                id.name,
                pki::identity_uri(id.role, &id.name),
                id.serial
            ),
        ),
        Ok(id) => fail(format!(
            "cert_file: {file} is a {} certificate ({}), not a node's: the hub refuses it on every node request; {enroll}",
            id.role,
            pki::identity_uri(id.role, &id.name)
        )),
        Err(PkiError::IdentityCount(0)) => fail(format!(
            "cert_file: {file} carries no Baton identity (no {}node:HOST name; a server certificate or one from \
             elsewhere?); {enroll}",
            pki::IDENTITY_URI_PREFIX
        )),
        Err(e) => fail(format!("cert_file: {file}: {e}; {enroll}")),
    }
}

// ---------------------------------------------------------------------------------------------
// ca

/// `ca`: the certificate chains to a CA in `ca_file` as the hub verifies client certificates,
/// and `now_ms` is inside its validity window; a warning when it ends within `EXPIRY_WARNING`.
pub(super) fn chain(config: &NodeConfig, files: &Files, now_ms: i64) -> Check {
    let (Ok(ca), Ok(certs)) = (&files.ca, &files.certs) else {
        let field = if files.ca.is_err() { "ca_file" } else { "cert_file" };
        return Check::new("ca", Status::Fail, field, unread(field));
    };
    let Some((leaf, intermediates)) = certs.split_first() else {
        return Check::new("ca", Status::Fail, "cert_file", unread("cert_file"));
    };
    let (cert, ca_file) = (config.cert_file.display(), config.ca_file.display());
    let fail = |field: &'static str, detail: String| Check::new("ca", Status::Fail, field, detail);
    let mut roots = rustls::RootCertStore::empty();
    for c in ca {
        if let Err(e) = roots.add(c.clone()) {
            return fail("ca_file", format!("ca_file: {ca_file} holds a certificate that is not a usable CA ({e})"));
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = match rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build()
    {
        Ok(v) => v,
        Err(e) => return fail("ca_file", format!("ca_file: {ca_file} cannot verify certificates ({e})")),
    };
    let now = UnixTime::since_unix_epoch(Duration::from_millis(u64::try_from(now_ms).unwrap_or(0)));
    let verified = verifier.verify_client_cert(leaf, intermediates, now);
    let renew = "renew it (baton-hub renew HOST --out DIR), put the new files in place and send the node SIGHUP";
    match verified {
        Ok(_) => {}
        Err(rustls::Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. })) => {
            let when =
                files.not_after_s.map_or(String::new(), |end| format!(" on {} ({} ago)", date(end), ago(now_ms, end)));
            return fail("cert_file", format!("cert_file: {cert} expired{when}; {renew}"));
        }
        Err(rustls::Error::InvalidCertificate(CertificateError::NotValidYetContext { not_before, .. })) => {
            let start = i64::try_from(not_before.as_secs()).unwrap_or(i64::MAX);
            return fail(
                "cert_file",
                format!(
                    "cert_file: {cert} is not valid yet: not before {} (now is {}); check this host's clock, or wait",
                    date(start),
                    date(now_ms / 1000)
                ),
            );
        }
        Err(rustls::Error::InvalidCertificate(CertificateError::NotValidYet)) => {
            return fail(
                "cert_file",
                format!(
                    "cert_file: {cert} is not valid yet (now is {}); check this host's clock, or wait",
                    date(now_ms / 1000)
                ),
            );
        }
        // BadSignature: an issuer of the same name, but not this CA's key.
        Err(rustls::Error::InvalidCertificate(
            e @ (CertificateError::UnknownIssuer | CertificateError::BadSignature),
        )) => {
            return fail(
                "cert_file",
                format!(
                    "cert_file: {cert} is not signed by the CA in ca_file {ca_file} ({e:?}): use the ca.crt of \
                     the hub that enrolled this host, or enroll the host at this hub"
                ),
            );
        }
        Err(e) => {
            return fail(
                "cert_file",
                format!("cert_file: {cert} does not verify against ca_file {ca_file} ({e}); enroll the host again"),
            );
        }
    }
    let Some(not_after) = files.not_after_s else {
        return Check::new(
            "ca",
            Status::Ok,
            "cert_file",
            format!("cert_file {cert} verifies against ca_file {ca_file}"),
        );
    };
    let left_s = not_after.saturating_sub(now_ms / 1000);
    let left = humantime::format_duration(Duration::from_secs(u64::try_from(left_s).unwrap_or(0)));
    if Duration::from_secs(u64::try_from(left_s).unwrap_or(0)) < EXPIRY_WARNING {
        return Check::new(
            "ca",
            Status::Warn,
            "cert_file",
            format!(
                "cert_file: {cert} verifies against ca_file {ca_file} but expires on {} (in {left}); {renew}",
                date(not_after)
            ),
        );
    }
    Check::new(
        "ca",
        Status::Ok,
        "cert_file",
        format!("cert_file {cert} verifies against ca_file {ca_file}; valid until {}", date(not_after)),
    )
}

/// A unix time in seconds as an RFC 3339 UTC date.
fn date(unix_s: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(u64::try_from(unix_s).unwrap_or(0));
    humantime::format_rfc3339_seconds(t).to_string()
}

/// How long ago `then_s` was at `now_ms`, in whole seconds, human.
fn ago(now_ms: i64, then_s: i64) -> String {
    let s = (now_ms / 1000).saturating_sub(then_s).max(0);
    humantime::format_duration(Duration::from_secs(u64::try_from(s).unwrap_or(0))).to_string()
}
