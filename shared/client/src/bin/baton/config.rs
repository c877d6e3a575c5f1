//! The connection settings, layered: the TOML file < `BATON_*` environment < flags (clap reads
//! the environment and the flags; this reads the file under them). Each key is declared once,
//! in `FileConfig` and `args::Connection`, with the same name.

use crate::args::Connection;
use baton_client::TlsFiles;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The configuration file's keys; an unknown key is an error naming it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    hub_url: Option<String>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

/// Everything needed to reach the hub as this producer, every key given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    /// `https://HOST:PORT`.
    pub(crate) hub_url: String,
    /// The CA, certificate and key files.
    pub(crate) files: TlsFiles,
}

/// The configuration file used when none is named: `$XDG_CONFIG_HOME/baton/baton.toml`, else
/// `$HOME/.config/baton/baton.toml`; none when neither variable is set.
pub(crate) fn default_path() -> Option<PathBuf> {
    let nonempty = |var: &str| std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from);
    nonempty("XDG_CONFIG_HOME")
        .or_else(|| nonempty("HOME").map(|h| h.join(".config")))
        .map(|dir| dir.join("baton").join("baton.toml"))
}

/// Reads the file (the one named, which must exist, else the default one, if it exists) and
/// lays the environment and flags over it.
pub(crate) fn settings(conn: &Connection) -> Result<Settings, String> {
    let (file, path) = match (&conn.config, default_path()) {
        (Some(named), _) => (read(named)?, Some(named.clone())),
        (None, Some(default)) if default.exists() => (read(&default)?, Some(default)),
        (None, _) => (FileConfig::default(), None),
    };
    let base = path.as_deref().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    let from_file = |p: Option<PathBuf>| p.map(|p| base.join(p));
    let source = match (&path, default_path()) {
        (Some(p), _) => format!("set {{key}} in {}, {{env}} or {{flag}}", p.display()),
        (None, Some(default)) => format!(
            "set {{env}} or {{flag}}, or name a configuration file with --config; none is at the default {}",
            default.display()
        ),
        (None, None) => "set {env} or {flag}, or name a configuration file with --config".to_string(),
    };
    let missing = |key: &str, env: &str, flag: &str| {
        let how = source.replace("{key}", key).replace("{env}", env).replace("{flag}", flag);
        format!("configuration: no {key} ({how})")
    };
    let hub_url =
        conn.hub_url.clone().or(file.hub_url).ok_or_else(|| missing("hub_url", "BATON_HUB_URL", "--hub-url"))?;
    let ca_file = conn
        .ca_file
        .clone()
        .or(from_file(file.ca_file))
        .ok_or_else(|| missing("ca_file", "BATON_CA_FILE", "--ca-file"))?;
    let cert_file = conn
        .cert_file
        .clone()
        .or(from_file(file.cert_file))
        .ok_or_else(|| missing("cert_file", "BATON_CERT_FILE", "--cert-file"))?;
    let key_file = conn
        .key_file
        .clone()
        .or(from_file(file.key_file))
        .ok_or_else(|| missing("key_file", "BATON_KEY_FILE", "--key-file"))?;
    Ok(Settings { hub_url, files: TlsFiles { ca_file, cert_file, key_file } })
}

fn read(path: &Path) -> Result<FileConfig, String> {
    use baton_shared::limits::CONFIG_FILE_BYTES_MAX;
    let text = baton_shared::files::read_text_bounded(path, CONFIG_FILE_BYTES_MAX, "CONFIG_FILE_BYTES_MAX")
        .map_err(|e| format!("configuration: cannot read {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("configuration: {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(config: Option<&Path>) -> Connection {
        Connection {
            config: config.map(Path::to_path_buf),
            hub_url: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
        }
    }

    #[test]
    fn flags_win_over_the_file_and_relative_paths_follow_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("baton.toml");
        std::fs::write(
            &file,
            "hub_url = \"https://a:1\"\nca_file = \"ca.crt\"\ncert_file = \"/abs/p.crt\"\nkey_file = \"p.key\"\n",
        )
        .unwrap();
        let mut c = conn(Some(&file));
        c.key_file = Some(PathBuf::from("flag.key"));
        let s = settings(&c).unwrap();
        assert_eq!(s.hub_url, "https://a:1");
        assert_eq!(s.files.ca_file, dir.path().join("ca.crt"));
        assert_eq!(s.files.cert_file, PathBuf::from("/abs/p.crt"));
        assert_eq!(s.files.key_file, PathBuf::from("flag.key"));
    }

    #[test]
    fn what_is_wrong_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("baton.toml");
        std::fs::write(&file, "hub_url = \"https://a:1\"\ncert = \"x\"\n").unwrap();
        let e = settings(&conn(Some(&file))).unwrap_err();
        assert!(e.contains("unknown field `cert`") && e.contains("baton.toml"), "{e}");
        std::fs::write(&file, "hub_url = \"https://a:1\"\n").unwrap();
        let e = settings(&conn(Some(&file))).unwrap_err();
        assert!(e.contains("no ca_file") && e.contains("BATON_CA_FILE") && e.contains("baton.toml"), "{e}");
        let e = settings(&conn(Some(&dir.path().join("absent.toml")))).unwrap_err();
        assert!(e.contains("cannot read") && e.contains("absent.toml"), "{e}");
    }
}
