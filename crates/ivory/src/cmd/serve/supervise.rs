//! `ivory serve --supervise`: the listening socket outlives the serving process.
//!
//! When the process serving admissions dies at once (SIGKILL, the kernel's OOM killer, a crash),
//! its listening socket goes with it and, until the kubelet has restarted the container and the
//! endpoint has come back, the API server's new connections to the Pod are refused, which
//! failurePolicy Fail turns into failed admissions (docs/CLUSTER.md, failures under load). Here a
//! small parent process binds the socket, starts `ivory serve` (the same arguments, without
//! `--supervise`) with the socket inherited (the systemd `LISTEN_FDS` protocol, with
//! `LISTEN_FDS_FIRST_FD` naming the descriptor),
//! and starts it again at once when a signal ends it: the kernel keeps completing handshakes into the
//! socket's backlog meanwhile, and the new process accepts them. SIGTERM and SIGINT are passed
//! on, and the parent exits with the serving process's status when that process ends after
//! one. What the parent cannot save: requests in flight on the connections of the process that
//! died.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use rustix::io::{FdFlags, fcntl_setfd};
use rustix::process::{Pid, Signal, kill_process};
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

/// A serving process that lived at least this long is started again at once; one that died
/// sooner is started again after a delay that doubles up to [`MAX_BACKOFF`] (a configuration
/// error must not turn into a fork loop).
const HEALTHY_AFTER: Duration = Duration::from_secs(10);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Binds `addr`, then runs `ivory <serve_args>` with the socket until a shutdown signal.
pub(super) async fn run(addr: SocketAddr, serve_args: Vec<String>) -> anyhow::Result<ExitCode> {
    let listener = TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
    let socket = inheritable(listener)?;
    let exe = std::env::current_exe().context("finding the ivory executable")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut backoff = Duration::ZERO;
    loop {
        let started = ivory_clock::now();
        let mut child = Command::new(&exe)
            .args(&serve_args)
            .env("LISTEN_FDS", "1")
            .env("LISTEN_FDS_FIRST_FD", socket.as_raw_fd().to_string())
            .env_remove("LISTEN_PID")
            .env_remove("LISTEN_FDNAMES")
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let pid = child.id().and_then(|id| Pid::from_raw(id as i32));
        tracing::info!(
            pid = child.id(),
            fd = socket.as_raw_fd(),
            "serving process started"
        );
        let stopping = tokio::select! {
            status = child.wait() => {
                let status = status.context("waiting for the serving process")?;
                // An exit with a code is the serving process's own decision (a configuration
                // error, say): it is this process's too, and the kubelet decides what next.
                if status.code().is_some() {
                    tracing::error!(%status, "serving process exited");
                    return Ok(exit_code(status));
                }
                tracing::error!(%status, "serving process killed; starting another on the same socket");
                None
            }
            _ = term.recv() => Some(Signal::TERM),
            _ = int.recv() => Some(Signal::INT),
        };
        if let Some(sig) = stopping {
            if let Some(pid) = pid {
                // Already gone is fine: its status is read below.
                let _ = kill_process(pid, sig);
            }
            let status = child
                .wait()
                .await
                .context("waiting for the serving process")?;
            tracing::info!(%status, "serving process stopped");
            return Ok(exit_code(status));
        }
        backoff = if started.elapsed() >= HEALTHY_AFTER {
            Duration::ZERO
        } else {
            (backoff * 2).clamp(Duration::from_millis(250), MAX_BACKOFF)
        };
        // The first restart is immediate: a process that had served for a while died.
        if backoff > Duration::from_millis(250) {
            tracing::warn!(
                delay_ms = backoff.as_millis() as u64,
                "serving process keeps dying"
            );
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = term.recv() => return Ok(ExitCode::SUCCESS),
                _ = int.recv() => return Ok(ExitCode::SUCCESS),
            }
        }
    }
}

/// The listening socket with its close-on-exec flag cleared, so that the processes started
/// inherit it.
fn inheritable(listener: TcpListener) -> anyhow::Result<OwnedFd> {
    let fd = OwnedFd::from(listener);
    fcntl_setfd(fd.as_fd(), FdFlags::empty()).context("letting the socket be inherited")?;
    Ok(fd)
}

/// The serving process's status as this process's: its code, or 128 + the signal that ended it.
fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)),
        (None, None) => ExitCode::from(1),
    }
}

/// The socket a supervising process handed on (`LISTEN_FDS`), if any.
pub(super) fn inherited_listener() -> anyhow::Result<Option<TcpListener>> {
    let mut fds = listenfd::ListenFd::from_env();
    if fds.len() == 0 {
        return Ok(None);
    }
    // A serving process must not outlive the process that supervises it (and holds its socket).
    rustix::process::set_parent_process_death_signal(Some(Signal::TERM))
        .context("asking for SIGTERM when the supervising process ends")?;
    fds.take_tcp_listener(0)
        .context("LISTEN_FDS is set but the descriptor it names is not a listening TCP socket")
}

/// The arguments of `ivory serve …` as given, without `--supervise`.
pub(super) fn serve_args() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| a != "--supervise")
        .collect()
}
