//! A process's CPU time and peak memory, read from `/proc/PID/stat` and `/proc/PID/status`.

use anyhow::Context;

/// CPU time a process has used, in clock ticks (`utime` and `stime` of `/proc/PID/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTicks {
    /// User-mode ticks.
    pub utime: u64,
    /// Kernel-mode ticks.
    pub stime: u64,
}

/// Parses `/proc/PID/stat`. The command name (field 2) may hold spaces and parentheses, so
/// fields are counted from the last `)`; `utime` and `stime` are fields 14 and 15.
pub fn parse_stat(text: &str) -> Option<CpuTicks> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 (state), so field N is `fields[N - 3]`.
    Some(CpuTicks { utime: fields.get(11)?.parse().ok()?, stime: fields.get(12)?.parse().ok()? })
}

/// Reads a `kB` line such as `VmHWM: 12345 kB` from `/proc/PID/status`, in bytes.
pub fn parse_status_bytes(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        let mut parts = value.split_whitespace();
        let n: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") => Some(n * 1024),
            None => Some(n),
            Some(_) => None,
        }
    })
}

/// One reading of a live process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcSample {
    /// User plus system CPU seconds since the process started.
    pub cpu_s: f64,
    /// Peak resident set size (`VmHWM`), bytes.
    pub peak_rss_bytes: u64,
    /// Current resident set size (`VmRSS`), bytes.
    pub rss_bytes: u64,
}

/// Reads the CPU time and memory of process `pid`; `clk_tck` is from `clock_ticks`.
pub fn sample(pid: u32, clk_tck: f64) -> anyhow::Result<ProcSample> {
    let stat_path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&stat_path).with_context(|| format!("reading {stat_path}"))?;
    let ticks = parse_stat(&stat).with_context(|| format!("{stat_path} has no utime/stime"))?;
    let status_path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&status_path).with_context(|| format!("reading {status_path}"))?;
    Ok(ProcSample {
        cpu_s: (ticks.utime + ticks.stime) as f64 / clk_tck,
        peak_rss_bytes: parse_status_bytes(&status, "VmHWM").with_context(|| format!("{status_path} has no VmHWM"))?,
        rss_bytes: parse_status_bytes(&status, "VmRSS").unwrap_or(0),
    })
}

/// CPU seconds used by process `root` and its children, with the time of their exited, reaped
/// children: a PostgreSQL server's postmaster and its backends, which come and go with
/// connections. A backend that exits between two readings moves its time into the
/// postmaster's reaped-children fields, so the sum stays whole. `None` when `root` is gone.
pub fn cpu_s_of_tree(root: u32, clk_tck: f64) -> Option<f64> {
    let stat = |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
    let mut ticks = stat_ticks_with_children(&stat(&root.to_string())?)?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Some(text) = stat(&name)
            && stat_ppid(&text) == Some(root)
        {
            ticks += stat_ticks_with_children(&text).unwrap_or(0);
        }
    }
    Some(ticks as f64 / clk_tck)
}

/// The parent of process `pid` (`PPid` of `/proc/PID/stat`).
pub fn parent_of(pid: u32) -> Option<u32> {
    stat_ppid(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The parent pid (field 4) of a `/proc/PID/stat` line.
fn stat_ppid(text: &str) -> Option<u32> {
    text[text.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

/// `utime + stime + cutime + cstime` (fields 14 to 17) of a `/proc/PID/stat` line.
fn stat_ticks_with_children(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    (11..=14).map(|i| fields.get(i)?.parse::<u64>().ok()).sum()
}

/// Clock ticks per second (`getconf CLK_TCK`), read once; 100 when `getconf` is unavailable,
/// which is the value on every Linux this runs on.
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let text = "4242 (baton-hub) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 9 0 123456 \
                    123456789 2345 18446744073709551615 1 1 0 0 0 0 0 4096 17663 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat(text), Some(CpuTicks { utime: 250, stime: 75 }));
        // A name with spaces and a closing parenthesis does not shift the fields.
        let odd = "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1";
        assert_eq!(parse_stat(odd), Some(CpuTicks { utime: 3, stime: 4 }));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn children_ticks_and_parent_come_from_the_stat_line() {
        let line = "42 (post) gres) S 1 42 42 0 -1 4194560 10 0 0 0 7 3 11 5 20 0 1 0 100 0 0";
        assert_eq!(stat_ppid(line), Some(1));
        assert_eq!(stat_ticks_with_children(line), Some(7 + 3 + 11 + 5));
    }

    #[test]
    fn status_lines_in_kilobytes() {
        let text = "Name:\tbaton-hub\nVmPeak:\t  900000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\nThreads:\t9\n";
        assert_eq!(parse_status_bytes(text, "VmHWM"), Some(51200 * 1024));
        assert_eq!(parse_status_bytes(text, "VmRSS"), Some(40960 * 1024));
        assert_eq!(parse_status_bytes(text, "Threads"), Some(9));
        assert_eq!(parse_status_bytes(text, "VmSwap"), None);
        assert_eq!(parse_status_bytes(text, "Vm"), None, "a key is matched whole, not as a prefix");
    }

    #[test]
    fn own_process_can_be_sampled() {
        let s = sample(std::process::id(), clock_ticks()).unwrap();
        assert!(s.peak_rss_bytes >= s.rss_bytes && s.rss_bytes > 0, "{s:?}");
    }
}
