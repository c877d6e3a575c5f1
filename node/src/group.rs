//! The harness's process group, told apart from whatever later reuses its number.
//!
//! Every turn runs in its own process group, led by the process the node spawned (the group id
//! is that process's pid). Before the harness is released (see `exec`), the node stores the
//! group's `ProcessIdentity`: the group id, the leader's start time as the kernel reports it
//! (field 22 of `/proc/PID/stat`, clock ticks since boot, which `exec` keeps) and the boot id.
//! After a crash, `stop_recorded` uses it to stop what is left of that group, SIGTERM first and
//! SIGKILL after `kill_grace`, without ever signalling a group that is not the recorded one.
//!
//! Why this is enough to tell the group apart (`judge`): Linux does not hand out a pid that is
//! still in use as a process group id, so while any member of the old group lives, the number
//! cannot have been reused, and every process in that group is the old group's. When the leader
//! still lives, its start time must match the record; when it is gone, every member must have
//! started at or after the recorded leader (members are its descendants). A different boot id
//! means the host restarted: nothing of the old group can be left. Zombies (exited, not yet
//! reaped, perhaps by a careless init) are counted as gone: they have no effects left.
//!
//! Residual risk, accepted: the whole old group ends, its number is reused for a new group
//! whose leader dies, and the new group's members all started after the recorded leader. That
//! takes a pid wrap-around while the node is down and a dead leader; even then only a group
//! that already outlived its leader is signalled.

use crate::limits::{GROUP_POLL_PACE, KILLED_GROUP_WAIT};
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::io;
use std::time::Duration;

/// Which process group a turn ran in, recorded before the harness could have any effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// The process group id (= the leader's pid).
    pub pgid: i32,
    /// The leader's start time: field 22 of `/proc/PID/stat`, in clock ticks since boot.
    pub start_ticks: u64,
    /// `/proc/sys/kernel/random/boot_id` when it ran: start times restart with each boot.
    pub boot_id: String,
}

impl ProcessIdentity {
    /// The identity of the group led by `pid`, read from `/proc`. Fails when the process is gone
    /// or does not lead its own group.
    pub fn of_leader(pid: i32) -> io::Result<ProcessIdentity> {
        let stat =
            read_stat(pid)?.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("pid {pid} is gone")))?;
        if stat.pgrp != pid {
            return Err(io::Error::other(format!("pid {pid} leads no group of its own (its group is {})", stat.pgrp)));
        }
        Ok(ProcessIdentity { pgid: pid, start_ticks: stat.start_ticks, boot_id: boot_id()? })
    }
}

/// What `/proc/PID/stat` says about one process, as far as the node needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The state letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// Its process group id.
    pub pgrp: i32,
    /// Its start time in clock ticks since boot.
    pub start_ticks: u64,
}

/// Parses the text of `/proc/PID/stat`. The command name (field 2) is in parentheses and may
/// itself contain spaces and parentheses, so the fields are counted after the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, pgrp field 5, starttime field 22 (1-based, whole line).
    let state = fields.first()?.chars().next()?;
    let pgrp = fields.get(2)?.parse().ok()?;
    let start_ticks = fields.get(19)?.parse().ok()?;
    Some(Stat { state, pgrp, start_ticks })
}

/// The process `pid`'s stat, or `None` when it does not exist.
fn read_stat(pid: i32) -> io::Result<Option<Stat>> {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => parse_stat(&text)
            .map(Some)
            .ok_or_else(|| io::Error::other(format!("/proc/{pid}/stat does not parse: {text:?}"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        // Gone between listing and reading.
        Err(e) if e.raw_os_error() == Some(nix::libc::ESRCH) => Ok(None),
        Err(e) => Err(e),
    }
}

/// This boot's id.
pub fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?.trim().to_string())
}

/// The live (not zombie) processes of group `pgid`, with their stats.
pub fn members(pgid: i32) -> io::Result<Vec<(i32, Stat)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if let Some(stat) = read_stat(pid)?
            && stat.pgrp == pgid
            && stat.state != 'Z'
        {
            out.push((pid, stat));
        }
    }
    Ok(out)
}

