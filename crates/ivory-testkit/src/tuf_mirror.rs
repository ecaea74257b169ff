//! A TUF mirror on loopback: one repository state of `fixtures/tuf/` (see its README) served
//! over plain HTTP, the way a client meets Sigstore's TUF CDN, with the faults a refresh must
//! survive on demand.
//!
//! The URL stays the same for the mirror's whole life: [`TufMirror::switch`] changes what it
//! serves, [`TufMirror::down`] / [`TufMirror::up`] close and reopen the same port, and
//! [`TufMirror::hang`] makes it take requests and never answer them. Every request is counted
//! by path, so a test can tell whether a refresh reached the mirror at all.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::Response;
use tokio::task::JoinHandle;

use crate::error::{Error, Result, io};
use crate::ports::{START_ATTEMPTS, free_port};

/// The states `fixtures/tuf/` holds, as `scripts/gen-fixtures.sh tuf` writes them.
pub const TUF_STATES: &[&str] = &["state-1", "state-2", "expired", "rollback", "tampered"];

/// `fixtures/tuf/`: the TUF repository states and `root-1.json`, the client's trust anchor.
pub fn tuf_fixtures_dir() -> PathBuf {
    crate::fixtures_dir().join("tuf")
}

/// A plain-HTTP TUF mirror on `127.0.0.1` serving one state directory at a time.
///
/// Metadata is at the root of [`TufMirror::url`] (`1.root.json`, `timestamp.json`, …), targets
/// under `targets/`. Files are read at each request, so a switch shows on the next request.
/// Only file names made of `[A-Za-z0-9._-]` segments are served: anything else (`..`, `%2e`,
/// an absolute path) is answered 400 and never touches the file system.
pub struct TufMirror {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Option<Running>,
}

/// What the handler reads: changed by the test while the server runs.
struct Shared {
    base: PathBuf,
    state: Mutex<String>,
    hanging: AtomicBool,
    counts: Mutex<BTreeMap<String, usize>>,
}

struct Running {
    handle: axum_server::Handle<SocketAddr>,
    task: JoinHandle<()>,
}

impl TufMirror {
    /// Serves `fixtures/tuf/<state>` (one of [`TUF_STATES`]) on a free loopback port.
    pub async fn start(state: &str) -> Result<Self> {
        Self::start_in(tuf_fixtures_dir(), state).await
    }

    /// Serves `<base>/<state>`; [`TufMirror::switch`] then picks other directories of `base`.
    pub async fn start_in(base: impl Into<PathBuf>, state: &str) -> Result<Self> {
        let base = base.into();
        let shared = Arc::new(Shared {
            state: Mutex::new(checked_state(&base, state)?),
            base,
            hanging: AtomicBool::new(false),
            counts: Mutex::new(BTreeMap::new()),
        });
        let mut last_error = None;
        // `free_port` can lose a race with another process; a fresh port is then tried.
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            match listen(port, &shared) {
                Ok(server) => {
                    return Ok(Self {
                        addr: SocketAddr::from(([127, 0, 0, 1], port)),
                        shared,
                        server: Some(server),
                    });
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| Error::Startup("TUF mirror: no port".into())))
    }

    /// The mirror's base URL, `http://127.0.0.1:PORT`, the same across switches and restarts.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the mirror listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The state directory served now.
    pub fn state(&self) -> String {
        lock(&self.shared.state).clone()
    }

    /// Serves `state` (a directory of the base) from the next request on.
    pub fn switch(&self, state: &str) -> Result<()> {
        let state = checked_state(&self.shared.base, state)?;
        *lock(&self.shared.state) = state;
        Ok(())
    }

    /// Stops listening and closes every open connection: the port refuses connections until
    /// [`TufMirror::up`]. Returns once the socket is closed.
    pub async fn down(&mut self) {
        if let Some(server) = self.server.take() {
            server.handle.shutdown();
            let _ = server.task.await;
        }
    }

    /// Listens again on the same port (no-op when already up).
    pub async fn up(&mut self) -> Result<()> {
        if self.server.is_none() {
            self.server = Some(listen(self.addr.port(), &self.shared)?);
        }
        Ok(())
    }

    /// Whether the mirror is listening.
    pub fn is_up(&self) -> bool {
        self.server.is_some()
    }

    /// From now on, accepts connections and reads requests (counting them) but never answers,
    /// as a stalled mirror does; a client has only its own deadline to get out.
    pub fn hang(&self) {
        self.shared.hanging.store(true, Ordering::SeqCst);
    }

    /// Answers requests again (those already hanging stay unanswered).
    pub fn resume(&self) {
        self.shared.hanging.store(false, Ordering::SeqCst);
    }

