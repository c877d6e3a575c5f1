//! `PgCluster`: a throwaway PostgreSQL server for tests, made from the installed server
//! binaries, with its own data directory, port and (optionally) TLS certificate.
//!
//! What it needs: the server binaries (`initdb`, `postgres`, `pg_isready`, `createdb`), found
//! through `PG_BIN` or as the newest `/usr/lib/postgresql/<version>/bin` (Debian's `postgresql`
//! package); `setpriv` (util-linux). PostgreSQL refuses to run as root, so when the tests run as
//! root the server runs as the existing `nobody` user (nothing is created): its directory is
//! made in the temp directory (`TMPDIR`, which `nobody` must be able to traverse) and handed to
//! that user. The server listens on `127.0.0.1` on a free port, its socket in its own directory,
//! with `fsync=on`; the superuser `baton` logs in with a password over TCP.
//!
//! Without the server binaries, `cluster_or_skip` says so and the test is skipped, unless
//! `BATON_REQUIRE_POSTGRES=1`, when it fails.
//!
//! Invariant: a cluster is stopped and its directory removed when it is dropped; one whose test
//! process was killed outright is stopped by the kernel (the server gets SIGKILL when the
//! thread that started it ends, `setpriv --pdeathsig`), and its directory is removed by the
//! next cluster's start (`sweep_leftovers`), so a killed run never blocks a later one.
//! Start a cluster and drop it on the same thread (a test's own thread is right; a
//! short-lived helper thread is not: the server dies with it).

use anyhow::{Context, bail};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Set to `1` to make a missing PostgreSQL a failure instead of a skip (CI sets it).
pub const REQUIRE_ENV: &str = "BATON_REQUIRE_POSTGRES";
/// The directory of the server binaries, when not the newest `/usr/lib/postgresql/*/bin`.
pub const BIN_ENV: &str = "PG_BIN";
/// The superuser the cluster is made with.
pub const USER: &str = "baton";
/// Its password (a test cluster on loopback: nothing to protect).
pub const PASSWORD: &str = "baton-test-password";
/// The database `url` names, created at start.
pub const DATABASE: &str = "baton";
/// How long the server may take to accept connections (initdb and start on a loaded machine).
pub const START_WAIT: Duration = Duration::from_secs(60);
/// How long a stopping server may take before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(10);
/// The temp directory entries of clusters start with this.
const DIR_PREFIX: &str = "baton-pg-";
/// How often `start` tries a fresh port when the one it picked was taken meanwhile.
const PORT_ATTEMPTS_MAX: u32 = 3;
/// The unprivileged user the server runs as when the tests run as root.
const UNPRIVILEGED_USER: &str = "nobody";

/// The directory holding `initdb`, `postgres` and the client programs: `PG_BIN`, else the
/// newest `/usr/lib/postgresql/<version>/bin` that has `initdb`. `None` when there is none.
pub fn server_bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(BIN_ENV) {
        let dir = PathBuf::from(dir);
        return dir.join("initdb").is_file().then_some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// A started cluster for the test `test`, or `None` (after saying why) when no PostgreSQL
/// server is installed and `BATON_REQUIRE_POSTGRES` is not `1`. Panics when the cluster does
/// not start, or when it is required and missing.
pub fn cluster_or_skip(test: &str, tls: bool) -> Option<PgCluster> {
    if !available_or_skip(test) {
        return None;
    }
    Some(PgCluster::start(tls).unwrap_or_else(|e| panic!("{test}: the PostgreSQL test cluster did not start: {e:#}")))
}

/// Whether the PostgreSQL server binaries are installed, for a test `test` that starts its
/// clusters elsewhere (a child test process): `false` (after saying why) when they are not and
/// `BATON_REQUIRE_POSTGRES` is not `1`; panics when they are required and missing.
pub fn available_or_skip(test: &str) -> bool {
    if server_bin_dir().is_some() {
        return true;
    }
    let required = std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1");
    assert!(
        !required,
        "{test}: {REQUIRE_ENV}=1 but no PostgreSQL server binaries were found \
         (install Debian's postgresql package, or set {BIN_ENV})"
    );
    eprintln!("skipping {test}: no PostgreSQL server binaries (install Debian's postgresql package, or set {BIN_ENV})");
    false
}

/// Who the server runs as: this process's user, or `nobody` when that is root.
#[derive(Debug, Clone, Copy)]
struct RunAs {
    ids: Option<(u32, u32)>,
}

impl RunAs {
    fn find() -> anyhow::Result<RunAs> {
        let euid = std::fs::metadata("/proc/self").context("reading /proc/self")?.uid();
        if euid != 0 {
            return Ok(RunAs { ids: None });
        }
        let passwd = std::fs::read_to_string("/etc/passwd").context("reading /etc/passwd")?;
        let line = passwd.lines().find(|l| l.split(':').next() == Some(UNPRIVILEGED_USER)).with_context(|| {
            format!("running as root and there is no {UNPRIVILEGED_USER:?} user to run PostgreSQL as")
        })?;
        let fields: Vec<&str> = line.split(':').collect();
        let uid = fields.get(2).and_then(|f| f.parse().ok()).context("bad uid in /etc/passwd")?;
        let gid = fields.get(3).and_then(|f| f.parse().ok()).context("bad gid in /etc/passwd")?;
        Ok(RunAs { ids: Some((uid, gid)) })
    }

    /// `program` as this user, killed when the calling thread ends, with a scrubbed environment.
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("setpriv");
        if let Some((uid, gid)) = self.ids {
            cmd.arg(format!("--reuid={uid}")).arg(format!("--regid={gid}")).arg("--clear-groups");
        }
        cmd.args(["--pdeathsig", "KILL", "--"]).arg(program);
        cmd.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default());
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Hands `path` to this user (when the server runs as another one).
    fn own(&self, path: &Path) -> anyhow::Result<()> {
        if let Some((uid, gid)) = self.ids {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .with_context(|| format!("chown {}", path.display()))?;
        }
        Ok(())
    }
}

