//! The hub's record on PostgreSQL: connecting from a `postgres://` URL (with TLS as the URL's
//! `sslmode` says), applying the numbered migrations of `schema/postgres/`, and the connection
//! the store's operations run on.
//!
//! - `mod.rs`: `PgUrl` (the parsed URL, and the form of it that is safe to print), `connect`,
//!   `connect_and_migrate` (and `_blocking`), and `PgError`, the one error type, which names
//!   what is wrong (the URL, the host, the credentials, TLS, the schema) and never carries the
//!   password.
//! - `tls`: `SslMode`, the URL's `sslmode`/`sslrootcert`, and its rustls configuration.
//! - `migrate`: `MIGRATIONS` and `migrate`, in one transaction under an advisory lock,
//!   refusing a schema newer than this binary.
//! - `conn`: `PgConn`, one connection as the store's `Db`, used synchronously (statement cache,
//!   deferred savepoints, the record's write lock, failures classified).
//! - `values`: parameters and columns converted to and from SQLite's storage classes, and the
//!   escaping of NUL in text.
//! - `analyze`: each hub's statistics round, `ANALYZE` on the hot tables as they grow, so
//!   statements are not planned for the empty tables a new record starts with.

pub mod analyze;
pub mod conn;
pub mod migrate;
pub mod tls;
pub mod values;

pub use migrate::{FIRST_ALSO, MIGRATIONS, Migrated, known_version, migrate, schema_version};
pub use tls::SslMode;

use std::time::Duration;
use tokio_postgres::Client;

/// How long a connection attempt waits for the server when the URL sets no `connect_timeout`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the database could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The URL does not parse, or names an option this binary does not support.
    #[error("database URL: {detail}")]
    Url {
        /// What is wrong with it.
        detail: String,
    },
    /// No server answered at the URL's address (refused, unreachable, timed out).
    #[error("cannot reach the database at {url}: {detail}")]
    Unreachable {
        /// The URL, without its password.
        url: String,
        /// What the connection attempt said.
        detail: String,
    },
    /// The server refused the user, the password or the database.
    #[error("the database at {url} refused the login: {detail}")]
    Auth {
        /// The URL, without its password.
        url: String,
        /// What the server said.
        detail: String,
    },
    /// TLS could not be set up: the CA file, the handshake, or the server's certificate.
    #[error("TLS to the database failed: {detail}")]
    Tls {
        /// What failed.
        detail: String,
    },
    /// The database's schema is newer than this binary knows: it is left untouched.
    #[error(
        "the database at {url} has schema version {found}, newer than this binary's {known}; refusing to use it \
         (upgrade the binary)"
    )]
    TooNew {
        /// The URL, without its password.
        url: String,
        /// The version in the database.
        found: i64,
        /// The newest version this binary knows.
        known: i64,
    },
    /// A migration failed; its transaction was rolled back, so the database is as it was.
    #[error("the database at {url}: migration {version} failed: {detail}")]
    Migration {
        /// The URL, without its password.
        url: String,
        /// The migration's number.
        version: i64,
        /// What the server said.
        detail: String,
    },
    /// Any other error from the server or the connection.
    #[error("the database at {url}: {detail}")]
    Other {
        /// The URL, without its password.
        url: String,
        /// What went wrong.
        detail: String,
    },
}

impl PgError {
    /// The process exit status for this error (`baton_shared::exit`): a newer schema is a
    /// refused store (3, like SQLite's), a bad URL is a usage error (2), anything else 4.
    pub fn exit_code(&self) -> u8 {
        use baton_shared::exit;
        match self {
            PgError::TooNew { .. } => exit::REFUSED,
            PgError::Url { .. } => exit::USAGE,
            _ => exit::FAILURE,
        }
    }

    /// Classifies a tokio-postgres error from `url` (shown without its password).
    pub fn from_client(url: &PgUrl, e: &tokio_postgres::Error) -> PgError {
        use tokio_postgres::error::SqlState;
        let url_shown = url.shown().to_owned();
        let detail = describe(e);
        if let Some(code) = e.code() {
            if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                || *code == SqlState::INVALID_CATALOG_NAME
            {
                return PgError::Auth { url: url_shown, detail };
            }
            return PgError::Other { url: url_shown, detail };
        }
        // tokio-postgres does not expose its error kinds; its messages start with them.
        let text = e.to_string();
        if text.starts_with("error performing TLS handshake") {
            PgError::Tls { detail: format!("{url_shown}: {detail}") }
        } else if text.starts_with("error connecting to server") || text.starts_with("timeout waiting for server") {
            PgError::Unreachable { url: url_shown, detail }
        } else if text.starts_with("authentication error") {
            PgError::Auth { url: url_shown, detail }
        } else {
            PgError::Other { url: url_shown, detail }
        }
    }
}

/// The error and its causes on one line (`a: b: c`), the server's message and hint included.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{} ({})", db.message(), db.code().code());
        if let Some(hint) = db.hint() {
            s.push_str("; hint: ");
            s.push_str(hint);
        }
        return s;
    }
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        source = cause.source();
    }
    s
}

