//! A small RESP2 client: a few connections (plain TCP or rustls), each call "write the
//! commands, read exactly their replies" through the bounded parser of [`crate::resp`], and a
//! connection that failed in any way (deadline, oversize, protocol error, error reply) is
//! dropped, never reused and never read further.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::Error;
use crate::resp::{self, Limits, Parsed, ProtocolError, Reply};

/// Connections open at once (in use or idle): bounds both the load on the store and the
/// memory a hostile one can make a replica hold (`MAX_CONNECTIONS × max_total`, 8 MiB with
/// the default 1 MiB entries). A call takes about a millisecond, so eight serve thousands of
/// calls a second; a call finding all eight busy waits for one within its deadline.
pub(crate) const MAX_CONNECTIONS: usize = 8;
/// Bytes asked from the socket at a time.
const READ_CHUNK: usize = 64 * 1024;
/// Bytes of an error reply kept for the log.
const MAX_ERROR_SHOWN: usize = 200;
/// Capacity a reply buffer starts with: every reply but a large entry fits.
const FIRST_BUFFER: usize = 4 * 1024;

/// Where and how to connect, from the URL.
#[derive(Clone)]
pub(crate) struct Target {
    host: String,
    port: u16,
    user: Option<String>,
    password: Option<String>,
    db: u32,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Target")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("db", &self.db)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Target {
    /// `redis://[[user]:password@]host[:port][/db]` or `rediss://…` (TLS, trusting the system
    /// roots plus `ca_pem`). Error details never repeat the URL, which may hold a password.
    pub(crate) fn parse(url: &str, ca_pem: Option<&[u8]>) -> Result<Self, Error> {
        let bad = |why: &str| Error::Url(why.to_owned());
        let (tls, rest) = if let Some(rest) = url.strip_prefix("rediss://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("redis://") {
            (false, rest)
        } else {
            return Err(bad("the scheme must be redis:// or rediss://"));
        };
        if rest.contains(['?', '#']) {
            return Err(bad("query parameters and fragments are not supported"));
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (u, p) = info.split_once(':').unwrap_or((info, ""));
                let u = percent_decode(u).ok_or_else(|| bad("bad percent-encoding in the user"))?;
                let p =
                    percent_decode(p).ok_or_else(|| bad("bad percent-encoding in the password"))?;
                (
                    Some(u).filter(|u| !u.is_empty()),
                    Some(p).filter(|p| !p.is_empty()),
                )
            }
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed [ in the host"))?;
            (h, after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port = match port {
            None => 6379,
            Some(p) => p.parse().map_err(|_| bad("the port is not a number"))?,
        };
        let db = if path.is_empty() {
            0
        } else {
            path.parse()
                .map_err(|_| bad("the database (path) is not a number"))?
        };
        let tls = if tls {
            let name = ServerName::try_from(host.to_owned())
                .map_err(|_| bad("the host is not a valid TLS server name"))?;
            Some((connector(ca_pem)?, name))
        } else {
            if ca_pem.is_some() {
                return Err(bad("a CA is only used with rediss:// (TLS)"));
            }
            None
        };
        Ok(Self {
            host: host.to_owned(),
            port,
            user,
            password,
            db,
            tls,
        })
    }
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// rustls (aws-lc-rs) trusting the system roots and the certificates of `ca_pem`.
fn connector(ca_pem: Option<&[u8]>) -> Result<tokio_rustls::TlsConnector, Error> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::warn!(%error, "reading system root certificates");
    }
    roots.add_parsable_certificates(native.certs);
    if let Some(pem) = ca_pem {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| Error::Ca(e.to_string()))?;
            roots.add(cert).map_err(|e| Error::Ca(e.to_string()))?;
            added += 1;
        }
        if added == 0 {
            return Err(Error::Ca("no PEM certificate in it".into()));
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Ca(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Why a call failed; the connection it used is gone.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// Connecting, TLS, or the socket.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The reply broke the protocol or a limit.
    #[error("reply refused: {0}")]
    Protocol(#[from] ProtocolError),
    /// The server answered with an error (`-ERR …`).
    #[error("server error: {0}")]
    Server(String),
    /// The server closed the connection.
    #[error("connection closed by the server")]
    Closed,
}

/// One connection: bytes not yet written (kept across a cancelled call, see
/// [`Conn::send_after`]) and the read side.
pub(crate) struct Conn {
    stream: Box<dyn Stream>,
    unsent: Vec<u8>,
    _permit: OwnedSemaphorePermit,
}

impl Conn {
    async fn open(
        target: &Target,
        limits: &Limits,
        permit: OwnedSemaphorePermit,
    ) -> Result<Self, CallError> {
        let tcp = TcpStream::connect((target.host.as_str(), target.port)).await?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn Stream> = match &target.tls {
            None => Box::new(tcp),
            Some((connector, name)) => Box::new(connector.connect(name.clone(), tcp).await?),
        };
        let mut conn = Self {
            stream,
            unsent: Vec::new(),
            _permit: permit,
        };
        let mut setup: Vec<Vec<u8>> = Vec::new();
        match (&target.user, &target.password) {
            (Some(user), Some(password)) => setup.push(resp::command(&[
                b"AUTH",
                user.as_bytes(),
                password.as_bytes(),
            ])),
            (None, Some(password)) => {
                setup.push(resp::command(&[b"AUTH", password.as_bytes()]));
            }
            _ => {}
        }
        if target.db != 0 {
            setup.push(resp::command(&[
                b"SELECT",
                target.db.to_string().as_bytes(),
            ]));
        }
        if !setup.is_empty() {
            conn.call(&setup, limits).await?;
        }
        Ok(conn)
    }

    /// Writes `commands` and reads exactly one reply for each; an error reply, or a byte more
    /// than those replies, fails the call.
    pub(crate) async fn call(
        &mut self,
        commands: &[Vec<u8>],
        limits: &Limits,
    ) -> Result<Vec<Reply>, CallError> {
        for c in commands {
            self.unsent.extend_from_slice(c);
        }
        self.flush().await?;
        let mut replies = Vec::with_capacity(commands.len());
        // Most replies are small; a larger one gets the whole limit at once, so a buffer is
        // allocated at most twice per call (growing it step by step would leave every
        // intermediate size behind in the allocator).
        let most = limits.max_total.saturating_add(1);
        let mut buf: Vec<u8> = Vec::with_capacity(FIRST_BUFFER.min(most));
        while replies.len() < commands.len() {
            match resp::parse(&buf, limits)? {
                Parsed::Reply(reply, used) => {
                    buf.drain(..used);
                    if let Reply::Error(text) = &reply {
                        // Logged: a hostile server's error text is cut short.
                        let shown = &text[..text.len().min(MAX_ERROR_SHOWN)];
                        return Err(CallError::Server(
                            String::from_utf8_lossy(shown).into_owned(),
                        ));
                    }
                    replies.push(reply);
                    continue;
                }
                Parsed::NeedMore => {}
            }
            // Never more than one byte past the limit in the buffer: the parser then refuses.
            let filled = buf.len();
            let want = most.saturating_sub(filled).min(READ_CHUNK);
            if buf.capacity() < filled + want {
                buf.reserve_exact(most - filled);
            }
            buf.resize(filled + want, 0);
            let read = self.stream.read(&mut buf[filled..]).await;
            let n = match read {
                Ok(n) => n,
                Err(e) => return Err(e.into()),
            };
            buf.truncate(filled + n);
            if n == 0 {
                return Err(CallError::Closed);
            }
        }
        if !buf.is_empty() {
            // Replies nobody asked for: the stream is out of step.
            return Err(ProtocolError::Malformed.into());
        }
        Ok(replies)
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        while !self.unsent.is_empty() {
            let n = self.stream.write(&self.unsent).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            // Kept up to date so that a call cancelled mid-write leaves exactly what is unsent.
            self.unsent.drain(..n);
        }
        self.stream.flush().await
    }

    /// After a call was cancelled: writes what it had not written yet, then `command`, then
    /// closes the connection without reading anything. Used to release a lease a timed-out
    /// lookup may still take when the server gets to it: the server runs both in order.
    pub(crate) async fn send_after(mut self, command: Vec<u8>) {
        self.unsent.extend_from_slice(&command);
        if self.flush().await.is_ok() {
            let _ = self.stream.shutdown().await;
        }
    }
}

/// Idle connections and the permits bounding how many exist.
pub(crate) struct Pool {
    target: Target,
    limits: Limits,
    idle: Mutex<Vec<Conn>>,
    permits: Arc<Semaphore>,
}

impl Pool {
    /// A pool that connects to `target` on demand.
    pub(crate) fn new(target: Target, limits: Limits) -> Self {
        Self {
            target,
            limits,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        }
    }

    /// The limits every reply is read under.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// An idle connection, or a new one once fewer than [`MAX_CONNECTIONS`] exist.
    pub(crate) async fn get(&self) -> Result<Conn, CallError> {
        if let Some(conn) = self.idle_conn() {
            return Ok(conn);
        }
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| CallError::Closed)?;
        // Another call may have returned one while this one waited.
        if let Some(conn) = self.idle_conn() {
            return Ok(conn);
        }
        Conn::open(&self.target, &self.limits, permit).await
    }

    /// An idle connection still open with nothing to read: one the server closed meanwhile
    /// (its idle `timeout`, a restart) would otherwise fail the next call and open the breaker,
    /// and one with bytes nobody asked for is out of step.
    fn idle_conn(&self) -> Option<Conn> {
        loop {
            let mut conn = self.idle.lock().ok().and_then(|mut idle| idle.pop())?;
            let mut probe = [0u8; 1];
            if conn.stream.read(&mut probe).now_or_never().is_none() {
                return Some(conn);
            }
        }
    }

    /// A connection whose last call succeeded, for the next call.
    pub(crate) fn put(&self, conn: Conn) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
    }

    /// Drops every idle connection (after a failure: they are as suspect as the failed one).
    pub(crate) fn clear(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }
}

/// How long a [`Conn::send_after`] may take.
pub(crate) const ORPHAN_SEND_LIMIT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(url: &str) -> (String, u16, Option<String>, Option<String>, u32, bool) {
        let t = Target::parse(url, None).unwrap_or_else(|e| panic!("{url}: {e}"));
        (t.host, t.port, t.user, t.password, t.db, t.tls.is_some())
    }

    #[test]
    fn urls_parse_into_their_parts() {
        assert_eq!(
            parts("redis://127.0.0.1:6380/2"),
            ("127.0.0.1".into(), 6380, None, None, 2, false)
        );
        assert_eq!(
            parts("redis://:p%40ss@cache"),
            ("cache".into(), 6379, None, Some("p@ss".into()), 0, false)
        );
        assert_eq!(
            parts("rediss://ivory:pw@[::1]:6390"),
            (
                "::1".into(),
                6390,
                Some("ivory".into()),
                Some("pw".into()),
                0,
                true
            )
        );
        for bad in [
            "http://x",
            "redis://",
            "redis://h:port",
            "redis://h/db",
            "redis://h?protocol=resp3",
            "redis://:%zz@h",
        ] {
            let err = Target::parse(bad, None).expect_err(bad);
            assert!(!err.to_string().contains("zz"), "{err}");
        }
        assert!(Target::parse("redis://h", Some(b"pem")).is_err());
        assert!(matches!(
            Target::parse("rediss://h", Some(b"not a pem")),
            Err(Error::Ca(_))
        ));
    }
}
