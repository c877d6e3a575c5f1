//! The Debian packages, built from the debug binaries this suite already uses (no release
//! build: `hub/pkg/build-deb dev`, which runs `cargo deb --no-build --profile dev`): their
//! files and control data, `systemd-analyze verify` on their units, and each unit's
//! `ExecStart` run by hand from the unpacked package with its packaged configuration, speaking
//! the `sd_notify` protocol to a socket the test listens on.
//!
//! Needs `cargo deb`, `systemd-analyze` and `dpkg-deb`. Without them the tests say so and pass,
//! unless `BATON_REQUIRE_PACKAGING` is set (CI sets it), when they fail.

use baton_testkit::bins::{self, Binaries};
use baton_testkit::{EVENT_WAIT, Hub, Proc, Role, Signal, fresh_dir, wait};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Set (to anything) to make missing packaging tools a failure instead of a skip.
const REQUIRE_VAR: &str = "BATON_REQUIRE_PACKAGING";
/// Building a package runs `cargo metadata` and compresses a debug binary.
const BUILD_WAIT: Duration = Duration::from_secs(300);

/// Whether the tools are here; `false` (after saying why) when the test should skip.
fn tools_present() -> bool {
    let missing: Vec<&str> =
        [("cargo", &["deb", "--version"][..]), ("systemd-analyze", &["--version"]), ("dpkg-deb", &["--version"])]
            .into_iter()
            .filter(|(program, args)| !Command::new(program).args(*args).output().is_ok_and(|o| o.status.success()))
            .map(|(program, _)| if program == "cargo" { "cargo-deb" } else { program })
            .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os(REQUIRE_VAR).is_none(),
        "{REQUIRE_VAR} is set but these packaging tools are missing: {missing:?}"
    );
    eprintln!(
        "SKIPPED: packaging tools missing ({}); install them (cargo install cargo-deb --locked; apt-get install \
         systemd dpkg) or set {REQUIRE_VAR} to make this a failure",
        missing.join(", ")
    );
    false
}

/// The workspace root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// An unpacked package: the `.deb`, and its files under `root`.
struct Package {
    deb: PathBuf,
    root: PathBuf,
    /// `dpkg-deb -c`: one line per file.
    contents: String,
    /// `dpkg-deb -I`: the control fields and the maintainer scripts' names.
    info: String,
}

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Builds `name`'s package with `PKG/pkg/build-deb` from the binaries in `bins`' directory,
/// checks it lists what every package must hold, and unpacks it into `dir`.
fn build(bins: &Binaries, name: &str, dir: &Path) -> Package {
    let profile_dir = bins.hub.parent().expect("the binaries live in a profile directory");
    let target_dir = profile_dir.parent().expect("a profile directory lives in a target directory");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
        None => panic!("no profile in {}", profile_dir.display()),
    };
    let crate_dir = name.trim_start_matches("baton-");
    let out = dir.join("debs");
    let mut cmd = Command::new(repo().join(crate_dir).join("pkg/build-deb"));
    cmd.arg(&profile).arg("--output").arg(&out).arg("--fast").env("CARGO_TARGET_DIR", target_dir);
    let built = bins::run(cmd, BUILD_WAIT).unwrap();
    assert!(built.status.success(), "{name}/pkg/build-deb failed:\n{}", text(&built));
    let deb = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .unwrap_or_else(|| panic!("no .deb in {}:\n{}", out.display(), text(&built)));
    let dpkg = |flag: &str| {
        let o = Command::new("dpkg-deb").arg(flag).arg(&deb).output().unwrap();
        assert!(o.status.success(), "dpkg-deb {flag}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let (contents, info) = (dpkg("-c"), dpkg("-I"));
    let root = dir.join("root");
    let o = Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root).output().unwrap();
    assert!(o.status.success(), "dpkg-deb -x: {}", text(&o));
    Package { deb, root, contents, info }
}

impl Package {
    fn assert_holds(&self, path: &str) {
        assert!(
            self.contents.contains(&format!(" ./{path}\n")),
            "{} lacks {path}:\n{}",
            self.deb.display(),
            self.contents
        );
    }

