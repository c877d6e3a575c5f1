//! `Hub`: one hub data directory, the operator CLI run against it, the identities enrolled in
//! it, and its `serve` process.
//!
//! Directory layout under the root a suite hands in: `hub/` (the data directory), `certs/`
//! (what `enroll` writes), `logs/` (`hub.log`, `hub.stdout`, every `serve` run appended).
//!
//! `serve` is ready when it answers `GET /readyz` with 200 over mTLS (store open, startup repair
//! done), not merely when `hub.addr` appears: the address file is only the way to learn the
//! port. A `serve` that exits first (an armed crash point in startup repair, a refused store)
//! is reported as `Started::Exited`, not as an error, because the fault suite expects it.

use crate::EVENT_WAIT;
use crate::bins::{self, Binaries, EXIT_POLL};
use crate::identity::{Identity, Role, client_builder};
use crate::proc::{Proc, tail};
use anyhow::{Context, anyhow, bail};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// How long one `/readyz` probe may take before it counts as unanswered.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause between two `/readyz` probes.
const PROBE_PACE: Duration = Duration::from_millis(50);
/// Lines of the log quoted when `serve` does not become ready.
const ERROR_TAIL_LINES: usize = 30;

/// How a `serve` start ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// Listening on this address and answering `/readyz` with 200.
    Ready(SocketAddr),
    /// It exited before it was ready, with this status.
    Exited(ExitStatus),
}

/// One hub data directory and, while it runs, its `serve` process.
#[derive(Debug)]
pub struct Hub {
    bins: Binaries,
    data: PathBuf,
    certs: PathBuf,
    /// Recorded as the actor of every operator change (`BATON_OPERATOR`).
    operator: String,
    identities: BTreeMap<String, Identity>,
    /// Where `serve` listens; port 0 picks a free port on every start.
    listen: SocketAddr,
    /// Extra environment for every `serve` run.
    env: Vec<(String, String)>,
    /// How long a `serve` start may take to become ready.
    ready_within: Duration,
    /// The address of the latest `serve` that became ready, until it is killed.
    addr: Option<SocketAddr>,
    serve: Proc,
}

/// The producer a hub made by `Hub::join` enrolls for its readiness probe.
pub const JOINED_PROBE: &str = "probe";

