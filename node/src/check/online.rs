//! `config check --online`: one authenticated read that changes nothing, against every hub URL,
//! and what each kind of failure means for the operator.

use super::offline::read;
use super::{CHECK_INSTANCE_ID, Check, Status};
use crate::config::NodeConfig;
use baton_client::limits::{CONNECT_TIMEOUT, REQUEST_TIMEOUT};
use rustls::AlertDescription;

/// Why the online check failed: the three answers an operator acts on differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// Nothing answered at `hub_url` (refused, unresolvable, timed out).
    Unreachable,
    /// Something answered, but TLS with it failed on our side (the hub's certificate does not
    /// verify against `ca_file`, or it does not speak TLS).
    Tls,
    /// The hub refused this node's certificate (in the handshake, or with 401/403).
    Refused,
}

impl Failure {
    pub(super) fn lead(self, url: &str) -> String {
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
pub(super) fn combined(mut each: Vec<(Check, bool)>) -> Check {
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
pub(super) fn answered(url: &str, status: u16, body: &[u8]) -> Check {
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
pub(super) fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
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

pub(super) fn tls_failure(config: &NodeConfig, e: &rustls::Error) -> (Failure, String) {
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