/// A running throwaway PostgreSQL server and its directory.
#[derive(Debug)]
pub struct PgCluster {
    dir: Option<tempfile::TempDir>,
    bin: PathBuf,
    port: u16,
    child: Option<Child>,
    ca_file: Option<PathBuf>,
}

impl PgCluster {
    /// Makes a cluster with `initdb`, starts it and creates `DATABASE`. With `tls`, the server
    /// also speaks TLS with a certificate for `127.0.0.1` and `localhost` from a fresh CA,
    /// whose certificate is `ca_file`.
    pub fn start(tls: bool) -> anyhow::Result<PgCluster> {
        let bin = server_bin_dir().context("no PostgreSQL server binaries")?;
        sweep_leftovers();
        let run_as = RunAs::find()?;
        let dir = tempfile::Builder::new().prefix(DIR_PREFIX).tempdir().context("creating the cluster directory")?;
        std::fs::write(dir.path().join("owner"), std::process::id().to_string())?;
        run_as.own(dir.path())?;
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, PASSWORD)?;
        run_as.own(&pwfile)?;
        let sock = dir.path().join("sock");
        std::fs::create_dir(&sock)?;
        run_as.own(&sock)?;
        let data = dir.path().join("data");

        let out = run_as
            .command(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", USER, "-E", "UTF8", "--no-locale", "--auth-local=trust", "--auth-host=scram-sha-256"])
            // The bootstrap files need not survive a power cut; the server below runs with fsync.
            .arg("--no-sync")
            .arg(format!("--pwfile={}", pwfile.display()))
            .output()
            .context("running initdb")?;
        if !out.status.success() {
            bail!("initdb failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
        }

        let ca_file = if tls { Some(write_certificates(dir.path(), &run_as)?) } else { None };
        let mut cluster = PgCluster { dir: Some(dir), bin, port: 0, child: None, ca_file };
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS_MAX {
            match cluster.run_server(&run_as, free_port()?) {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            return Err(e);
        }
        cluster.create_database(DATABASE)?;
        Ok(cluster)
    }

    fn path(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new("/nonexistent"), |d| d.path())
    }

    /// Starts `postgres` on `port` and waits until it accepts connections.
    fn run_server(&mut self, run_as: &RunAs, port: u16) -> anyhow::Result<()> {
        let dir = self.path().to_owned();
        let log = std::fs::File::create(dir.join("server.log"))?;
        let mut cmd = run_as.command(&self.bin.join("postgres"));
        cmd.arg("-D").arg(dir.join("data")).arg("-p").arg(port.to_string()).arg("-k").arg(dir.join("sock"));
        // Room for several runs at once on one cluster: the crash-point matrix keeps a few
        // two-hub runs in flight, each hub with its writer, readers and notice listener.
        for setting in ["listen_addresses=127.0.0.1", "fsync=on", "logging_collector=off", "max_connections=200"] {
            cmd.arg("-c").arg(setting);
        }
        if self.ca_file.is_some() {
            cmd.args(["-c", "ssl=on"]);
            cmd.arg("-c").arg(format!("ssl_cert_file={}", dir.join("server.crt").display()));
            cmd.arg("-c").arg(format!("ssl_key_file={}", dir.join("server.key").display()));
        }
        let mut child = cmd.stdout(Stdio::null()).stderr(log).spawn().context("starting postgres")?;
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("postgres exited at start ({status}): {}", self.log_tail());
            }
            // Asked through this cluster's own socket directory, never the TCP port: another
            // cluster started at the same moment may have been handed the same free port, and
            // its server answering there must not pass for this one (which then fails to bind
            // and exits, and is tried again on another port).
            let ready = Command::new(self.bin.join("pg_isready"))
                .arg("-q")
                .arg("-h")
                .arg(dir.join("sock"))
                .args(["-t", "1", "-p", &port.to_string()])
                .env_clear()
                .status()
                .context("running pg_isready")?;
            if ready.success() {
                break;
            }
            if start.elapsed() > START_WAIT {
                let _ = child.kill();
                let _ = child.wait();
                bail!("postgres did not accept connections within {START_WAIT:?}: {}", self.log_tail());
            }
            std::thread::sleep(crate::wait::POLL_INTERVAL);
        }
        self.port = port;
        self.child = Some(child);
        Ok(())
    }

    /// The end of the server's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.path().join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Creates the database `name` and returns its URL.
    pub fn create_database(&self, name: &str) -> anyhow::Result<String> {
        // Through the socket directory, like the readiness check: only this cluster's server
        // listens there.
        let out = Command::new(self.bin.join("createdb"))
            .arg("-h")
            .arg(self.path().join("sock"))
            .args(["-p", &self.port.to_string(), "-U", USER, name])
            .env_clear()
            .env("PGPASSWORD", PASSWORD)
            .env("PGSSLMODE", "disable")
            .output()
            .context("running createdb")?;
        if !out.status.success() {
            bail!("createdb {name} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(self.url_for(name))
    }

    /// The URL of `DATABASE`, without TLS (`sslmode=disable`).
    pub fn url(&self) -> String {
        self.url_for(DATABASE)
    }

    /// The URL of database `name`, without TLS.
    pub fn url_for(&self, name: &str) -> String {
        format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{name}?sslmode=disable", self.port)
    }

    /// The URL of `DATABASE` with `sslmode=verify-full` against `ca_file`, for a cluster
    /// started with TLS. `host` is `127.0.0.1` or `localhost` (both are in the certificate).
    pub fn tls_url(&self, host: &str, ca_file: &Path) -> String {
        format!(
            "postgres://{USER}:{PASSWORD}@{host}:{}/{DATABASE}?sslmode=verify-full&sslrootcert={}",
            self.port,
            ca_file.display()
        )
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA certificate (PEM) that signed the server's, when started with TLS.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }
}

impl PgCluster {
    /// Stops the server as a crash would (PostgreSQL's immediate shutdown: every connection
    /// cut, no checkpoint), waits `down`, and starts it again on the same port (it recovers from
    /// its WAL). What clients see is a database restarting under them.
    pub fn restart(&mut self, down: Duration) -> anyhow::Result<()> {
        self.stop();
        std::thread::sleep(down);
        let port = self.port;
        self.run_server(&RunAs::find()?, port)
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGQUIT is PostgreSQL's immediate shutdown: nothing here needs a clean checkpoint.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX)),
                nix::sys::signal::Signal::SIGQUIT,
            );
            let start = Instant::now();
            while matches!(child.try_wait(), Ok(None)) && start.elapsed() < STOP_WAIT {
                std::thread::sleep(crate::wait::POLL_INTERVAL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop();
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Writes a fresh CA and a server certificate for `127.0.0.1` and `localhost` into `dir`
/// (`ca.crt`, `server.crt`, `server.key`, the key private to the server's user). Returns the
/// CA certificate's path.
fn write_certificates(dir: &Path, run_as: &RunAs) -> anyhow::Result<PathBuf> {
    use baton_shared::pki::{self, LeafKind};
    let ca = pki::create_ca("baton test postgres ca")?;
    let leaf = pki::issue(
        &ca.cert_pem,
        &ca.key_pem,
        &LeafKind::Server {
            hostnames: vec!["127.0.0.1".into(), "localhost".into()],
            lifetime: Duration::from_secs(24 * 3600),
        },
    )?;
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, &ca.cert_pem)?;
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    std::fs::write(&cert, &leaf.cert_pem)?;
    std::fs::write(&key, &leaf.key_pem)?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    run_as.own(&cert)?;
    run_as.own(&key)?;
    Ok(ca_file)
}

/// Removes the directories of clusters whose test process is gone (killed before it could drop
/// them), killing their server first if it still runs.
fn sweep_leftovers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.filter_map(|e| e.ok()) {
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let dir = entry.path();
        let Some(owner) = std::fs::read_to_string(dir.join("owner")).ok().and_then(|s| s.trim().parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        let postmaster = std::fs::read_to_string(dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<i32>().ok()));
        if let Some(pid) = postmaster {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains("postgres") {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_removes_the_cluster_and_a_start_sweeps_what_a_killed_run_left() {
        // The directory of a run that was killed: its owner process is gone.
        let mut gone = Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        let leftover = tempfile::Builder::new().prefix(DIR_PREFIX).tempdir().unwrap().keep();
        std::fs::write(leftover.join("owner"), gone_pid.to_string()).unwrap();

        let Some(cluster) = cluster_or_skip("drop_and_sweep", false) else {
            let _ = std::fs::remove_dir_all(&leftover);
            return;
        };
        assert!(!leftover.exists(), "the start swept the leftover directory");
        let (dir, port) = (cluster.path().to_owned(), cluster.port());
        assert!(dir.join("data/PG_VERSION").is_file());
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        drop(cluster);
        assert!(!dir.exists(), "the directory is removed on drop");
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "the server is stopped on drop");
    }
}