/// A parsed `postgres://` (or `postgresql://`) URL: the client configuration, the TLS mode, and
/// the URL as it may be printed (user, host, port and database; never the password).
#[derive(Clone)]
pub struct PgUrl {
    config: tokio_postgres::Config,
    ssl: SslMode,
    shown: String,
    call_wait: Option<Duration>,
    write_idle: Option<Duration>,
    conflict_retries: Option<u32>,
}

impl std::fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgUrl").field("url", &self.shown).field("ssl", &self.ssl).finish()
    }
}

impl PgUrl {
    /// Parses `url`. `sslmode` and `sslrootcert` are read here (tokio-postgres knows neither
    /// `verify-ca`/`verify-full` nor CA files); every other parameter is tokio-postgres's.
    pub fn parse(url: &str) -> Result<PgUrl, PgError> {
        let (base, query) = match url.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (url, None),
        };
        if !(base.starts_with("postgres://") || base.starts_with("postgresql://")) {
            return Err(PgError::Url { detail: "it must start with postgres:// or postgresql://".into() });
        }
        let (mut mode, mut root, mut call_wait, mut write_idle, mut rest) = (None, None, None, None, Vec::new());
        let mut conflict_retries = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "sslmode" => mode = Some(percent_decode(value)?),
                "sslrootcert" => root = Some(percent_decode(value)?),
                "call_timeout" => call_wait = Some(seconds_param("call_timeout", value)?),
                "write_idle_timeout" => write_idle = Some(seconds_param("write_idle_timeout", value)?),
                "conflict_retries" => conflict_retries = Some(retries_param(value)?),
                _ => rest.push(pair),
            }
        }
        let ssl = SslMode::from_params(mode.as_deref(), root.as_deref())?;
        let client_url = if rest.is_empty() { base.to_owned() } else { format!("{base}?{}", rest.join("&")) };
        let mut config: tokio_postgres::Config =
            client_url.parse().map_err(|e: tokio_postgres::Error| PgError::Url { detail: describe(&e) })?;
        config.ssl_mode(ssl.negotiation());
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let shown = shown(&config);
        Ok(PgUrl { config, ssl, shown, call_wait, write_idle, conflict_retries })
    }

    /// The URL without its password: `postgres://USER@HOST:PORT/DB`.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The TLS mode.
    pub fn ssl(&self) -> &SslMode {
        &self.ssl
    }

    /// The URL's `call_timeout` (whole seconds): the longest wait for one round trip to the
    /// server before the connection is taken as lost (`store::engine::PG_CALL_WAIT_MAX` when unset).
    pub fn call_wait(&self) -> Option<Duration> {
        self.call_wait
    }

    /// The URL's `write_idle_timeout` (whole seconds): how long a write transaction may sit
    /// idle, no statement in flight, before the server ends it (`store::engine::PG_WRITE_IDLE_MAX`
    /// when unset). It bounds how long a hub that froze or lost its link while holding the
    /// record's write lock keeps every other hub from writing.
    pub fn write_idle(&self) -> Option<Duration> {
        self.write_idle
    }

    /// The URL's `conflict_retries` (0 to `CONFLICT_RETRIES_MAX`): how many times the hub runs
    /// an operation again after the server ended its transaction in a deadlock or a
    /// serialization failure (`store::engine::PG_CONFLICT_RETRIES` when unset).
    pub fn conflict_retries(&self) -> Option<u32> {
        self.conflict_retries
    }
}

/// `postgres://user@host:port/db` from the parsed configuration (never the password).
fn shown(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            };
            match config.get_ports().get(i).or(config.get_ports().first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    let user = config.get_user().map(|u| format!("{u}@")).unwrap_or_default();
    let db = config.get_dbname().map(|d| format!("/{d}")).unwrap_or_default();
    format!("postgres://{user}{}{db}", hosts.join(","))
}

/// Most seconds `call_timeout` or `write_idle_timeout` may say.
pub const CALL_TIMEOUT_MAX_S: u64 = 3600;

/// Parses the seconds parameter `key`: whole seconds, 1 to `CALL_TIMEOUT_MAX_S`.
fn seconds_param(key: &str, value: &str) -> Result<Duration, PgError> {
    match value.parse::<u64>() {
        Ok(n) if (1..=CALL_TIMEOUT_MAX_S).contains(&n) => Ok(Duration::from_secs(n)),
        _ => Err(PgError::Url {
            detail: format!("{key} must be whole seconds from 1 to {CALL_TIMEOUT_MAX_S}, not {value:?}"),
        }),
    }
}

/// Most times `conflict_retries` may say.
pub const CONFLICT_RETRIES_MAX: u32 = 100;

/// Parses `conflict_retries`: a whole number from 0 to `CONFLICT_RETRIES_MAX`.
fn retries_param(value: &str) -> Result<u32, PgError> {
    match value.parse::<u32>() {
        Ok(n) if n <= CONFLICT_RETRIES_MAX => Ok(n),
        _ => Err(PgError::Url {
            detail: format!("conflict_retries must be a whole number from 0 to {CONFLICT_RETRIES_MAX}, not {value:?}"),
        }),
    }
}