impl Hub {
    /// A hub rooted at `root` (see the module docs), not initialised; `operator` is the name
    /// the CLI records for operator changes.
    pub fn new(bins: &Binaries, root: &Path, operator: &str) -> anyhow::Result<Hub> {
        let logs = root.join("logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        Ok(Hub {
            bins: bins.clone(),
            data: root.join("hub"),
            certs: root.join("certs"),
            operator: operator.to_string(),
            identities: BTreeMap::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            env: Vec::new(),
            ready_within: EVENT_WAIT,
            addr: None,
            serve: Proc::new(&logs, "hub"),
        })
    }

    /// `new`, then `baton-hub init`.
    pub fn init(bins: &Binaries, root: &Path, operator: &str) -> anyhow::Result<Hub> {
        let hub = Hub::new(bins, root, operator)?;
        hub.cli(["init"])?;
        Ok(hub)
    }

    /// `init`, then `enroll` of each of `identities` in order: a hub on an SQLite record with
    /// those certificates. Under cargo-nextest the first process of the run that asks for a
    /// given operator and list makes it once, in the run's shared directory
    /// (`bins::run_shared_dir`), and every process copies it (the data directory and the
    /// certificates), the first hub it asks for only: a second hub of the same test has a CA of
    /// its own, as two hubs made from nothing do. What a copy differs in from a hub made here is
    /// only when: its certificates and the record's enrollments are minutes older.
    pub fn init_enrolled(
        bins: &Binaries,
        root: &Path,
        operator: &str,
        identities: &[(Role, &str)],
    ) -> anyhow::Result<Hub> {
        static COPIED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let first = !COPIED.swap(true, std::sync::atomic::Ordering::SeqCst);
        if first && let Some(shared) = bins::run_shared_dir() {
            match template(bins, &shared, operator, identities)
                .and_then(|t| copy_hub(&t, root).with_context(|| format!("copying the hub made in {}", t.display())))
            {
                Ok(()) => {
                    enrolled_now(&root.join("hub"))?;
                    let mut hub = Hub::new(bins, root, operator)?;
                    for (role, name) in identities {
                        hub.enrolled(*role, name)?;
                    }
                    return Ok(hub);
                }
                Err(e) => {
                    // A shortcut only: made from nothing below.
                    eprintln!("a hub from the run's template: {e:#}; making one from nothing");
                    for d in ["hub", "certs"] {
                        let _ = std::fs::remove_dir_all(root.join(d));
                    }
                }
            }
        }
        made_enrolled(bins, root, operator, identities)
    }

    /// Another hub on the PostgreSQL record at `database_url` that `first` keeps, rooted at
    /// `root`: `new`, then `baton-hub init --database-url URL --ca-from FIRST_DATA_DIR` (the
    /// same CA, so every identity enrolled through `first` works here too), then one producer
    /// of its own, `probe`, which only `serve`'s readiness probe presents.
    pub fn join(bins: &Binaries, root: &Path, operator: &str, first: &Hub, database_url: &str) -> anyhow::Result<Hub> {
        let mut hub = Hub::new(bins, root, operator)?;
        hub.cli([
            OsStr::new("init"),
            OsStr::new("--database-url"),
            OsStr::new(database_url),
            OsStr::new("--ca-from"),
            first.data_dir().as_os_str(),
        ])?;
        hub.enroll(Role::Producer, JOINED_PROBE)?;
        Ok(hub)
    }

    /// The data directory (`--data-dir`).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The hub database.
    pub fn db(&self) -> PathBuf {
        self.data.join("hub.db")
    }

    /// Where `enroll` writes certificates and keys.
    pub fn certs_dir(&self) -> &Path {
        &self.certs
    }

    /// A scrubbed `baton-hub --data-dir DIR ARGS…` command with `BATON_OPERATOR` set.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.bins.hub_command();
        cmd.env("BATON_OPERATOR", &self.operator).arg("--data-dir").arg(&self.data).args(args);
        cmd
    }

    /// Runs an operator command to completion (within `EVENT_WAIT`) and returns what it did.
    pub fn cli_output<I, S>(&self, args: I) -> anyhow::Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        bins::run(self.command(args), EVENT_WAIT)
    }

    /// Runs an operator command; fails unless it exits 0. Returns its stdout.
    pub fn cli<I, S>(&self, args: I) -> anyhow::Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().to_os_string()).collect();
        let out = self.cli_output(&args)?;
        if !out.status.success() {
            let shown: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
            bail!(
                "baton-hub {} exited {}:\nstdout: {}\nstderr: {}",
                shown.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        String::from_utf8(out.stdout).context("the CLI's stdout is not UTF-8")
    }

    /// `baton-hub enroll ROLE NAME --out CERTS`; returns (and remembers) the identity.
    pub fn enroll(&mut self, role: Role, name: &str) -> anyhow::Result<Identity> {
        let certs = self.certs.clone();
        self.cli([
            OsStr::new("enroll"),
            OsStr::new(role.as_str()),
            OsStr::new(name),
            OsStr::new("--out"),
            certs.as_os_str(),
        ])?;
        self.enrolled(role, name)
    }

    /// Remembers the identity `name` that an `enroll` run by the caller wrote into `certs_dir`
    /// (for a caller that shows the command's output itself). Fails when a file is missing.
    pub fn enrolled(&mut self, role: Role, name: &str) -> anyhow::Result<Identity> {
        let id = Identity {
            role,
            name: name.to_string(),
            cert: self.certs.join(format!("{name}.crt")),
            key: self.certs.join(format!("{name}.key")),
            ca: self.certs.join("ca.crt"),
        };
        for p in [&id.cert, &id.key, &id.ca] {
            if !p.is_file() {
                bail!("enroll did not write {}", p.display());
            }
        }
        self.identities.insert(name.to_string(), id.clone());
        Ok(id)
    }

    /// An identity enrolled earlier.
    pub fn identity(&self, name: &str) -> anyhow::Result<&Identity> {
        self.identities.get(name).ok_or_else(|| anyhow!("{name} was not enrolled"))
    }

    /// Every later `serve` listens on `addr` (a restart that nodes must find again).
    pub fn listen_on(&mut self, addr: SocketAddr) {
        self.listen = addr;
    }

    /// An environment variable for every later `serve` run (`LD_PRELOAD`, say).
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.push((key.to_string(), value.to_string()));
    }

    /// Drops the extra environment for later runs.
    pub fn clear_env(&mut self) {
        self.env.clear();
    }

    /// How long later `serve` starts may take to become ready (default `EVENT_WAIT`; a store
    /// holding a large backlog takes longer to open).
    pub fn set_ready_within(&mut self, limit: Duration) {
        self.ready_within = limit;
    }

    /// Starts `serve` (with `BATON_CRASH_POINT` armed if given) and waits until it is ready or
    /// has exited. Fails when it is already running, when no identity was enrolled to probe it
    /// with, or when it is neither ready nor gone within the limit.
    pub fn serve(&mut self, crash_point: Option<&str>) -> anyhow::Result<Started> {
        let probe = self.identities.values().next().ok_or_else(|| anyhow!("serve needs an enrolled identity"))?;
        let (ca, pem) = (probe.ca_pem()?, probe.pem()?);
        let addr_file = self.data.join("hub.addr");
        if let Err(e) = std::fs::remove_file(&addr_file)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(e).with_context(|| format!("removing {}", addr_file.display()));
        }
        let mut cmd = self.command([OsString::from("serve"), "--listen".into(), self.listen.to_string().into()]);
        if let Some(p) = crash_point {
            cmd.env(baton_shared::crash::CRASH_POINT_ENV, p);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.addr = None;
        self.serve.spawn(cmd)?;
        let deadline = Instant::now() + self.ready_within;
        let addr = loop {
            if let Some(addr) = std::fs::read_to_string(&addr_file).ok().and_then(|t| t.trim().parse().ok()) {
                break addr;
            }
            if let Some(status) = self.serve.wait_exit(Duration::ZERO)? {
                return Ok(Started::Exited(status));
            }
            if Instant::now() > deadline {
                bail!("{}", self.not_ready(&format!("wrote no {}", addr_file.display())));
            }
            std::thread::sleep(EXIT_POLL);
        };
        loop {
            let timeout = PROBE_TIMEOUT.min(deadline.saturating_duration_since(Instant::now())).max(PROBE_PACE);
            let last = match probe_ready(&ca, &pem, addr, timeout) {
                Ok(200) => {
                    self.addr = Some(addr);
                    return Ok(Started::Ready(addr));
                }
                Ok(status) => format!("answered {status}"),
                Err(e) => format!("failed: {e:#}"),
            };
            if let Some(status) = self.serve.wait_exit(Duration::ZERO)? {
                return Ok(Started::Exited(status));
            }
            if Instant::now() > deadline {
                bail!("{}", self.not_ready(&format!("listens on {addr}, but GET /readyz {last}")));
            }
            std::thread::sleep(PROBE_PACE);
        }
    }

    fn not_ready(&self, what: &str) -> String {
        format!(
            "baton-hub serve {what} within {:?}; end of {}:\n{}",
            self.ready_within,
            self.serve.log_path().display(),
            tail(&self.serve.stderr(), ERROR_TAIL_LINES)
        )
    }

    /// The address of the latest `serve` that became ready (`None` before, and after `kill`).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// SIGKILLs `serve` if it runs and reaps it; returns how the run ended.
    pub fn kill(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        self.addr = None;
        self.serve.kill()
    }

    /// The `serve` process: signals, exit, logs.
    pub fn proc(&self) -> &Proc {
        &self.serve
    }

    /// The `serve` process, to signal, wait for or stop it.
    pub fn proc_mut(&mut self) -> &mut Proc {
        &mut self.serve
    }
}

