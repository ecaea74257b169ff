//! Running the `ivory` binary (built by `cargo build -p ivory`, see scripts/e2e.sh) as a
//! webhook server for the cluster, and pausing it with SIGSTOP/SIGCONT.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use crate::{Error, Result};

/// How long `ivory serve` may take to sync its watches and listen.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// `target/debug/ivory` of this workspace (or of `CARGO_TARGET_DIR`).
pub fn ivory_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("debug/ivory")
}

/// Runs `ivory <args>` to completion with `envs` (and without the persistent cache unless
/// `envs` says otherwise), returning (exit code, stdout, stderr).
pub async fn run_ivory<I, S>(args: I, envs: &[(&str, &OsStr)]) -> Result<(i32, String, String)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let binary = ivory_binary();
    let output = Command::new(&binary)
        .args(args)
        // Registry ports are reused across runs: a tag cached by an earlier run must never
        // answer for another registry's image.
        .env("IVORY_NO_CACHE", "true")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| Error::Ivory {
            binary: binary.clone(),
            source,
        })?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// A running `ivory serve`; killed on drop (also when paused).
pub struct IvoryServer {
    child: Child,
    /// The address from ivory's `listening` log line.
    pub addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl IvoryServer {
    /// Starts `ivory serve --listen 127.0.0.1:0 <args>` with JSON logs and waits for the
    /// `listening` line.
    pub async fn start<I, S>(args: I, envs: &[(&str, &OsStr)]) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Self::start_listening("127.0.0.1:0", args, envs).await
    }

    /// [`Self::start`] on a given address, for webhooks written before ivory starts (static
    /// manifests name the address the API server calls).
    pub async fn start_listening<I, S>(
        listen: &str,
        args: I,
        envs: &[(&str, &OsStr)],
    ) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let binary = ivory_binary();
        let mut child = Command::new(&binary)
            .args(["serve", "--listen", listen])
            .args(args)
            .envs(envs.iter().copied())
            .env("IVORY_LOG_FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| Error::Ivory {
                binary: binary.clone(),
                source,
            })?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = oneshot::channel();
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(collect_logs(stderr, logs.clone(), tx));
        }
        let addr = tokio::time::timeout(START_TIMEOUT, rx)
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|a| a.parse().ok());
        let Some(addr) = addr else {
            let text = logs.lock().map(|l| l.join("\n")).unwrap_or_default();
            return Err(Error::IvoryStart { logs: text });
        };
        Ok(Self { child, addr, logs })
    }

    /// `https://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Everything ivory logged so far.
    pub fn logs(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// SIGSTOP: the process keeps its socket (connections are accepted by the kernel) but never
    /// answers, like a frozen or overloaded webhook.
    pub async fn pause(&self) -> Result<()> {
        self.signal("-STOP").await
    }

    /// SIGCONT after [`Self::pause`].
    pub async fn resume(&self) -> Result<()> {
        self.signal("-CONT").await
    }

    async fn signal(&self, signal: &str) -> Result<()> {
        let pid = self.child.id().ok_or(Error::IvoryGone)?;
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .await
            .map_err(|source| Error::Ivory {
                binary: "kill".into(),
                source,
            })?;
        if status.success() {
            Ok(())
        } else {
            Err(Error::IvoryGone)
        }
    }
}

impl Drop for IvoryServer {
    fn drop(&mut self) {
        // A stopped process still dies from SIGKILL (kill_on_drop).
        let _ = self.child.start_kill();
    }
}

async fn collect_logs(
    stderr: tokio::process::ChildStderr,
    sink: Arc<Mutex<Vec<String>>>,
    tx: oneshot::Sender<String>,
) {
    let mut tx = Some(tx);
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Ok(v) = serde_json::from_str::<Value>(&line)
            && v["fields"]["message"] == "listening"
            && let Some(tx) = tx.take()
        {
            let _ = tx.send(v["fields"]["addr"].as_str().unwrap_or("").to_owned());
        }
        if let Ok(mut logs) = sink.lock() {
            logs.push(line);
        }
    }
}