/// What is left of a recorded group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Left {
    /// Nothing: every process of it has ended (or the host restarted since).
    Gone,
    /// This many of its processes still run.
    Ours(usize),
    /// Processes run under that group id, but they are not the recorded group (why).
    NotOurs(String),
}

/// The same-process check: given this boot's id and the live members of group `id.pgid`, is
/// anything of the recorded group left? See the module docs for why this tells them apart.
pub fn judge(id: &ProcessIdentity, boot_id: &str, members: &[(i32, Stat)]) -> Left {
    if boot_id != id.boot_id || members.is_empty() {
        return Left::Gone;
    }
    match members.iter().find(|(pid, _)| *pid == id.pgid) {
        Some((_, leader)) if leader.start_ticks == id.start_ticks => Left::Ours(members.len()),
        Some((_, leader)) => Left::NotOurs(format!(
            "pid {} was reused (started at tick {}, the recorded harness at {})",
            id.pgid, leader.start_ticks, id.start_ticks
        )),
        None => match members.iter().find(|(_, s)| s.start_ticks < id.start_ticks) {
            None => Left::Ours(members.len()),
            Some((pid, s)) => Left::NotOurs(format!(
                "group {} holds pid {pid}, started at tick {} before the recorded harness (tick {})",
                id.pgid, s.start_ticks, id.start_ticks
            )),
        },
    }
}

/// What is left of the recorded group now, from `/proc`.
pub fn left_of(id: &ProcessIdentity) -> io::Result<Left> {
    Ok(judge(id, &boot_id()?, &members(id.pgid)?))
}

/// Sends `sig` to every process of group `pgid`. A group that no longer exists is not an error.
pub fn signal_group(pgid: i32, sig: Signal) {
    match killpg(Pid::from_raw(pgid), sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::error!(pgid, "sending {sig} to the harness process group failed: {e}"),
    }
}

/// How `stop_recorded` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// Nothing of the group was left.
    AlreadyGone,
    /// Its processes ended after SIGTERM, within the grace.
    Terminated,
    /// Some still ran when the grace ended; they were sent SIGKILL.
    Killed,
    /// The group id now names other processes; nothing was signalled (why).
    NotOurs(String),
}

impl Stopped {
    /// A clause for the attempt's reason.
    pub fn describe(&self, pgid: i32, grace: Duration) -> String {
        match self {
            Stopped::AlreadyGone => format!("its harness process group {pgid} had already ended"),
            Stopped::Terminated => format!("what was left of its harness process group {pgid} ended on SIGTERM"),
            Stopped::Killed => format!(
                "what was left of its harness process group {pgid} was killed with SIGKILL after kill_grace ({})",
                humantime::format_duration(grace)
            ),
            Stopped::NotOurs(why) => format!("its harness process group is gone ({why}; not signalled)"),
        }
    }
}

/// Stops what is left of a recorded group that is not this process's child (after a crash):
/// SIGTERM to the group, up to `grace` for it to end, then SIGKILL. Each signal is sent only
/// after the same-process check passed again.
pub async fn stop_recorded(id: &ProcessIdentity, grace: Duration) -> io::Result<Stopped> {
    match look(id).await? {
        Left::Gone => return Ok(Stopped::AlreadyGone),
        Left::NotOurs(why) => return Ok(Stopped::NotOurs(why)),
        Left::Ours(_) => signal_group(id.pgid, Signal::SIGTERM),
    }
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        match look(id).await? {
            Left::Gone | Left::NotOurs(_) => return Ok(Stopped::Terminated),
            Left::Ours(_) if tokio::time::Instant::now() >= deadline => break,
            Left::Ours(_) => tokio::time::sleep(GROUP_POLL_PACE).await,
        }
    }
    signal_group(id.pgid, Signal::SIGKILL);
    let deadline = tokio::time::Instant::now() + KILLED_GROUP_WAIT;
    while let Left::Ours(n) = look(id).await? {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(pgid = id.pgid, "{n} process(es) of the harness group outlived SIGKILL for now");
            break;
        }
        tokio::time::sleep(GROUP_POLL_PACE).await;
    }
    Ok(Stopped::Killed)
}

