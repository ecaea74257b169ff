//! Serving the router: HTTPS (HTTP/1.1 and HTTP/2 via ALPN) with certificate reload, or plain
//! HTTP for local use, and graceful shutdown with a grace period. Connections are bounded by
//! [`HttpLimits`]: a cap, handshake, header, idle and answer timeouts, budgets of header and
//! answer bytes ([`crate::connection`]), and HTTP/2 header lists and streams per connection.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use axum_server::{Handle, Server};
use tokio::time::MissedTickBehavior;

use crate::connection::GuardedAcceptor;
use crate::error::{Error, Result};
use crate::limits::HttpLimits;
use crate::metrics::Metrics;

/// HTTP/2 streams one connection may have open at once. Each open stream costs a few KiB of
/// state while its answer waits or its body stalls, whatever the budgets charge, so this times
/// the connection cap bounds that memory (docs/SECURITY.md); the API server opens another
/// connection once a connection's streams are all in use.
const H2_MAX_CONCURRENT_STREAMS: u32 = 32;
/// Largest HTTP/2 header list (an admission call's headers are a few hundred bytes, a bearer
/// token a few KiB); hyper's default.
const H2_MAX_HEADER_LIST: u32 = 16 * 1024;
/// Largest HTTP/1.1 read buffer, headers included (hyper's default is about 400 KiB).
const H1_MAX_BUF: usize = 64 * 1024;

/// How to listen.
#[derive(Clone, Debug)]
pub enum Listen {
    /// HTTPS with a PEM certificate chain and key, reloaded when either file changes.
    Tls {
        /// The certificate chain file.
        cert: PathBuf,
        /// The private key file.
        key: PathBuf,
    },
    /// Plain HTTP (local use only).
    Insecure,
}

/// How [`serve`] listens and shuts down: address, TLS, drain time, certificate reloading.
#[derive(Debug)]
pub struct ServeOptions {
    /// The address the admission routes listen on.
    pub addr: SocketAddr,
    /// A socket already listening on `addr`, inherited from the process that started this one
    /// (`ivory serve --supervise`): served instead of binding `addr`, so that connections made
    /// while this process was being replaced wait in its backlog instead of being refused.
    pub inherited: Option<std::net::TcpListener>,
    /// TLS or plain HTTP.
    pub listen: Listen,
    /// In-flight requests get this long to finish after the shutdown signal.
    pub grace: Duration,
    /// How often the certificate files are checked for changes.
    pub cert_poll: Duration,
    /// Bounds on connections (the same value the router's state reads its body bounds from).
    pub limits: HttpLimits,
    /// Where refused connections are counted.
    pub metrics: Arc<Metrics>,
}

/// Serves `router` until `shutdown` resolves, then stops accepting and lets in-flight
/// requests finish within the grace period. Logs `listening` with the bound address.
pub async fn serve(
    router: Router,
    opts: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let handle: Handle<SocketAddr> = Handle::new();
    let grace = opts.grace;
    let stopper = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!(grace_ms = grace.as_millis() as u64, "shutting down");
        stopper.graceful_shutdown(Some(grace));
    });
    let announcer = handle.clone();
    let tls = matches!(opts.listen, Listen::Tls { .. });
    tokio::spawn(async move {
        if let Some(addr) = announcer.listening().await {
            tracing::info!(addr = %addr, tls, "listening");
        }
    });
    let service = router.into_make_service();
    let addr = opts.addr;
    let guard = GuardedAcceptor::new(&opts.limits, opts.metrics.clone());
    let base = match opts.inherited {
        Some(listener) => {
            axum_server::from_tcp(listener).map_err(|source| Error::Serve { addr, source })?
        }
        None => axum_server::bind(addr),
    };
    let served = match opts.listen {
        Listen::Tls { cert, key } => {
            let config = RustlsConfig::from_pem_file(&cert, &key)
                .await
                .map_err(|source| Error::Tls {
                    cert: cert.clone(),
                    key: key.clone(),
                    source,
                })?;
            let reload = tokio::spawn(watch_certificate(
                config.clone(),
                (cert, key),
                opts.cert_poll,
                opts.metrics.clone(),
            ));
            let acceptor = RustlsAcceptor::new(config)
                .handshake_timeout(opts.limits.handshake_timeout)
                .acceptor(guard);
            let mut server = base.acceptor(acceptor);
            bound(&mut server, &opts.limits);
            let served = server.handle(handle).serve(service).await;
            reload.abort();
            served
        }
        Listen::Insecure => {
            let mut server = base.acceptor(guard);
            bound(&mut server, &opts.limits);
            server.handle(handle).serve(service).await
        }
    };
    served.map_err(|source| Error::Serve { addr, source })
}

/// hyper's per-connection bounds: the HTTP/1.1 header timeout and buffer, HTTP/2 streams and
/// header lists.
fn bound<A: axum_server::Address, Acc>(server: &mut Server<A, Acc>, limits: &HttpLimits) {
    let builder = server.http_builder();
    builder
        .http1()
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(H1_MAX_BUF);
    builder
        .http2()
        .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
        .max_header_list_size(H2_MAX_HEADER_LIST);
}

/// Reloads the certificate when the files' contents change. A broken pair (half-written
/// renewal) is logged and the current certificate stays until a good pair appears.
async fn watch_certificate(
    config: RustlsConfig,
    (cert, key): (PathBuf, PathBuf),
    every: Duration,
    metrics: Arc<Metrics>,
) {
    let mut last = read_pair(&cert, &key).await;
    let file = cert.display().to_string();
    if let Some(not_after) = last.as_ref().and_then(|(c, _)| not_after(c)) {
        metrics.certificate_expires(&file, not_after);
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = read_pair(&cert, &key).await;
        if now == last {
            continue;
        }
        let Some((c, k)) = now.clone() else {
            tracing::error!(cert = %cert.display(), key = %key.display(), "TLS files unreadable; keeping the current certificate");
            last = now;
            continue;
        };
        let expiry = not_after(&c);
        match config.reload_from_pem(c, k).await {
            Ok(()) => {
                tracing::info!(cert = %cert.display(), "TLS certificate reloaded");
                if let Some(not_after) = expiry {
                    metrics.certificate_expires(&file, not_after);
                }
                last = now;
            }
            // Not recorded as seen: the next tick retries, so a key written after its
            // certificate is picked up.
            Err(e) => {
                tracing::error!(cert = %cert.display(), error = %e, "TLS reload failed; keeping the current certificate")
            }
        }
    }
}

/// The `notAfter` (Unix seconds) of the first certificate of a PEM chain, the one served.
fn not_after(pem: &[u8]) -> Option<i64> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;
    use x509_cert::der::Decode as _;
    let leaf = CertificateDer::pem_slice_iter(pem).next()?.ok()?;
    let certificate = x509_cert::Certificate::from_der(leaf.as_ref()).ok()?;
    let seconds = certificate
        .tbs_certificate
        .validity
        .not_after
        .to_unix_duration()
        .as_secs();
    i64::try_from(seconds).ok()
}

async fn read_pair(cert: &Path, key: &Path) -> Option<(Vec<u8>, Vec<u8>)> {
    let c = tokio::fs::read(cert).await.ok()?;
    let k = tokio::fs::read(key).await.ok()?;
    Some((c, k))
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
