//! `RedisServer`: the real `redis-server` (Debian package `redis-server`) on a loopback port,
//! without persistence, for the shared L2 cache's tests. It can be paused (SIGSTOP: accepts
//! connections, never answers), resumed, stopped and started again on the same port.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result, io};
use crate::registry::free_port;

/// Binary started by the harness.
pub const REDIS_BINARY: &str = "redis-server";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// A running `redis-server`; dropping it kills the process and removes its directory.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts `redis-server` on a free 127.0.0.1 port and waits until it answers `PING`.
    pub async fn start() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ivory-redis-harness-")
            .tempdir()
            .map_err(io("creating redis temp dir"))?;
        let mut server = Self {
            child: None,
            port: free_port()?,
            dir,
        };
        server.spawn().await?;
        Ok(server)
    }

    async fn spawn(&mut self) -> Result<()> {
        let log = std::fs::File::create(self.dir.path().join("redis.log"))
            .map_err(io("creating redis log"))?;
        let child = Command::new(REDIS_BINARY)
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .map_err(io(format!(
                "spawning {REDIS_BINARY} (Debian package redis-server; scripts/test.sh installs it)"
            )))?;
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < STARTUP_TIMEOUT {
            if self.ping() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(Error::Startup(format!(
            "{REDIS_BINARY} did not answer PING on port {} within {STARTUP_TIMEOUT:?}",
            self.port
        )))
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn signal(&self, signal: &str) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| Error::Startup("redis-server is not running".into()))?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .map_err(io(format!("kill -{signal} {pid}")))?;
        if status.success() {
            Ok(())
        } else {
            Err(Error::Startup(format!("kill -{signal} {pid}: {status}")))
        }
    }

    /// SIGSTOP: the kernel still accepts connections and requests, nothing answers.
    pub fn pause(&self) -> Result<()> {
        self.signal("STOP")
    }

    /// SIGCONT after [`RedisServer::pause`].
    pub fn resume(&self) -> Result<()> {
        self.signal("CONT")
    }

    /// Kills the server (connections are refused until [`RedisServer::restart`]).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop();
        self.spawn().await
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends a paused (stopped) process too.
        self.stop();
    }
}