/// `left_of` on a blocking thread (it reads all of `/proc`).
async fn look(id: &ProcessIdentity) -> io::Result<Left> {
    let id = id.clone();
    tokio::task::spawn_blocking(move || left_of(&id)).await.map_err(io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt as _;

    fn stat(state: char, pgrp: i32, start_ticks: u64) -> Stat {
        Stat { state, pgrp, start_ticks }
    }

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let line = "4242 (odd) name (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some(stat('S', 4242, 987654)));
        assert_eq!(parse_stat("12 (z) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0"), Some(stat('Z', 7, 55)));
        assert_eq!(parse_stat("12 (short) S 1 7"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    fn check(members: &[(i32, Stat)], boot: &str, expected: &str) {
        let id = ProcessIdentity { pgid: 100, start_ticks: 5000, boot_id: "boot-1".into() };
        let got = match judge(&id, boot, members) {
            Left::Gone => "gone".to_string(),
            Left::Ours(n) => format!("ours {n}"),
            Left::NotOurs(_) => "not ours".to_string(),
        };
        assert_eq!(got, expected, "{members:?} on {boot}");
    }

    #[test]
    fn the_same_process_check() {
        let s = |t| stat('S', 100, t);
        // The leader, with the recorded start time, and a child it started later.
        check(&[(100, s(5000)), (101, s(5003))], "boot-1", "ours 2");
        // The leader gone, its children left behind.
        check(&[(101, s(5003)), (102, s(9000))], "boot-1", "ours 2");
        // Nothing left.
        check(&[], "boot-1", "gone");
        // The pid was reused by a new group leader that started later (or earlier: a clock step
        // cannot move ticks, but any mismatch is another process).
        check(&[(100, s(7000))], "boot-1", "not ours");
        check(&[(100, s(4000))], "boot-1", "not ours");
        // A member that started before the recorded leader cannot descend from it.
        check(&[(101, s(4999))], "boot-1", "not ours");
        // After a reboot nothing of the old group can be left, whatever runs under the number.
        check(&[(100, s(5000))], "boot-2", "gone");
    }

    fn sleeper_group() -> std::process::Child {
        std::process::Command::new("sleep").arg("60").process_group(0).spawn().unwrap()
    }

    #[test]
    fn a_live_group_is_recognised_and_a_wrong_start_time_is_not() {
        let mut child = sleeper_group();
        let pid = child.id() as i32;
        let id = ProcessIdentity::of_leader(pid).unwrap();
        assert_eq!((id.pgid, id.boot_id.as_str()), (pid, boot_id().unwrap().as_str()));
        assert_eq!(left_of(&id).unwrap(), Left::Ours(1));
        let reused = ProcessIdentity { start_ticks: id.start_ticks + 1, ..id.clone() };
        assert!(matches!(left_of(&reused).unwrap(), Left::NotOurs(_)));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(left_of(&id).unwrap(), Left::Gone);
        assert!(ProcessIdentity::of_leader(pid).is_err());
    }

    #[tokio::test]
    async fn stop_recorded_sends_sigterm_first_and_sigkill_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("signals");
        let script =
            format!("trap 'echo TERM >> {}' TERM; echo ready >> {0}; while :; do sleep 0.05; done", log.display());
        let mut child = std::process::Command::new("sh").args(["-c", &script]).process_group(0).spawn().unwrap();
        let id = ProcessIdentity::of_leader(child.id() as i32).unwrap();
        while !std::fs::read_to_string(&log).unwrap_or_default().contains("ready") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The child is ours, so it stays a zombie until reaped; a zombie counts as gone.
        let stopped = stop_recorded(&id, Duration::from_millis(300)).await.unwrap();
        assert_eq!(stopped, Stopped::Killed);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
        assert!(std::fs::read_to_string(&log).unwrap().contains("TERM"), "SIGTERM came first");
        assert_eq!(stop_recorded(&id, Duration::from_secs(1)).await.unwrap(), Stopped::AlreadyGone);
    }

    #[tokio::test]
    async fn stop_recorded_leaves_a_group_that_ends_on_sigterm_alone_after_it() {
        let mut child = sleeper_group();
        let id = ProcessIdentity::of_leader(child.id() as i32).unwrap();
        let stopped = stop_recorded(&id, Duration::from_secs(60)).await.unwrap();
        assert_eq!(stopped, Stopped::Terminated);
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(child.wait().unwrap().signal(), Some(Signal::SIGTERM as i32));
    }
}