    /// The unit file, as installed.
    fn unit(&self, name: &str) -> (PathBuf, String) {
        let path = ["usr/lib/systemd/system", "lib/systemd/system"]
            .iter()
            .map(|d| self.root.join(d).join(format!("{name}.service")))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("no {name}.service in the package:\n{}", self.contents));
        let text = std::fs::read_to_string(&path).unwrap();
        (path, text)
    }

    /// What every package holds: the binary, its unit (checked by `systemd-analyze verify`
    /// and for the settings operators rely on), the conffile, the maintainer scripts, one man
    /// page per page the binary generates (a unit test proves those cover every command) and
    /// the completion scripts of bash, zsh and fish.
    fn check_common(&self, bins: &Binaries, name: &str, dir: &Path) {
        self.assert_holds(&format!("usr/bin/{name}"));
        let config = if name == "baton-hub" { "etc/baton/hub.toml" } else { "etc/baton/node.toml" };
        self.assert_holds(config);
        assert!(self.info.contains(&format!("Package: {name}")), "{}", self.info);
        assert!(self.info.contains("adduser"), "the postinst needs adduser: {}", self.info);
        for script in ["postinst", "postrm", "conffiles"] {
            assert!(self.info.contains(script), "no {script}: {}", self.info);
        }
        let control = dir.join("control");
        let o = Command::new("dpkg-deb").arg("-e").arg(&self.deb).arg(&control).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let listed = std::fs::read_to_string(control.join("conffiles")).unwrap();
        assert!(listed.contains(&format!("/{config}")), "{listed}");
        for script in ["postinst", "postrm", "prerm"] {
            let o = Command::new("sh").arg("-n").arg(control.join(script)).output().unwrap();
            assert!(o.status.success(), "{script} is not valid sh: {}", text(&o));
        }
        let postinst = std::fs::read_to_string(control.join("postinst")).unwrap();
        assert!(postinst.contains("adduser --system") && postinst.contains("-m 0700"), "{postinst}");

        let pages = dir.join("man");
        let program = if name == "baton-hub" { &bins.hub } else { &bins.node };
        let mut man = bins::command(program);
        man.arg("man").arg("--out").arg(&pages);
        let o = bins::run(man, EVENT_WAIT).unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let mut count = 0;
        for page in std::fs::read_dir(&pages).unwrap().flatten() {
            let file = page.file_name().to_string_lossy().into_owned();
            self.assert_holds(&format!("usr/share/man/man1/{file}.gz"));
            count += 1;
        }
        assert!(count >= 4, "only {count} man pages");
        self.assert_holds(&format!("usr/share/bash-completion/completions/{name}"));
        self.assert_holds(&format!("usr/share/zsh/vendor-completions/_{name}"));
        self.assert_holds(&format!("usr/share/fish/vendor_completions.d/{name}.fish"));

        let (unit_path, unit) = self.unit(name);
        for line in [
            "Type=notify",
            "WatchdogSec=",
            "KillSignal=SIGTERM",
            "Restart=on-failure",
            &format!("User={name}"),
            "ProtectSystem=strict",
            &format!("ReadWritePaths=/var/lib/{name}"),
            &format!("StateDirectory={name}"),
            "StateDirectoryMode=0700",
            "NoNewPrivileges=yes",
            "PrivateTmp=yes",
            "CapabilityBoundingSet=\n",
        ] {
            assert!(unit.contains(line), "{name}.service lacks {line:?}:\n{unit}");
        }
        // `--root` makes systemd look for ExecStart's binary inside the unpacked package; the
        // units it depends on (sysinit.target, …) are copied in from this machine. A unit it
        // cannot parse still exits 0, so any output at all is a failure.
        // Other programs the unit runs (`/bin/kill` for a reload) come from this machine too.
        let units = unit_path.parent().expect("a unit directory");
        let o = Command::new("cp").arg("-a").arg("-n").arg("/usr/lib/systemd/system/.").arg(units).output().unwrap();
        assert!(o.status.success(), "copying the system units: {}", text(&o));
        for line in unit.lines().filter(|l| l.starts_with("Exec") && !l.starts_with("ExecStart=")) {
            let program = line.split_once('=').and_then(|(_, v)| v.split_whitespace().next()).unwrap_or_default();
            let inside = self.root.join(program.trim_start_matches('/'));
            if !inside.exists() {
                std::fs::create_dir_all(inside.parent().expect("a directory")).unwrap();
                std::fs::copy(program, &inside).unwrap_or_else(|e| panic!("{line}: {program}: {e}"));
            }
        }
        let o = Command::new("systemd-analyze")
            .arg("verify")
            .arg("--man=no")
            .arg(format!("--root={}", self.root.display()))
            .arg(&unit_path)
            .output()
            .unwrap();
        let said = text(&o);
        assert!(o.status.success() && said.trim().is_empty(), "systemd-analyze verify {name}.service:\n{said}");
    }

    /// The unit's `ExecStart` as a command of the unpacked package: every absolute path in it
    /// is looked up under the package root, except `data_dir` (given by the caller, as the
    /// unit's `StateDirectory=` would create it).
    fn exec_start(&self, name: &str, data_dir: &Path) -> Command {
        let (_, unit) = self.unit(name);
        let line = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("an ExecStart line");
        let state = format!("/var/lib/{name}");
        let mut words = line.split_whitespace().map(|w| {
            if w == state {
                data_dir.to_path_buf()
            } else if let Some(rel) = w.strip_prefix('/') {
                self.root.join(rel)
            } else {
                PathBuf::from(w)
            }
        });
        let program = words.next().expect("a program");
        let mut cmd = bins::command(&program);
        cmd.args(words);
        cmd
    }
}

