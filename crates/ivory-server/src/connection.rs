//! Connections to the webhook port, bounded in number and in idle time.
//!
//! [`GuardedAcceptor`] runs before TLS: it takes one of `max_connections` slots (a connection
//! past the cap is closed at once), wraps the socket in [`WatchedIo`], which closes the
//! connection once it has moved no byte for the idle timeout while no request of it is in
//! flight, or while a write waits for a peer that reads nothing, and wraps the connection's
//! service to count those requests. hyper's own header
//! timeout and the TLS handshake timeout bound the other waits.

use std::future::{Future, Ready};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum_server::accept::Accept;
use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::metrics::Metrics;

/// The acceptor that bounds connections: a slot each, an idle timeout, requests counted.
#[derive(Clone)]
pub struct GuardedAcceptor {
    slots: Arc<Semaphore>,
    idle: Duration,
    metrics: Arc<Metrics>,
}

impl GuardedAcceptor {
    /// At most `max_connections` at once, each closed after `idle` without traffic or request.
    pub fn new(max_connections: usize, idle: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS))),
            idle,
            metrics,
        }
    }
}

impl<I, S> Accept<I, S> for GuardedAcceptor
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    type Stream = WatchedIo<I>;
    type Service = CountingService<S>;
    type Future = Ready<io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            self.metrics.connection_refused("max_connections");
            return std::future::ready(Err(io::Error::other("connection limit reached")));
        };
        let in_flight = Arc::new(AtomicUsize::new(0));
        let io = WatchedIo {
            inner: stream,
            in_flight: in_flight.clone(),
            idle: self.idle,
            last: ivory_clock::now(),
            deadline: Box::pin(tokio::time::sleep(self.idle)),
            metrics: self.metrics.clone(),
            _slot: slot,
        };
        std::future::ready(Ok((
            io,
            CountingService {
                inner: service,
                in_flight,
            },
        )))
    }
}

/// A connection's socket that fails its reads once the connection has been idle too long.
pub struct WatchedIo<I> {
    inner: I,
    in_flight: Arc<AtomicUsize>,
    idle: Duration,
    /// When a byte last moved (or a request of it was last seen in flight).
    last: Instant,
    /// Armed at `last + idle` only while a read waits, so traffic costs no timer update.
    deadline: Pin<Box<Sleep>>,
    metrics: Arc<Metrics>,
    _slot: OwnedSemaphorePermit,
}

impl<I> WatchedIo<I> {
    fn active(&mut self) {
        self.last = ivory_clock::now();
    }

    /// Called when a read found nothing to read: an error once idle for too long.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            // A request is being judged: its answer, not the client, is what the connection
            // waits for. The idle clock starts again once the answer is written.
            self.active();
            return Poll::Pending;
        }
        self.poll_expired(cx, "idle_timeout").map(Err)
    }

    /// Called when a write could not proceed because the peer reads nothing: an error once no
    /// byte has moved for the idle timeout, whatever is in flight, so an answer nobody reads
    /// cannot hold the connection (and its slot) forever.
    fn poll_stalled(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.poll_expired(cx, "write_stalled").map(Err)
    }

    /// A write's outcome: progress counts as activity, a write that cannot proceed waits at
    /// most until the idle timeout.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.active();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.poll_stalled(cx),
        }
    }

    /// Ready with the error once `last + idle` has passed; counts it under `reason`.
    fn poll_expired(&mut self, cx: &mut Context<'_>, reason: &str) -> Poll<io::Error> {
        let at = self.last + self.idle;
        if self.deadline.deadline() != at {
            self.deadline.as_mut().reset(at);
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.metrics.connection_refused(reason);
                Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connection closed: {reason}"),
                ))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WatchedIo<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.active();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_idle(cx),
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WatchedIo<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.after_write(cx, written)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.after_write(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A connection's service that counts its requests in flight for [`WatchedIo`].
#[derive(Clone)]
pub struct CountingService<S> {
    inner: S,
    in_flight: Arc<AtomicUsize>,
}

/// Holds one request in the count until dropped (answered, or abandoned with its connection).
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<S, R> tower::Service<R> for CountingService<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(self.in_flight.clone());
        let answer = self.inner.call(request);
        Box::pin(async move {
            let _guard = guard;
            answer.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn watched(
        idle: Duration,
    ) -> (
        WatchedIo<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
        Arc<AtomicUsize>,
    ) {
        let (ours, theirs) = tokio::io::duplex(64);
        let acceptor = GuardedAcceptor::new(1, idle, Arc::new(Metrics::new()));
        let slot = acceptor.slots.clone().try_acquire_owned().unwrap();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let io = WatchedIo {
            inner: ours,
            in_flight: in_flight.clone(),
            idle,
            last: ivory_clock::now(),
            deadline: Box::pin(tokio::time::sleep(idle)),
            metrics: acceptor.metrics.clone(),
            _slot: slot,
        };
        (io, theirs, in_flight)
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_fails_its_read_after_the_idle_timeout() {
        let (mut io, mut client, _) = watched(Duration::from_secs(5));
        client.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 1);
        let started = ivory_clock::now();
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_keeps_a_silent_connection_open() {
        let (mut io, _client, in_flight) = watched(Duration::from_secs(5));
        in_flight.store(1, Ordering::Release);
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(60), io.read(&mut buf)).await;
        assert!(read.is_err(), "the read still waits after 60 s: {read:?}");
        in_flight.store(0, Ordering::Release);
        let started = ivory_clock::now();
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(5),
            "idle counts from the answer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_reads_nothing_cannot_hold_a_write_forever() {
        let (mut io, _client, in_flight) = watched(Duration::from_secs(5));
        // Even with a request in flight: the answer is what cannot be delivered.
        in_flight.store(1, Ordering::Release);
        let started = ivory_clock::now();
        let chunk = [0u8; 16];
        let err = loop {
            match io.write(&chunk).await {
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[test]
    fn connections_past_the_cap_are_refused() {
        let metrics = Arc::new(Metrics::new());
        let acceptor = GuardedAcceptor::new(1, Duration::from_secs(1), metrics.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let (a, _ka) = tokio::io::duplex(8);
            let (b, _kb) = tokio::io::duplex(8);
            let first = Accept::accept(&acceptor, a, ()).await;
            assert!(first.is_ok());
            let second = Accept::accept(&acceptor, b, ()).await;
            assert!(second.is_err());
            drop(first);
            let (c, _kc) = tokio::io::duplex(8);
            assert!(
                Accept::accept(&acceptor, c, ()).await.is_ok(),
                "a closed connection frees its slot"
            );
        });
        assert!(
            metrics
                .encode()
                .contains("ivory_http_connections_refused_total{reason=\"max_connections\"} 1")
        );
    }
}
