//! Child processes under test (`ivory serve`, `null-webhook`): spawn with logs to a file,
//! wait for readiness, read their memory high-water mark, kill on drop.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

/// How long a server gets to answer its readiness URL.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running server; killed when dropped.
pub(crate) struct Server {
    name: String,
    child: Child,
    pub url: String,
}

impl Server {
    /// Spawns `cmd` with stdout/stderr into `log`, then polls `url + ready_path` until 200.
    pub(crate) async fn start(
        name: &str,
        cmd: Command,
        log: &Path,
        url: String,
        ready_path: &str,
        client: &reqwest::Client,
    ) -> Result<Self> {
        Self::start_within(name, cmd, log, url, ready_path, client, READY_TIMEOUT).await
    }

    /// [`Server::start`] with its own readiness timeout.
    pub(crate) async fn start_within(
        name: &str,
        mut cmd: Command,
        log: &Path,
        url: String,
        ready_path: &str,
        client: &reqwest::Client,
        ready_timeout: Duration,
    ) -> Result<Self> {
        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("cloning log handle")?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("spawning {name}"))?;
        let mut server = Self {
            name: name.to_owned(),
            child,
            url,
        };
        server
            .wait_ready(ready_path, client, log, ready_timeout)
            .await?;
        Ok(server)
    }

    async fn wait_ready(
        &mut self,
        path: &str,
        client: &reqwest::Client,
        log: &Path,
        timeout: Duration,
    ) -> Result<()> {
        let url = format!("{}{path}", self.url);
        let started = ivory_clock::now();
        loop {
            if let Some(status) = self.child.try_wait().context("polling child")? {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                bail!("{} exited with {status} before ready:\n{text}", self.name);
            }
            if let Ok(res) = client.get(&url).send().await
                && res.status().is_success()
            {
                return Ok(());
            }
            if started.elapsed() > timeout {
                bail!("{} not ready on {url} after {timeout:?}", self.name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// (VmHWM, VmRSS) in KiB from /proc.
    pub(crate) fn memory_kib(&self) -> Result<(u64, u64)> {
        memory_kib_of(self.child.id())
    }
}

impl Server {
    /// User + system CPU time the server process has used so far (all its threads).
    pub(crate) fn cpu_time(&self) -> Result<Duration> {
        Ok(self.cpu_times()?.total())
    }

    /// The CPU time the server process has used so far (all its threads), user and system
    /// apart.
    pub(crate) fn cpu_times(&self) -> Result<CpuTimes> {
        cpu_times_of(self.child.id())
    }
}

/// The CPU time process `pid` has used so far (all its threads), from `/proc/<pid>/stat` in
/// clock ticks.
pub(crate) fn cpu_times_of(pid: u32) -> Result<CpuTimes> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // Fields after the parenthesised command name (which may hold spaces): utime is the 14th
    // field of the line, stime the 15th, i.e. the 12th and 13th after the name.
    let after_name = text
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("{path}: no command name"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| -> Result<Duration> {
        let count: u64 = fields
            .get(i)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{path}: field {} unreadable", i + 3))?;
        Ok(Duration::from_secs_f64(
            count as f64 / clock_ticks_per_second(),
        ))
    };
    Ok(CpuTimes {
        user: ticks(11)?,
        system: ticks(12)?,
    })
}

/// A process's CPU time, in user space and in the kernel on its behalf.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuTimes {
    /// In user space (`utime`).
    pub(crate) user: Duration,
    /// In the kernel (`stime`): system calls, the network stack's work for its sockets.
    pub(crate) system: Duration,
}

impl CpuTimes {
    /// User and system together.
    pub(crate) fn total(self) -> Duration {
        self.user + self.system
    }

    /// What was used since `earlier`.
    pub(crate) fn since(self, earlier: CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }
}

/// `getconf CLK_TCK` (100 on Linux unless the kernel says otherwise), read once.
fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|t: &f64| *t > 0.0)
            .unwrap_or(100.0)
    })
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port outside the kernel's ephemeral range (see `ivory_testkit::free_port`;
/// the bind is released before the server takes it).
pub(crate) fn free_port() -> Result<u16> {
    ivory_testkit::free_port().context("finding a free port")
}

/// Peak and current resident memory (`VmHWM`, `VmRSS`, KiB) of the process `pid`.
pub(crate) fn memory_kib_of(pid: u32) -> Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let field = |name: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} missing in {path}"))
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `work` until `grown` says the process's times since the start grew as it should, or
    /// fails after a while; returns how they grew.
    fn until(work: impl Fn(), grown: impl Fn(CpuTimes) -> bool) -> CpuTimes {
        let me = std::process::id();
        let start = cpu_times_of(me).expect("own times");
        let deadline = ivory_clock::now() + Duration::from_secs(20);
        loop {
            work();
            let used = cpu_times_of(me).expect("own times").since(start);
            if grown(used) {
                return used;
            }
            assert!(
                ivory_clock::now() < deadline,
                "times did not grow: {used:?}"
            );
        }
    }

    #[test]
    fn user_and_system_time_are_read_apart() {
        // Arithmetic only: user time grows, and more than system time.
        let spin = || {
            let mut x = 1u64;
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
            }
        };
        let used = until(spin, |t| t.user >= Duration::from_millis(200));
        assert!(used.user > used.system, "{used:?}");
        // System calls: system time grows.
        let calls = || {
            for _ in 0..200 {
                let _ = std::fs::read_to_string("/proc/self/stat");
            }
        };
        until(calls, |t| t.system >= Duration::from_millis(100));
    }
}
