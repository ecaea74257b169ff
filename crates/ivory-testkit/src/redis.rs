//! `RedisServer`: the real `redis-server` (Debian package `redis-server`) on a loopback port,
//! without persistence, for the shared L2 cache's tests. It can be paused (SIGSTOP: accepts
//! connections, never answers), resumed, stopped and started again on the same port, and also
//! listen with TLS ([`RedisServer::start_tls`]) on a second port, with a certificate from a
//! throwaway CA ([`TestPki`]).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::error::{Error, Result, io};
use crate::pki::TestPki;
use crate::ports::{START_ATTEMPTS, free_port, is_port_taken};

/// Binary started by the harness.
pub const REDIS_BINARY: &str = "redis-server";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// A running `redis-server`; dropping it kills the process and removes its directory.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    tls: Option<TlsPort>,
}

/// The TLS listener of a [`RedisServer::start_tls`] server.
struct TlsPort {
    port: u16,
    ca_pem: String,
}

impl RedisServer {
    /// Starts `redis-server` on a free 127.0.0.1 port and waits until it answers as itself; starts
    /// again on another port if it lost the race for one.
    pub async fn start() -> Result<Self> {
        Self::start_with(false).await
    }

    /// [`RedisServer::start`], also listening with TLS (server certificate for `127.0.0.1` from a
    /// fresh CA, [`RedisServer::ca_pem`]; clients need no certificate) on
    /// [`RedisServer::tls_url`]. The plain port stays open for the harness's readiness check.
    pub async fn start_tls() -> Result<Self> {
        Self::start_with(true).await
    }

    async fn start_with(tls: bool) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ivory-redis-harness-")
            .tempdir()
            .map_err(io("creating redis temp dir"))?;
        let tls = if tls {
            let pki = TestPki::generate("ivory redis test CA")?;
            for (name, pem) in [
                ("server.pem", &pki.server_chain_pem),
                ("server.key", &pki.server_key_pem),
                ("ca.pem", &pki.ca_pem),
            ] {
                std::fs::write(dir.path().join(name), pem)
                    .map_err(io(format!("writing redis {name}")))?;
            }
            Some(TlsPort {
                port: free_port()?,
                ca_pem: pki.ca_pem,
            })
        } else {
            None
        };
        let mut server = Self {
            child: None,
            port: free_port()?,
            dir,
            tls,
        };
        let mut attempt = 1;
        loop {
            match server.spawn().await {
                Err(err) if is_port_taken(&err) && attempt < START_ATTEMPTS => {
                    attempt += 1;
                    server.port = free_port()?;
                    if let Some(tls) = server.tls.as_mut() {
                        tls.port = free_port()?;
                    }
                }
                Err(err) => return Err(err),
                Ok(()) => return Ok(server),
            }
        }
    }

    async fn spawn(&mut self) -> Result<()> {
        let log = std::fs::File::create(self.dir.path().join("redis.log"))
            .map_err(io("creating redis log"))?;
        let mut command = Command::new(REDIS_BINARY);
        command
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path());
        if let Some(tls) = &self.tls {
            let file = |name: &str| self.dir.path().join(name);
            command
                .arg("--tls-port")
                .arg(tls.port.to_string())
                .arg("--tls-cert-file")
                .arg(file("server.pem"))
                .arg("--tls-key-file")
                .arg(file("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(file("ca.pem"))
                .args(["--tls-auth-clients", "no"]);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .map_err(io(format!(
                "spawning {REDIS_BINARY} (Debian package redis-server; scripts/test.sh installs it)"
            )))?;
        let pid = child.id();
        self.child = Some(child);
        let start = ivory_clock::now();
        while start.elapsed() < STARTUP_TIMEOUT {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(Error::Startup(format!(
                    "{REDIS_BINARY} on port {} exited with {status}: {}",
                    self.port,
                    self.log_tail()
                )));
            }
            // Another server may hold the port while ours fails to bind: only our pid counts.
            if self.server_pid() == Some(pid) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(Error::Startup(format!(
            "{REDIS_BINARY} did not answer on port {} within {STARTUP_TIMEOUT:?}: {}",
            self.port,
            self.log_tail()
        )))
    }

    /// The `process_id` the server on our port reports through `INFO server`.
    fn server_pid(&self) -> Option<u32> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
        s.write_all(b"INFO server\r\n").ok()?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        while reply.len() < 64 * 1024 {
            let n = s.read(&mut buf).ok()?;
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&reply);
            if let Some(pid) = text
                .lines()
                .find_map(|line| line.strip_prefix("process_id:"))
                .and_then(|rest| rest.trim().parse().ok())
            {
                return Some(pid);
            }
        }
        None
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:<tls port>` of a [`RedisServer::start_tls`] server.
    pub fn tls_url(&self) -> Option<String> {
        self.tls
            .as_ref()
            .map(|tls| format!("rediss://127.0.0.1:{}", tls.port))
    }

    /// The CA (PEM) of the TLS certificate of a [`RedisServer::start_tls`] server.
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|tls| tls.ca_pem.as_str())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_port_held_by_another_server_is_a_port_taken_error_not_a_false_start() {
        let first = RedisServer::start().await.unwrap();
        let mut second = RedisServer::start().await.unwrap();
        second.stop();
        second.port = first.port();
        // The first server answers on that port, yet the second must not count as started.
        let err = second.spawn().await.expect_err("the port is taken");
        assert!(is_port_taken(&err), "{err}");
        assert!(second.pid().is_none());
    }
}
