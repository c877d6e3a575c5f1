//! What `baton-node config check` proves about a configuration before a node runs with it, and
//! what `baton-node run` refuses to start without.
//!
//! Offline, from the files alone: the three certificate files read and hold PEM (`files`); the
//! harness program can be run as the node runs it (`harness`); the private key belongs to the
//! certificate (`key`); the certificate names a node (`identity`); it chains to `ca_file` and is
//! inside its validity window, with a warning when it ends soon (`ca`). With `--online`, one
//! authenticated read that changes nothing proves the hub answers and takes this certificate as
//! a node's (`hub`).
//!
//! Each check ends `ok`, `warn` or `fail` with a sentence naming the key, the file, what is wrong
//! and how to fix it. `run` applies the checks a node could never work without (`files`,
//! `harness`, `key`, `identity`) and stops on the first failure with the same sentence
//! (`ConfigError::Check`, exit status 2), so a producer certificate or a mismatched key never
//! reaches the hub's refusals. Validity is left to the hub at run time: a certificate renewed
//! in place is picked up on SIGHUP.
//!
//! Time is passed in (`now_ms`), so expiry is tested without waiting.

use crate::config::{ConfigError, Harness, NodeConfig};
use baton_client::limits::{CONNECT_TIMEOUT, REQUEST_TIMEOUT};
use baton_shared::ids::Role;
use baton_shared::pki::{self, PkiError};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::{AlertDescription, CertificateError, InconsistentKeys};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// A certificate that ends sooner than this after the check is a warning: time to renew it.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// The instance id the online check reads holdings for. It never claims anything, so the hub
/// answers with an empty list and binds nothing to it.
const CHECK_INSTANCE_ID: &str = "config-check";

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Proved.
    Ok,
    /// Works now, but needs attention soon (a certificate close to its end).
    Warn,
    /// Will not work as configured.
    Fail,
}

impl Status {
    /// The word in `--json` (`ok`, `warn`, `fail`).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }

    /// The word in the human listing (`ok`, `warn`, `FAIL`).
    fn shown(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Which check: `files`, `harness`, `key`, `identity`, `ca` or `hub`.
    pub name: &'static str,
    /// How it ended.
    pub status: Status,
    /// The configuration key it concerns most (`cert_file`, `command`…), for the one-line error.
    pub field: &'static str,
    /// What was proved, or what is wrong and how to fix it; names the key and the file.
    pub detail: String,
}

impl Check {
    fn new(name: &'static str, status: Status, field: &'static str, detail: impl Into<String>) -> Check {
        Check { name, status, field, detail: detail.into() }
    }
}

/// Every check of one `config check` run, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The checks in the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether no check failed (warnings pass).
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The first failure as the error `config check` exits 2 with, naming how many more there
    /// are; `None` when nothing failed.
    pub fn error(&self) -> Option<ConfigError> {
        self.error_listed("above")
    }

    /// The first failure, naming how many more there are and where they are `listed`.
    fn error_listed(&self, listed: &str) -> Option<ConfigError> {
        let mut failed = self.checks.iter().filter(|c| c.status == Status::Fail);
        let first = failed.next()?;
        let more = failed.count();
        let detail = match more {
            0 => first.detail.clone(),
            n => format!("{} (and {n} more failed check{} {listed})", first.detail, if n == 1 { "" } else { "s" }),
        };
        Some(ConfigError::Check { field: first.field, detail })
    }