/// A socket standing in for systemd's notification socket.
struct NotifySocket {
    path: PathBuf,
    socket: UnixDatagram,
}

impl NotifySocket {
    fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        NotifySocket { path, socket }
    }

    /// Reads messages until one contains `what`; returns everything read.
    fn wait_for(&self, what: &str, proc: &mut Proc) -> String {
        let mut seen = String::new();
        wait::until(&format!("{what} on NOTIFY_SOCKET"), EVENT_WAIT, || {
            let mut buf = [0u8; 4096];
            if let Ok(n) = self.socket.recv(&mut buf) {
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
                seen.push('\n');
            }
            if seen.contains(what) {
                return Ok(Some(()));
            }
            proc.check_running()?;
            Ok(None)
        })
        .unwrap_or_else(|e| panic!("{e:#}\nmessages so far:\n{seen}\nlog:\n{}", proc.stderr()));
        seen
    }
}

/// Lays out the hub's data directory as the package's postinst does: mode 0700, `hub.toml`
/// linking to the packaged configuration, and a first `init`.
fn postinst_hub_data_dir(pkg: &Package, data: &Path) {
    std::fs::create_dir_all(data).unwrap();
    std::fs::set_permissions(data, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(pkg.root.join("etc/baton/hub.toml"), data.join("hub.toml")).unwrap();
    let init =
        bins::command(&pkg.root.join("usr/bin/baton-hub")).arg("init").arg("--data-dir").arg(data).output().unwrap();
    assert!(init.status.success(), "{}", text(&init));
}

/// The hub's package: its contents, its unit, and its `ExecStart` run by hand with the
/// packaged configuration, which sends READY=1 only once the listener is up, feeds the
/// watchdog, says STOPPING=1 on SIGTERM and exits 0.
#[test]
fn hub_package_installs_a_service_that_notifies_systemd() {
    if !tools_present() {
        return;
    }
    let bins = Binaries::build().unwrap();
    let dir = fresh_dir("pkg-hub").unwrap();
    let pkg = build(&bins, "baton-hub", dir.path());
    pkg.check_common(&bins, "baton-hub", dir.path());
    let (_, unit) = pkg.unit("baton-hub");
    assert!(unit.contains("RestartPreventExitStatus=2 3"), "{unit}");
    // The packaged configuration is the template `init` writes, under its header.
    let packaged = std::fs::read_to_string(pkg.root.join("etc/baton/hub.toml")).unwrap();
    let fresh = dir.path().join("fresh");
    let mut init = bins.hub_command();
    init.arg("init").arg("--data-dir").arg(&fresh);
    let o = bins::run(init, EVENT_WAIT).unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(packaged.ends_with(&std::fs::read_to_string(fresh.join("hub.toml")).unwrap()), "{packaged}");
    // `baton`, the producer command line, comes with the hub: its binary (it runs), a man page
    // per command and its completions.
    pkg.assert_holds("usr/bin/baton");
    for page in ["baton.1.gz", "baton-send.1.gz", "baton-wait.1.gz"] {
        pkg.assert_holds(&format!("usr/share/man/man1/{page}"));
    }
    pkg.assert_holds("usr/share/bash-completion/completions/baton");
    pkg.assert_holds("usr/share/zsh/vendor-completions/_baton");
    pkg.assert_holds("usr/share/fish/vendor_completions.d/baton.fish");
    let mut version = bins::command(&pkg.root.join("usr/bin/baton"));
    version.arg("--version");
    let o = bins::run(version, EVENT_WAIT).unwrap();
    assert!(o.status.success() && text(&o).contains("baton"), "{}", text(&o));

    let data = dir.path().join("var-lib-baton-hub");
    postinst_hub_data_dir(&pkg, &data);
    let notify = NotifySocket::bind(dir.path());
    let mut cmd = pkg.exec_start("baton-hub", &data);
    // The packaged address is fixed (7443); the environment layer moves it for the test.
    cmd.env("BATON_HUB_LISTEN", "127.0.0.1:0")
        .env("NOTIFY_SOCKET", &notify.path)
        .env("WATCHDOG_USEC", "1000000")
        .current_dir(dir.path());
    let mut hub = Proc::new(dir.path(), "hub");
    hub.spawn(cmd).unwrap();
    let ready = notify.wait_for("READY=1", &mut hub);
    // The listener was bound before READY=1: its address is announced and it accepts.
    let addr = std::fs::read_to_string(data.join("hub.addr")).unwrap();
    std::net::TcpStream::connect(addr.trim()).unwrap_or_else(|e| panic!("{addr}: {e}; {ready}"));
    notify.wait_for("WATCHDOG=1", &mut hub);
    hub.signal(Signal::SIGTERM).unwrap();
    let said = notify.wait_for("STOPPING=1", &mut hub);
    let status = hub.wait_exit(EVENT_WAIT).unwrap().expect("the hub stops on SIGTERM");
    assert_eq!(status.code(), Some(0), "{said}\n{}", hub.stderr());
}

/// The node's package: its contents, its unit (refused-for-good and taken-over exits are not
/// restarted), and its `ExecStart` run by hand with the packaged configuration: READY=1 after
/// recovery once the hub answered, and, with the hub down, READY=1 all the same (retrying).
#[test]
fn node_package_installs_a_service_that_notifies_systemd() {
    if !tools_present() {
        return;
    }
    let bins = Binaries::build().unwrap();
    let dir = fresh_dir("pkg-node").unwrap();
    let pkg = build(&bins, "baton-node", dir.path());
    pkg.check_common(&bins, "baton-node", dir.path());
    let (_, unit) = pkg.unit("baton-node");
    for line in ["RestartPreventExitStatus=2 3 5 6", "KillMode=mixed", "ExecReload="] {
        assert!(unit.contains(line), "baton-node.service lacks {line:?}:\n{unit}");
    }

    let mut hub = Hub::init(&bins, &dir.path().join("hub"), "ops").unwrap();
    let id = hub.enroll(Role::Node, "pkg-host").unwrap();
    hub.serve(None).unwrap();
    let hub_url = format!("https://localhost:{}", hub.addr().expect("a serving hub").port());
    let dead_url = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("https://localhost:{}", l.local_addr().unwrap().port())
    };
    for (case, url, status) in [("up", hub_url.as_str(), "the hub answered"), ("down", &dead_url, "not answering")] {
        let data = dir.path().join(format!("var-lib-baton-node-{case}"));
        let notify_dir = dir.path().join(case);
        std::fs::create_dir_all(&notify_dir).unwrap();
        let notify = NotifySocket::bind(&notify_dir);
        let mut cmd = pkg.exec_start("baton-node", &data);
        // The packaged file's placeholders (hub address, certificate files, harness) are what
        // an operator sets; the environment layer sets them here.
        cmd.env("BATON_NODE_HUB_URL", url)
            .env("BATON_NODE_CA_FILE", &id.ca)
            .env("BATON_NODE_CERT_FILE", &id.cert)
            .env("BATON_NODE_KEY_FILE", &id.key)
            .env("BATON_NODE_DATA_DIR", &data)
            .env("BATON_NODE_COMMAND", r#"["/bin/cat"]"#)
            .env("BATON_NODE_BACKOFF_MAX", "1s")
            .env("NOTIFY_SOCKET", &notify.path)
            .env("WATCHDOG_USEC", "1000000");
        let mut node = Proc::new(dir.path(), &format!("node-{case}"));
        node.spawn(cmd).unwrap();
        let said = notify.wait_for("READY=1", &mut node);
        assert!(said.contains(status), "{case}: {said}");
        notify.wait_for("WATCHDOG=1", &mut node);
        node.signal(Signal::SIGTERM).unwrap();
        notify.wait_for("STOPPING=1", &mut node);
        let exit = node.wait_exit(EVENT_WAIT).unwrap().expect("the node stops on SIGTERM");
        assert_eq!(exit.code(), Some(0), "{case}: {}", node.stderr());
    }
}