/// One `GET /readyz` with `identity` on a thread of its own (callers may be inside a runtime
/// or not); returns the HTTP status.
fn probe_ready(ca: &[u8], identity: &[u8], addr: SocketAddr, timeout: Duration) -> anyhow::Result<u16> {
    std::thread::scope(|s| {
        s.spawn(|| -> anyhow::Result<u16> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async {
                let client = client_builder(ca, Some(identity))?.timeout(timeout).build()?;
                let r = client.get(format!("https://{addr}/readyz")).send().await?;
                Ok(r.status().as_u16())
            })
        })
        .join()
        .map_err(|_| anyhow!("the readiness probe panicked"))?
    })
}

/// The hub made once per run for `operator` and `identities` (see `Hub::init_enrolled`):
/// `SHARED/hub-<hash>/` with `hub/` and `certs/`. Made under a name of its own and renamed into
/// place, so a process never sees half of one; when two make it at once, one rename wins and the
/// other's copy is removed.
fn template(bins: &Binaries, shared: &Path, operator: &str, identities: &[(Role, &str)]) -> anyhow::Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    operator.hash(&mut h);
    for (role, name) in identities {
        role.as_str().hash(&mut h);
        name.hash(&mut h);
    }
    let dir = shared.join(format!("hub-{:016x}", h.finish()));
    if dir.join("done").is_file() {
        return Ok(dir);
    }
    let making = tempfile::Builder::new().prefix(".making-").tempdir_in(shared)?;
    made_enrolled(bins, making.path(), operator, identities)?;
    std::fs::write(making.path().join("done"), b"")?;
    let making = making.keep();
    if std::fs::rename(&making, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&making);
        if !dir.join("done").is_file() {
            bail!("{} was not made", dir.display());
        }
    }
    Ok(dir)
}

/// `Hub::init` at `root`, then `enroll` of each of `identities` in order.
fn made_enrolled(bins: &Binaries, root: &Path, operator: &str, identities: &[(Role, &str)]) -> anyhow::Result<Hub> {
    let mut hub = Hub::init(bins, root, operator)?;
    for (role, name) in identities {
        hub.enroll(*role, name)?;
    }
    Ok(hub)
}

/// Copies a template's `hub/` and `certs/` under `root`, files with their modes.
/// Dates the hosts of a hub copied from the run's template (`data`, its data directory) as
/// enrolled now, as a hub made from nothing would have them: the template may have been made
/// minutes before, and what a host's age decides (a host no node has served for longer than
/// `host_silence_warn`) must read the test's own time, not the run's.
fn enrolled_now(data: &Path) -> anyhow::Result<()> {
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    let db = data.join("hub.db");
    let conn = rusqlite::Connection::open(&db).with_context(|| format!("opening {}", db.display()))?;
    conn.execute("UPDATE hosts SET enrolled_at = ?1", [now_ms]).with_context(|| format!("dating {}", db.display()))?;
    Ok(())
}

fn copy_hub(template: &Path, root: &Path) -> anyhow::Result<()> {
    for d in ["hub", "certs"] {
        copy_tree(&template.join(d), &root.join(d))?;
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::metadata(from)?.permissions())?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), &target)?;
        }
    }
    Ok(())
}
