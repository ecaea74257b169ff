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
    /// User + system CPU time the server process has used so far (all its threads), from
    /// `/proc/<pid>/stat` in clock ticks.
    pub(crate) fn cpu_time(&self) -> Result<Duration> {
        let path = format!("/proc/{}/stat", self.child.id());
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        // Fields after the parenthesised command name (which may hold spaces): utime is the
        // 14th field of the line, stime the 15th, i.e. the 12th and 13th after the name.
        let after_name = text
            .rsplit_once(')')
            .map(|(_, rest)| rest)
            .with_context(|| format!("{path}: no command name"))?;
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let ticks = |i: usize| -> Result<u64> {
            fields
                .get(i)
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("{path}: field {} unreadable", i + 3))
        };
        let total = ticks(11)? + ticks(12)?;
        Ok(Duration::from_secs_f64(
            total as f64 / clock_ticks_per_second(),
        ))
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
