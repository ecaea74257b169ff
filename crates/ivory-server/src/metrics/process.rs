//! The standard `process_*` metrics of Prometheus clients (resident memory, CPU time, open and
//! maximum file descriptors, start time), read from `/proc/self` at scrape time. prometheus-client
//! has no process collector; the Go and Python clients' names and units are kept, without the
//! `ivory_` prefix, so dashboards written for any Prometheus client read them. Linux only: on
//! other systems nothing is written.

use std::fmt::Write as _;

/// What `/proc/self` says now.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct ProcessStats {
    /// Resident memory, bytes.
    pub(super) resident_bytes: u64,
    /// User and system CPU time, seconds.
    pub(super) cpu_seconds: f64,
    /// Open file descriptors.
    pub(super) open_fds: u64,
    /// The soft limit on file descriptors.
    pub(super) max_fds: u64,
    /// When the process started, Unix seconds.
    pub(super) start_time_seconds: f64,
}

/// Reads the stats, `None` where `/proc` cannot be read.
pub(super) fn read() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    // The command name (field 2) is in parentheses and may hold spaces or `)`: the fields
    // after it start past the last `)`. Fields 14, 15 (utime, stime) and 22 (starttime) are
    // the 12th, 13th and 20th after it.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| fields.get(n)?.parse::<u64>().ok();
    let (utime, stime, start) = (field(11)?, field(12)?, field(19)?);
    let resident_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let boot_time: u64 = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    Some(ProcessStats {
        resident_bytes: resident_pages * rustix::param::page_size() as u64,
        cpu_seconds: (utime + stime) as f64 / ticks,
        open_fds,
        max_fds,
        start_time_seconds: boot_time as f64 + start as f64 / ticks,
    })
}

/// The families in OpenMetrics text (before the `# EOF` line).
pub(super) fn encode(stats: &ProcessStats) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, sample: &str, value: String| {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{sample} {value}\n"
        );
    };
    family(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        "process_resident_memory_bytes",
        stats.resident_bytes.to_string(),
    );
    family(
        "process_cpu_seconds",
        "counter",
        "Total user and system CPU time spent in seconds.",
        "process_cpu_seconds_total",
        stats.cpu_seconds.to_string(),
    );
    family(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        "process_open_fds",
        stats.open_fds.to_string(),
    );
    family(
        "process_max_fds",
        "gauge",
        "Maximum number of open file descriptors.",
        "process_max_fds",
        stats.max_fds.to_string(),
    );
    family(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        "process_start_time_seconds",
        stats.start_time_seconds.to_string(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Oracle: `/proc/self/status`, which the kernel writes from the same counters.
    #[test]
    fn the_stats_agree_with_proc_status() {
        let rss_kib = || -> u64 {
            std::fs::read_to_string("/proc/self/status")
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap()
        };
        // Other tests of this process allocate meanwhile: bracket the read.
        let before = rss_kib();
        let stats = read().expect("/proc is readable here");
        let after = rss_kib();
        let ours = stats.resident_bytes / 1024;
        let (low, high) = (before.min(after), before.max(after));
        assert!(
            ours + 8192 >= low && ours <= high + 8192,
            "statm {ours} KiB, status {before}..{after} KiB"
        );
        assert!(
            stats.open_fds >= 3 && stats.open_fds <= stats.max_fds,
            "{stats:?}"
        );
        let now = ivory_clock::wall()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            stats.start_time_seconds <= now && stats.start_time_seconds > now - 3600.0,
            "{stats:?}"
        );
        let text = encode(&stats);
        assert!(text.contains("# TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total "));
    }
}