/// Decodes `%XX` escapes in a URL parameter value.
fn percent_decode(s: &str) -> Result<String, PgError> {
    let bad = || PgError::Url { detail: format!("the parameter value {s:?} has a bad %-escape") };
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or_else(bad)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// The I/O half of a connection made by `open`: whoever holds it drives the connection.
type Connection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <tokio_postgres_rustls::MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream,
>;

/// Connects to the database at `url` and hands back both halves, for a caller that must see the
/// server's asynchronous messages (`notify::listen` reads notifications from the connection);
/// everyone else uses `connect`.
pub(crate) async fn open(url: &PgUrl) -> Result<(Client, Connection), PgError> {
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(url.ssl.client_config()?);
    url.config.connect(tls).await.map_err(|e| PgError::from_client(url, &e))
}

/// Connects to the database at `url`. The connection's I/O runs on a spawned task, which ends
/// (logging why, if with an error) when the returned client is dropped or the server goes away.
pub async fn connect(url: &PgUrl) -> Result<Client, PgError> {
    let (client, connection) = open(url).await?;
    let shown = url.shown.clone();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(database = %shown, error = %describe(&e), "database connection ended");
        }
    });
    Ok(client)
}

/// Connects to `url` and applies the migrations (`migrate`: refusing a newer schema), then
/// closes that connection.
pub async fn connect_and_migrate(url: &PgUrl) -> Result<Migrated, PgError> {
    let mut client = connect(url).await?;
    migrate(&mut client, url).await
}

/// `connect_and_migrate` from synchronous code: on a thread and a runtime of its own, so the
/// caller may be anywhere (a store thread, a test); it waits until the migration is done.
pub fn connect_and_migrate_blocking(url: &PgUrl) -> Result<Migrated, PgError> {
    let url = url.clone();
    let other = |detail: String| PgError::Other { url: url.shown().to_string(), detail };
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| other(format!("starting a runtime: {e}")))?;
            rt.block_on(connect_and_migrate(&url))
        })
        .join()
        .map_err(|_| other("the migrating thread panicked".into()))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shown_url_has_no_password() {
        let url = PgUrl::parse("postgres://baton:s3cret@db.example:5433/record?sslmode=require").unwrap();
        assert_eq!(url.shown(), "postgres://baton@db.example:5433/record");
        assert!(!format!("{url:?}").contains("s3cret"));
        assert_eq!(url.ssl(), &SslMode::Require { root: None });
    }

    #[test]
    fn ssl_parameters_are_read_here_and_the_rest_passed_on() {
        let url = PgUrl::parse(
            "postgresql://u@127.0.0.1:1/d?application_name=hub&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(url.ssl(), &SslMode::VerifyFull { root: "/etc/ca.pem".into() });
        assert_eq!(url.config.get_application_name(), Some("hub"));
        assert_eq!(url.config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
    }

    #[test]
    fn a_bad_url_is_a_usage_error_that_names_the_problem() {
        let e = PgUrl::parse("mysql://x").unwrap_err();
        assert_eq!(e.exit_code(), baton_shared::exit::USAGE);
        assert!(e.to_string().contains("postgres://"), "{e}");
        let e = PgUrl::parse("postgres://u:pw@h/d?sslmode=bogus").unwrap_err();
        assert!(e.to_string().contains("sslmode=\"bogus\""), "{e}");
        assert!(!e.to_string().contains("pw"), "{e}");
        let e = PgUrl::parse("postgres://h/d?sslrootcert=%zz&sslmode=require").unwrap_err();
        assert!(e.to_string().contains("%-escape"), "{e}");
        for (key, bad) in [("call_timeout", "0"), ("write_idle_timeout", "3601"), ("write_idle_timeout", "5s")] {
            let e = PgUrl::parse(&format!("postgres://h/d?{key}={bad}")).unwrap_err();
            assert_eq!(e.exit_code(), baton_shared::exit::USAGE);
            assert!(e.to_string().contains(&format!("{key} must be whole seconds from 1 to 3600")), "{e}");
        }
        for bad in ["101", "-1", "x", ""] {
            let e = PgUrl::parse(&format!("postgres://h/d?conflict_retries={bad}")).unwrap_err();
            assert_eq!(e.exit_code(), baton_shared::exit::USAGE);
            assert!(e.to_string().contains("conflict_retries must be a whole number from 0 to 100"), "{e}");
        }
    }

    #[test]
    fn the_baton_timeouts_are_read_here_and_not_passed_on() {
        let url = PgUrl::parse("postgres://h/d?call_timeout=7&write_idle_timeout=2&conflict_retries=0").unwrap();
        assert_eq!(url.call_wait(), Some(Duration::from_secs(7)));
        assert_eq!(url.write_idle(), Some(Duration::from_secs(2)));
        assert_eq!(url.conflict_retries(), Some(0));
        let url = PgUrl::parse("postgres://h/d").unwrap();
        assert_eq!((url.call_wait(), url.write_idle()), (None, None), "unset: the store's defaults");
        assert_eq!(url.conflict_retries(), None);
    }
}