    /// How many requests for `path` (as sent, e.g. `/timestamp.json`) the mirror received.
    pub fn requests(&self, path: &str) -> usize {
        lock(&self.shared.counts).get(path).copied().unwrap_or(0)
    }

    /// Requests received so far, by path, whatever was answered (refusals and hangs included).
    pub fn request_counts(&self) -> BTreeMap<String, usize> {
        lock(&self.shared.counts).clone()
    }

    /// All requests received so far.
    pub fn total_requests(&self) -> usize {
        lock(&self.shared.counts).values().sum()
    }

    /// Forgets the counts, so a test can count one refresh.
    pub fn reset_requests(&self) {
        lock(&self.shared.counts).clear();
    }
}

impl Drop for TufMirror {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.handle.shutdown();
            server.task.abort();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `state` if it names a directory of `base` by one plain segment.
fn checked_state(base: &Path, state: &str) -> Result<String> {
    let dir = safe_relative(state).map(|rel| base.join(rel));
    match dir {
        Some(dir) if dir.is_dir() && !state.contains('/') => Ok(state.to_string()),
        _ => Err(Error::Layout {
            path: base.join(state).display().to_string(),
            detail: "not a TUF state directory".into(),
        }),
    }
}

/// Binds `127.0.0.1:port` now (so the port answers once this returns) and serves on it.
fn listen(port: u16, shared: &Arc<Shared>) -> Result<Running> {
    // std's bind sets SO_REUSEADDR, so the port of a mirror taken down can be bound again
    // while its old connections sit in TIME_WAIT.
    let listener = TcpListener::bind(("127.0.0.1", port))
        .map_err(io(format!("binding the TUF mirror on 127.0.0.1:{port}")))?;
    let server = axum_server::from_tcp(listener).map_err(io("TUF mirror listener"))?;
    let handle = axum_server::Handle::new();
    let app = axum::Router::new()
        .fallback(handle_request)
        .with_state(shared.clone());
    let server = server.handle(handle.clone());
    let task = tokio::spawn(async move {
        let _ = server.serve(app.into_make_service()).await;
    });
    Ok(Running { handle, task })
}

async fn handle_request(State(shared): State<Arc<Shared>>, method: Method, uri: Uri) -> Response {
    let path = uri.path().to_string();
    *lock(&shared.counts).entry(path.clone()).or_insert(0) += 1;
    if shared.hanging.load(Ordering::SeqCst) {
        // Dropped when the client gives up or the mirror goes down.
        std::future::pending::<()>().await;
    }
    if method != Method::GET {
        return status(StatusCode::METHOD_NOT_ALLOWED);
    }
    let Some(relative) = safe_relative(path.trim_start_matches('/')) else {
        return status(StatusCode::BAD_REQUEST);
    };
    let state = lock(&shared.state).clone();
    let file = shared.base.join(state).join(relative);
    match tokio::fs::read(&file).await {
        Ok(bytes) => {
            let content_type = if path.ends_with(".json") {
                "application/json"
            } else {
                "application/octet-stream"
            };
            Response::builder()
                .header(header::CONTENT_TYPE, content_type)
                .body(Body::from(bytes))
                .unwrap_or_else(|_| status(StatusCode::INTERNAL_SERVER_ERROR))
        }
        // A missing file is how a TUF client learns the root chain ends: 404, as a CDN says.
        Err(_) => status(StatusCode::NOT_FOUND),
    }
}

/// `path` as a relative path of plain name segments (`[A-Za-z0-9._-]`, none `.` or `..`), or
/// `None`. Percent escapes are refused rather than decoded: no fixture name needs one.
fn safe_relative(path: &str) -> Option<PathBuf> {
    if path.is_empty() {
        return None;
    }
    let plain = path.split('/').all(|segment| {
        !segment.is_empty()
            && segment != "."
            && segment != ".."
            && segment
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    let relative = PathBuf::from(path);
    let normal = relative
        .components()
        .all(|component| matches!(component, Component::Normal(_)));
    (plain && normal).then_some(relative)
}

fn status(code: StatusCode) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = code;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_names_are_served() {
        for good in [
            "timestamp.json",
            "2.root.json",
            "targets/ab12.trusted_root.json",
        ] {
            assert_eq!(safe_relative(good), Some(PathBuf::from(good)), "{good}");
        }
        for bad in [
            "",
            "..",
            "../state-1/1.root.json",
            "targets/../../root-1.json",
            "./timestamp.json",
            "/etc/passwd",
            "targets//x",
            "%2e%2e/root-1.json",
            "targets/a b",
            "targets\\..\\x",
        ] {
            assert_eq!(safe_relative(bad), None, "{bad:?}");
        }
    }
}