    /// One line per check (`ok`/`warn`/`FAIL`, its name, its detail with control characters
    /// escaped), then a verdict line.
    pub fn human(&self, config: &NodeConfig) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!("{:<5} {:<9} {}\n", c.status.shown(), c.name, escaped(&c.detail)));
        }
        let failed = self.checks.iter().filter(|c| c.status == Status::Fail).count();
        if failed == 0 {
            out.push_str(&format!(
                "configuration is valid ({} {}, data dir {})\n",
                if config.hub_url.urls().len() == 1 { "hub" } else { "hubs" },
                escaped(&config.hub_url.urls().join(", ")),
                escaped(&config.data_dir.display().to_string())
            ));
        } else {
            out.push_str(&format!("configuration is not valid: {failed} of {} checks failed\n", self.checks.len()));
        }
        out
    }

    /// `{"checks": [{"name", "status", "detail"}], "ok"}`.
    pub fn json(&self) -> serde_json::Value {
        let checks: Vec<serde_json::Value> = self
            .checks
            .iter()
            .map(|c| serde_json::json!({"name": c.name, "status": c.status.as_str(), "detail": c.detail}))
            .collect();
        serde_json::json!({"checks": checks, "ok": self.ok()})
    }
}

/// Control characters (a terminal escape in a file name or a server's message) shown escaped.
fn escaped(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// The offline checks at `now_ms` (unix milliseconds): `files`, `harness`, `key`, `identity`,
/// `ca`.
pub fn offline(config: &NodeConfig, now_ms: i64) -> Report {
    let files = Files::read(config);
    let checks = vec![
        files.check(),
        harness(config),
        key_matches(config, &files),
        identity(config, &files),
        chain(config, &files, now_ms),
    ];
    Report { checks }
}

/// What `run` refuses to start without: the `files`, `harness`, `key` and `identity` checks,
/// the first failure as its error (the same sentence `config check` prints).
pub fn before_run(config: &NodeConfig) -> Result<(), ConfigError> {
    let files = Files::read(config);
    let checks = [files.check(), harness(config), key_matches(config, &files), identity(config, &files)];
    // `run` prints no list of checks, so the rest are pointed at where they are listed.
    match (Report { checks: checks.to_vec() }).error_listed("listed by `baton-node config check`") {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

// ---------------------------------------------------------------------------------------------
// files

/// The three files, each parsed or the sentence saying why not.
struct Files {
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
    fn read(config: &NodeConfig) -> Files {
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
    fn check(&self) -> Check {
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
fn read(field: &'static str, path: &Path) -> Result<Vec<u8>, String> {
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
fn harness(config: &NodeConfig) -> Check {
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
fn key_matches(config: &NodeConfig, files: &Files) -> Check {
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
fn identity(config: &NodeConfig, files: &Files) -> Check {
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
fn chain(config: &NodeConfig, files: &Files, now_ms: i64) -> Check {
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

// ---------------------------------------------------------------------------------------------
// hub (--online)

/// Why the online check failed: the three answers an operator acts on differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Nothing answered at `hub_url` (refused, unresolvable, timed out).
    Unreachable,
    /// Something answered, but TLS with it failed on our side (the hub's certificate does not
    /// verify against `ca_file`, or it does not speak TLS).
    Tls,
    /// The hub refused this node's certificate (in the handshake, or with 401/403).
    Refused,
}

impl Failure {
    fn lead(self, url: &str) -> String {
        match self {
            Failure::Unreachable => format!("hub_url: the hub at {url} is unreachable"),
            Failure::Tls => format!("hub_url: TLS with {url} failed"),
            Failure::Refused => format!("hub_url: the hub at {url} refused this node's certificate"),
        }
    }
}

/// `hub` (`--online`): one `GET /v1/holdings` (a read for an instance that holds nothing, so it
/// changes nothing on the hub) over mTLS with the configured files, as the node would send it,
/// to every hub of `hub_url`. Proves each hub answers and accepts this certificate as a node's;
/// a refused certificate, an unreachable hub and a TLS failure read differently.
///
/// With one hub, that hub's verdict. With several, one check saying which answered, each hub's
/// verdict in list order: it fails when any hub refused the certificate or failed TLS (a
/// mistake the node would meet after a move) or when none answered; an unreachable hub while
/// another answered is a warning (a standby not up yet: the node works, and moves to it only
/// when it answers).
pub async fn online(config: &NodeConfig) -> Check {
    let mut asks = tokio::task::JoinSet::new();
    for (i, url) in config.hub_url.urls().iter().enumerate() {
        let (config, url) = (config.clone(), url.clone());
        asks.spawn(async move { (i, online_one(&config, &url).await) });
    }
    let mut each: Vec<Option<(Check, bool)>> = vec![None; config.hub_url.urls().len()];
    while let Some(joined) = asks.join_next().await {
        match joined {
            Ok((i, verdict)) => each[i] = Some(verdict),
            Err(e) => return Check::new("hub", Status::Fail, "hub_url", format!("hub_url: the check failed ({e})")),
        }
    }
    let each: Vec<(Check, bool)> = each.into_iter().flatten().collect();
    combined(each)
}

/// The one `hub` check of several hubs' verdicts (each with whether the hub was unreachable),
/// in list order; one hub's verdict as it is.
fn combined(mut each: Vec<(Check, bool)>) -> Check {
    if each.len() == 1 {
        return each.remove(0).0;
    }
    let answered = each.iter().filter(|(c, _)| c.status == Status::Ok).count();
    let wrong = each.iter().find(|(c, unreachable)| c.status == Status::Fail && !unreachable);
    let (status, field) = match wrong {
        Some((c, _)) => (Status::Fail, c.field),
        None if answered == 0 => (Status::Fail, "hub_url"),
        None if answered < each.len() => (Status::Warn, "hub_url"),
        None => (Status::Ok, "hub_url"),
    };
    let verdicts: Vec<String> = each
        .iter()
        .enumerate()
        .map(|(i, (c, _))| format!("[{}] {}", i + 1, c.detail.trim_start_matches("hub_url: ")))
        .collect();
    let detail = format!("hub_url: {answered} of {} hubs answered: {}", each.len(), verdicts.join("; "));
    Check::new("hub", status, field, detail)
}

/// The online check of the hub at `url`, and whether it was unreachable.
async fn online_one(config: &NodeConfig, url: &str) -> (Check, bool) {
    let fail = |failure: Failure, why: String| {
        let check = Check::new("hub", Status::Fail, "hub_url", format!("{}: {why}", failure.lead(url)));
        (check, failure == Failure::Unreachable)
    };
    let client = match client(config) {
        Ok(c) => c,
        Err(why) => {
            return (Check::new("hub", Status::Fail, "hub_url", format!("hub_url: not contacted: {why}")), false);
        }
    };
    let mut request = match reqwest::Url::parse(&format!("{url}/v1/holdings")) {
        Ok(u) => u,
        Err(e) => {
            let detail = format!("hub_url: {url:?} does not form a URL ({e})");
            return (Check::new("hub", Status::Fail, "hub_url", detail), false);
        }
    };
    request.query_pairs_mut().append_pair("instance_id", CHECK_INSTANCE_ID);
    let answer = match client.get(request).send().await {
        Ok(r) => r,
        Err(e) => {
            let (failure, why) = transport_failure(config, &e);
            return fail(failure, why);
        }
    };
    let status = answer.status().as_u16();
    let body = match answer.bytes().await {
        Ok(b) => b,
        Err(e) => {
            let (failure, why) = transport_failure(config, &e);
            return fail(failure, why);
        }
    };
    (answered(url, status, &body), false)
}

/// The check's verdict on an HTTP answer of the hub at `url` to the holdings read.
fn answered(url: &str, status: u16, body: &[u8]) -> Check {
    if (200..300).contains(&status) {
        return match serde_json::from_slice::<baton_shared::wire::HoldingsResponse>(body) {
            Ok(_) => Check::new(
                "hub",
                Status::Ok,
                "hub_url",
                format!(
                    "hub_url: the hub at {url} answered and accepted this node's certificate (GET /v1/holdings: {status})"
                ),
            ),
            Err(e) => Check::new(
                "hub",
                Status::Fail,
                "hub_url",
                format!(
                    "hub_url: {url} answered {status}, but not as a Baton hub does ({e}); is hub_url the hub's address?"
                ),
            ),
        };
    }
    let (code, message) = match serde_json::from_slice::<baton_shared::wire::ErrorBody>(body) {
        Ok(b) => (b.code, b.message),
        Err(_) => (String::new(), String::from_utf8_lossy(&body[..body.len().min(ERROR_QUOTE_BYTES_MAX)]).into_owned()),
    };
    let said = if code.is_empty() { format!("{status}: {message}") } else { format!("{status} {code}: {message}") };
    if status == 401 || status == 403 {
        let fix = match baton_shared::error::ErrorCode::parse(&code) {
            Some(baton_shared::error::ErrorCode::WrongRole) => {
                "cert_file is not a node certificate: baton-hub enroll node HOST --out DIR"
            }
            Some(baton_shared::error::ErrorCode::CertificateRevoked) => {
                "the certificate was revoked: baton-hub renew HOST --out DIR, then use the files it writes"
            }
            Some(baton_shared::error::ErrorCode::HostRetired) => {
                "the host was retired on the hub; an operator must enroll it again"
            }
            _ => "ask the hub's operator (baton-hub certs list shows this certificate's standing)",
        };
        return Check::new("hub", Status::Fail, "cert_file", format!("{}: {said}; {fix}", Failure::Refused.lead(url)));
    }
    Check::new(
        "hub",
        Status::Fail,
        "hub_url",
        format!(
            "hub_url: the hub at {url} answered but could not serve the check ({said}); try again when it is ready"
        ),
    )
}

/// How much of an answer that is not our error body is quoted.
const ERROR_QUOTE_BYTES_MAX: usize = 200;

/// The client `run` would use: only the CA in `ca_file` trusted, the certificate and key
/// presented, `https` only.
fn client(config: &NodeConfig) -> Result<reqwest::Client, String> {
    let ca = read("ca_file", &config.ca_file)?;
    let mut identity = read("cert_file", &config.cert_file)?;
    identity.push(b'\n');
    identity.extend(read("key_file", &config.key_file)?);
    let ca = reqwest::Certificate::from_pem(&ca).map_err(|e| format!("ca_file: not a PEM certificate ({e})"))?;
    let identity = reqwest::Identity::from_pem(&identity)
        .map_err(|e| format!("cert_file and key_file are not a PEM certificate and its key ({e})"))?;
    reqwest::Client::builder()
        .tls_certs_only([ca])
        .identity(identity)
        .https_only(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot build the TLS client from ca_file, cert_file and key_file ({})", error_chain(&e)))
}

/// TLS alerts with which a server refuses the client's certificate.
const CERTIFICATE_ALERTS: &[AlertDescription] = &[
    AlertDescription::BadCertificate,
    AlertDescription::UnsupportedCertificate,
    AlertDescription::CertificateRevoked,
    AlertDescription::CertificateExpired,
    AlertDescription::CertificateUnknown,
    AlertDescription::UnknownCA,
    AlertDescription::AccessDenied,
    AlertDescription::CertificateRequired,
];

/// Classifies a failed request by what is in its error chain: a rustls error (the handshake),
/// an I/O error (the connection), or reqwest's own kind.
fn transport_failure(config: &NodeConfig, e: &reqwest::Error) -> (Failure, String) {
    let chain = error_chain(e);
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(tls) = rustls_error(c) {
            return tls_failure(config, tls);
        }
        cause = c.source();
    }
    if e.is_timeout() {
        return (
            Failure::Unreachable,
            format!("no answer within {} ({chain})", humantime::format_duration(REQUEST_TIMEOUT)),
        );
    }
    if e.is_connect() {
        return (
            Failure::Unreachable,
            format!("cannot connect ({chain}); is the hub running and listening there, and reachable from this host?"),
        );
    }
    // Under TLS 1.3 a server that refuses the client's certificate may just close the
    // connection after the handshake; the client then sees no alert, only the close.
    (
        Failure::Refused,
        format!(
            "the connection closed without an answer ({chain}); most likely the hub did not accept cert_file {} (its \
             log says why)",
            config.cert_file.display()
        ),
    )
}

/// The rustls error `e` is or wraps. An io::Error's `source` skips the error it wraps, and the
/// TLS connector wraps the handshake's io::Error in another one: look inside each layer.
fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut layer = e;
    for _ in 0..IO_ERROR_LAYERS_MAX {
        if let Some(tls) = layer.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        let inner = layer.downcast_ref::<std::io::Error>()?.get_ref()?;
        layer = inner;
    }
    None
}

/// How many io::Errors wrapped in each other `rustls_error` looks through (two are seen).
const IO_ERROR_LAYERS_MAX: usize = 4;

fn tls_failure(config: &NodeConfig, e: &rustls::Error) -> (Failure, String) {
    match e {
        rustls::Error::AlertReceived(alert) if CERTIFICATE_ALERTS.contains(alert) => (
            Failure::Refused,
            format!(
                "the TLS handshake ended with the alert {alert:?} for cert_file {}: the hub does not take it (signed \
                 by another CA, revoked or expired?); the hub's log says why",
                config.cert_file.display()
            ),
        ),
        rustls::Error::InvalidCertificate(why) => (
            Failure::Tls,
            format!(
                "the hub's server certificate does not verify against ca_file {} ({why:?}); use the ca.crt of this \
                 hub, and a hub_url host that its certificate names",
                config.ca_file.display()
            ),
        ),
        other => (Failure::Tls, format!("{other}; is hub_url the hub's TLS address?")),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Layer;
    use baton_shared::pki::{Issued, LeafKind};
    use std::os::unix::fs::PermissionsExt as _;

    const DAY_MS: i64 = 24 * 3600 * 1000;

    /// A directory with a CA, and a config whose files and command the test points anywhere.
    struct Setup {
        dir: tempfile::TempDir,
        ca: Issued,
    }

    impl Setup {
        fn new() -> Setup {
            Setup { dir: tempfile::tempdir().unwrap(), ca: pki::create_ca("test ca").unwrap() }
        }

        fn leaf(&self, role: Role, name: &str) -> Issued {
            let kind = LeafKind::Client { role, name: name.into(), lifetime: pki::LEAF_VALIDITY_DEFAULT };
            pki::issue(&self.ca.cert_pem, &self.ca.key_pem, &kind).unwrap()
        }

        fn write(&self, name: &str, text: &str) -> PathBuf {
            let p = self.dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        }

        /// A config with `ca.crt`, `cert` and `key` from the directory and `command`.
        fn config(&self, cert: &str, key: &str, command: &str) -> NodeConfig {
            let ca = self.write("ca.crt", &self.ca.cert_pem);
            let mut layer = Layer::default();
            let d = |n: &str| self.dir.path().join(n).display().to_string();
            for (k, v) in [
                ("hub_url", "https://127.0.0.1:1".to_string()),
                ("ca_file", ca.display().to_string()),
                ("cert_file", d(cert)),
                ("key_file", d(key)),
                ("data_dir", d("data")),
                ("command", command.to_string()),
            ] {
                layer.set(k, &v).unwrap();
            }
            NodeConfig::validate(layer).unwrap()
        }

        /// A config of the node `host-a`, valid in every way.
        fn good(&self) -> (NodeConfig, Issued) {
            let leaf = self.leaf(Role::Node, "host-a");
            self.write("n.crt", &leaf.cert_pem);
            self.write("n.key", &leaf.key_pem);
            (self.config("n.crt", "n.key", "sh"), leaf)
        }
    }

    fn find<'a>(report: &'a Report, name: &str) -> &'a Check {
        report.checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no {name} in {report:?}"))
    }

    #[track_caller]
    fn check(report: &Report, name: &str, status: Status, says: &[&str]) {
        let c = find(report, name);
        assert_eq!(c.status, status, "{c:?}");
        for s in says {
            assert!(c.detail.contains(s), "{name}: {:?} does not contain {s:?}", c.detail);
        }
    }

    #[test]
    fn a_good_config_passes_every_check_and_run_starts() {
        let s = Setup::new();
        let (config, leaf) = s.good();
        let report = offline(&config, baton_shared::clock::system_now_ms());
        assert!(report.ok(), "{report:?}");
        let names: Vec<&str> = report.checks.iter().map(|c| c.name).collect();
        assert_eq!(names, ["files", "harness", "key", "identity", "ca"]);
        check(&report, "identity", Status::Ok, &["host-a", &leaf.serial]);
        check(&report, "harness", Status::Ok, &["on PATH"]);
        assert!(report.error().is_none());
        before_run(&config).unwrap();
        let json = report.json();
        assert_eq!(json["ok"], true);
        assert_eq!(
            json["checks"][0],
            serde_json::json!({"name": "files", "status": "ok", "detail": report.checks[0].detail})
        );
        assert!(report.human(&config).contains("\nconfiguration is valid (hub https://127.0.0.1:1"));
    }

    /// The validity window by the injected clock: expired and not yet valid are two messages, and
    /// a certificate ending within `EXPIRY_WARNING` is a warning that passes.
    #[test]
    fn validity_is_judged_at_the_time_given() {
        let s = Setup::new();
        let (config, leaf) = s.good();
        let end_ms = leaf.not_after_unix * 1000;
        let at = |now_ms: i64| offline(&config, now_ms);
        let expired = at(end_ms + 3 * DAY_MS);
        check(&expired, "ca", Status::Fail, &["cert_file", "expired on", "3days ago", "baton-hub renew"]);
        assert!(!expired.ok());
        let early = at(end_ms - 400 * DAY_MS);
        check(&early, "ca", Status::Fail, &["cert_file", "not valid yet", "clock"]);
        let soon = at(end_ms - 10 * DAY_MS);
        check(&soon, "ca", Status::Warn, &["expires on", "10days", "renew"]);
        assert!(soon.ok(), "a warning passes");
        check(&at(end_ms - 31 * DAY_MS), "ca", Status::Ok, &["valid until"]);
        // Validity is the hub's to judge at run time (a renewal arrives by SIGHUP).
        before_run(&config).unwrap();
    }

    #[test]
    fn a_key_of_another_certificate_is_named() {
        let s = Setup::new();
        let (_, _) = s.good();
        let other = s.leaf(Role::Node, "host-b");
        s.write("other.key", &other.key_pem);
        let config = s.config("n.crt", "other.key", "sh");
        let report = offline(&config, baton_shared::clock::system_now_ms());
        check(&report, "key", Status::Fail, &["key_file", "other.key", "n.crt", "public keys differ"]);
        let e = before_run(&config).unwrap_err().to_string();
        assert!(e.starts_with("key_file: ") && e.contains("other.key"), "{e}");
    }

    #[test]
    fn a_producer_certificate_or_one_without_identity_is_refused() {
        let s = Setup::new();
        let prod = s.leaf(Role::Producer, "prod");
        s.write("p.crt", &prod.cert_pem);
        s.write("p.key", &prod.key_pem);
        let config = s.config("p.crt", "p.key", "sh");
        let report = offline(&config, baton_shared::clock::system_now_ms());
        check(
            &report,
            "identity",
            Status::Fail,
            &["cert_file", "producer certificate", "urn:baton:producer:prod", "enroll node"],
        );
        check(&report, "key", Status::Ok, &[]);
        let e = before_run(&config).unwrap_err();
        assert!(matches!(e, ConfigError::Check { field: "cert_file", .. }), "{e}");

        let server = pki::issue(
            &s.ca.cert_pem,
            &s.ca.key_pem,
            &LeafKind::Server { hostnames: vec!["localhost".into()], lifetime: pki::SERVER_VALIDITY },
        )
        .unwrap();
        s.write("s.crt", &server.cert_pem);
        s.write("s.key", &server.key_pem);
        let report = offline(&s.config("s.crt", "s.key", "sh"), baton_shared::clock::system_now_ms());
        check(&report, "identity", Status::Fail, &["carries no Baton identity"]);
    }

    #[test]
    fn a_certificate_of_another_ca_does_not_verify() {
        let s = Setup::new();
        let foreign = Setup::new();
        let leaf = foreign.leaf(Role::Node, "host-a");
        s.write("f.crt", &leaf.cert_pem);
        s.write("f.key", &leaf.key_pem);
        let report = offline(&s.config("f.crt", "f.key", "sh"), baton_shared::clock::system_now_ms());
        check(&report, "ca", Status::Fail, &["cert_file", "f.crt", "not signed by the CA in ca_file", "ca.crt"]);
        check(&report, "identity", Status::Ok, &[]);
    }

    #[test]
    fn unreadable_files_are_named_and_the_checks_needing_them_say_so() {
        let s = Setup::new();
        s.write("junk.crt", "not pem\n");
        let config = s.config("junk.crt", "missing.key", "sh");
        let report = offline(&config, baton_shared::clock::system_now_ms());
        check(
            &report,
            "files",
            Status::Fail,
            &["cert_file", "junk.crt", "holds no PEM certificate", "key_file", "missing.key"],
        );
        check(&report, "key", Status::Fail, &["not checked", "cert_file"]);
        let e = before_run(&config).unwrap_err().to_string();
        assert!(e.starts_with("cert_file: ") && e.contains("and 2 more failed checks"), "{e}");
    }

    #[test]
    fn the_harness_program_is_found_as_the_node_finds_it() {
        let s = Setup::new();
        s.good();
        let script = s.write("harness", "#!/bin/sh\n");
        let at = |command: &str| {
            let report = offline(&s.config("n.crt", "n.key", command), baton_shared::clock::system_now_ms());
            find(&report, "harness").clone()
        };
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = script.display().to_string();
        let c = at(&path);
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("is not executable by this user") && c.detail.contains(&path), "{c:?}");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(at(&path).status, Status::Ok);
        let missing = at(&s.dir.path().join("nope").display().to_string());
        assert!(missing.status == Status::Fail && missing.detail.contains("does not exist"), "{missing:?}");
        let dir = at(&s.dir.path().display().to_string());
        assert!(dir.status == Status::Fail && dir.detail.contains("is a directory"), "{dir:?}");
        let unknown = at("baton-no-such-harness");
        assert!(unknown.status == Status::Fail && unknown.detail.contains("not found on PATH"), "{unknown:?}");
        assert_eq!(at("sh").status, Status::Ok);
        let relative = at("./no-such-harness");
        assert!(relative.detail.contains("relative to the working directory"), "{relative:?}");
    }

    #[test]
    fn the_noop_harness_needs_no_program() {
        let s = Setup::new();
        let (config, _) = s.good();
        let noop = NodeConfig { harness: Harness::Noop, command: Vec::new(), ..config };
        check(&offline(&noop, baton_shared::clock::system_now_ms()), "harness", Status::Ok, &["noop"]);
    }

    /// What the hub answered the holdings read, told apart.
    #[test]
    fn the_hub_answers_are_read() {
        let s = Setup::new();
        let (config, _) = s.good();
        let url = "https://127.0.0.1:1";
        let ok = answered(url, 200, br#"{"deliveries": []}"#);
        assert_eq!(ok.status, Status::Ok, "{ok:?}");
        let producer = answered(
            url,
            403,
            br#"{"code": "wrong_role", "message": "a producer certificate may not use node endpoints"}"#,
        );
        assert!(
            producer.status == Status::Fail
                && producer.detail.contains("refused this node's certificate")
                && producer.detail.contains("enroll node"),
            "{producer:?}"
        );
        let revoked = answered(url, 401, br#"{"code": "certificate_revoked", "message": "revoked"}"#);
        assert!(
            revoked.detail.contains("refused this node's certificate") && revoked.detail.contains("renew"),
            "{revoked:?}"
        );
        let busy = answered(url, 503, b"\x1b[2Jnot ready");
        assert!(busy.status == Status::Fail && busy.detail.contains("could not serve the check"), "{busy:?}");
        let shown = Report { checks: vec![busy] }.human(&config);
        assert!(!shown.contains('\x1b') && shown.contains("\\u{1b}[2J"), "{shown}");
        let other = answered(url, 200, b"<html>");
        assert!(other.status == Status::Fail && other.detail.contains("not as a Baton hub does"), "{other:?}");
    }

    /// The TLS connector wraps the handshake's error in two io::Errors; the rustls error inside
    /// decides between a refused certificate and a TLS failure.
    #[test]
    fn a_handshake_failure_is_found_inside_its_io_errors_and_told_apart() {
        let s = Setup::new();
        let (config, _) = s.good();
        let wrapped = |e: rustls::Error| std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
        let server = wrapped(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer));
        let found = rustls_error(&server).unwrap();
        let (failure, why) = tls_failure(&config, found);
        assert!(failure == Failure::Tls && why.contains("server certificate does not verify"), "{why}");
        let refused = wrapped(rustls::Error::AlertReceived(AlertDescription::CertificateRequired));
        let (failure, why) = tls_failure(&config, rustls_error(&refused).unwrap());
        assert!(failure == Failure::Refused && why.contains("CertificateRequired"), "{why}");
        assert!(rustls_error(&std::io::Error::from(std::io::ErrorKind::ConnectionRefused)).is_none());
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable() {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let s = Setup::new();
        let (config, _) = s.good();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let hub_url = format!("https://127.0.0.1:{port}").parse().unwrap();
        let config = NodeConfig { hub_url, ..config };
        let c = online(&config).await;
        assert!(
            c.status == Status::Fail && c.detail.contains("is unreachable") && c.detail.contains("cannot connect"),
            "{c:?}"
        );
        // Every hub of a list is contacted and named, in order.
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let hub_url = format!("https://127.0.0.1:{port},https://localhost:{other}").parse().unwrap();
        let c = online(&NodeConfig { hub_url, ..config }).await;
        let (first, second) = (
            format!("[1] the hub at https://127.0.0.1:{port} is unreachable"),
            format!("[2] the hub at https://localhost:{other} is unreachable"),
        );
        assert!(c.status == Status::Fail && c.detail.starts_with("hub_url: 0 of 2 hubs answered: "), "{c:?}");
        assert!(c.detail.contains(&first) && c.detail.contains(&second), "{c:?}");
    }

    /// Several hubs' verdicts make one check that says which answered: a standby that does not
    /// answer is a warning while another answers; a hub refusing the certificate fails.
    #[test]
    fn several_hubs_are_judged_together() {
        let ok = |url: &str| (answered(url, 200, br#"{"deliveries": []}"#), false);
        let down = |url: &str| {
            let check = Check::new("hub", Status::Fail, "hub_url", Failure::Unreachable.lead(url));
            (check, true)
        };
        let refused = |url: &str| (answered(url, 401, br#"{"code": "certificate_revoked", "message": "r"}"#), false);
        let (a, b) = ("https://a:1", "https://b:1");
        let c = combined(vec![ok(a), down(b)]);
        assert_eq!((c.status, c.field), (Status::Warn, "hub_url"), "{c:?}");
        assert!(c.detail.starts_with("hub_url: 1 of 2 hubs answered: [1] the hub at https://a:1 answered"), "{c:?}");
        assert!(c.detail.contains("[2] the hub at https://b:1 is unreachable"), "{c:?}");
        assert_eq!(combined(vec![ok(a), ok(b)]).status, Status::Ok);
        assert_eq!(combined(vec![down(a), down(b)]).status, Status::Fail);
        let c = combined(vec![ok(a), refused(b)]);
        assert_eq!((c.status, c.field), (Status::Fail, "cert_file"), "{c:?}");
        // One hub: its own verdict, worded as ever.
        assert_eq!(combined(vec![down(a)]), down(a).0);
    }
}
