//! Connections to the webhook port, bounded in number, in time and in the memory their
//! requests and answers hold.
//!
//! [`GuardedAcceptor`] runs before TLS: it takes one of `max_connections` slots (a connection
//! past the cap is closed at once), wraps the socket in [`WatchedIo`] and the connection's
//! service in [`CountingService`]. The service charges each request's header bytes to a
//! process-wide budget while the request is judged, and each answer's bytes to its
//! connection's budget and a process-wide one until the answer's last byte has left ivory
//! ([`AnswerBody`]); a request or answer past a budget is answered 503 instead. [`WatchedIo`]
//! closes the connection once
//! * it has moved no byte for the idle timeout while no request of it is in flight,
//! * an answer of it has made no progress for the answer timeout (an HTTP/2 client that grants
//!   no flow-control window), or
//! * a write has waited the answer timeout for a peer that reads nothing.
//!
//! hyper's own header timeout and the TLS handshake timeout bound the other waits.

use std::future::{Future, Ready};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::http::{HeaderValue, Method, Request, Response, StatusCode, header};
use axum_server::accept::Accept;
use bytes::{Buf, Bytes};
use futures::future::BoxFuture;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::limits::HttpLimits;
use crate::metrics::Metrics;

/// Largest piece of an answer handed to hyper at once: HTTP/2's default frame size, so that an
/// answer moves (and counts as progress) frame by frame as the client's window opens.
const ANSWER_CHUNK: usize = 16 * 1024;

/// The bounds every connection shares, and what all of them hold now.
struct Shared {
    /// Header bytes of the requests being judged, all connections together.
    header_bytes: AtomicUsize,
    header_budget: usize,
    /// Answer bytes not yet handed to the socket, all connections together.
    answer_bytes: AtomicUsize,
    answer_budget: usize,
    answer_budget_per_connection: usize,
    answer_timeout: Duration,
    idle: Duration,
    metrics: Arc<Metrics>,
}

/// Adds `n` to `held` unless the sum would pass `cap`.
fn charge(held: &AtomicUsize, n: usize, cap: usize) -> bool {
    held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
        h.checked_add(n).filter(|total| *total <= cap)
    })
    .is_ok()
}

/// The acceptor that bounds connections: a slot each, deadlines, budgets of header and answer
/// bytes.
#[derive(Clone)]
pub struct GuardedAcceptor {
    slots: Arc<Semaphore>,
    shared: Arc<Shared>,
}

impl GuardedAcceptor {
    /// At most `limits.max_connections` at once, each bounded by `limits`' timeouts and
    /// budgets of header and answer bytes; refusals counted in `metrics`.
    pub fn new(limits: &HttpLimits, metrics: Arc<Metrics>) -> Self {
        let max = limits.max_connections.min(Semaphore::MAX_PERMITS);
        let slots = Arc::new(Semaphore::new(max));
        let held = slots.clone();
        metrics.count_open_connections(Arc::new(move || {
            max.saturating_sub(held.available_permits())
        }));
        Self {
            slots,
            shared: Arc::new(Shared {
                header_bytes: AtomicUsize::new(0),
                header_budget: limits.header_budget,
                answer_bytes: AtomicUsize::new(0),
                answer_budget: limits.answer_budget,
                answer_budget_per_connection: limits.answer_budget_per_connection,
                answer_timeout: limits.answer_timeout,
                idle: limits.idle_timeout,
                metrics,
            }),
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
            self.shared.metrics.connection_refused("max_connections");
            return std::future::ready(Err(io::Error::other("connection limit reached")));
        };
        let conn = Arc::new(ConnState::new(self.shared.clone()));
        let io = WatchedIo::new(stream, conn.clone(), slot);
        std::future::ready(Ok((
            io,
            CountingService {
                inner: service,
                conn,
            },
        )))
    }
}

/// What one connection holds: requests in flight, answers not yet handed to its socket.
struct ConnState {
    in_flight: AtomicUsize,
    /// Answers (bodies or pieces of them) not yet handed to the socket.
    answers: AtomicUsize,
    answer_bytes: AtomicUsize,
    /// Milliseconds from `born` to when an answer of this connection last moved.
    progress_ms: AtomicU64,
    born: Instant,
    shared: Arc<Shared>,
}

impl ConnState {
    fn new(shared: Arc<Shared>) -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            answers: AtomicUsize::new(0),
            answer_bytes: AtomicUsize::new(0),
            progress_ms: AtomicU64::new(0),
            born: ivory_clock::now(),
            shared,
        }
    }

    /// An answer moved now.
    fn touch(&self) {
        let since = ivory_clock::now().saturating_duration_since(self.born);
        let ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
        self.progress_ms.store(ms, Ordering::Release);
    }

    /// While answers are pending: when the connection is closed unless one of them moves.
    fn answer_deadline(&self) -> Option<Instant> {
        if self.answers.load(Ordering::Acquire) == 0 {
            return None;
        }
        let progress = Duration::from_millis(self.progress_ms.load(Ordering::Acquire));
        Some(self.born + progress + self.shared.answer_timeout)
    }
}

/// A connection's socket that fails its reads and writes once a deadline of the connection
/// has passed.
pub struct WatchedIo<I> {
    inner: I,
    conn: Arc<ConnState>,
    /// When a byte last moved (or a request of it was last seen in flight).
    last: Instant,
    /// Armed only while a read waits, so traffic costs no timer update.
    read_deadline: Pin<Box<Sleep>>,
    /// Since when writes have been waiting for the peer to read.
    write_stalled_since: Option<Instant>,
    /// Made at the first write that has to wait.
    write_deadline: Option<Pin<Box<Sleep>>>,
    _slot: OwnedSemaphorePermit,
}

impl<I> WatchedIo<I> {
    fn new(inner: I, conn: Arc<ConnState>, slot: OwnedSemaphorePermit) -> Self {
        let idle = conn.shared.idle;
        Self {
            inner,
            conn,
            last: ivory_clock::now(),
            read_deadline: Box::pin(tokio::time::sleep(idle)),
            write_stalled_since: None,
            write_deadline: None,
            _slot: slot,
        }
    }

    fn active(&mut self) {
        self.last = ivory_clock::now();
    }

    /// The error that closes the connection, counted under `reason`.
    fn close(&self, reason: &str) -> io::Error {
        self.conn.shared.metrics.connection_refused(reason);
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("connection closed: {reason}"),
        )
    }

    /// The error to close with when an answer of the connection is overdue.
    fn answer_overdue(&self) -> Option<io::Error> {
        let at = self.conn.answer_deadline()?;
        (ivory_clock::now() >= at).then(|| self.close("answer_unread"))
    }

    /// Called when a read found nothing to read: an error once an answer is overdue or the
    /// connection has been idle too long.
    fn poll_read_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (at, reason) = if let Some(at) = self.conn.answer_deadline() {
            (at, "answer_unread")
        } else if self.conn.in_flight.load(Ordering::Acquire) > 0 {
            // A request is being judged: its answer, not the client, is what the connection
            // waits for. The idle clock starts again once the answer is written.
            self.active();
            return Poll::Pending;
        } else {
            (self.last + self.conn.shared.idle, "idle_timeout")
        };
        ready!(poll_until(&mut self.read_deadline, at, cx));
        Poll::Ready(Err(self.close(reason)))
    }

    /// A write's outcome: progress counts as activity; a write that cannot proceed because the
    /// peer reads nothing waits at most the answer timeout, whatever is in flight, so an answer
    /// nobody reads cannot hold the connection (and its slot) for long.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.active();
                    self.write_stalled_since = None;
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let since = *self
                    .write_stalled_since
                    .get_or_insert_with(ivory_clock::now);
                let mut at = since + self.conn.shared.answer_timeout;
                let mut reason = "write_stalled";
                if let Some(answer) = self.conn.answer_deadline()
                    && answer < at
                {
                    (at, reason) = (answer, "answer_unread");
                }
                let deadline = self
                    .write_deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                ready!(poll_until(deadline, at, cx));
                Poll::Ready(Err(self.close(reason)))
            }
        }
    }
}

/// Ready once `at` has passed (`sleep` moved to `at` first if it was set for another time).
fn poll_until(sleep: &mut Pin<Box<Sleep>>, at: Instant, cx: &mut Context<'_>) -> Poll<()> {
    if sleep.deadline() != at {
        sleep.as_mut().reset(at);
    }
    sleep.as_mut().poll(cx)
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
                // A client that keeps sending (pings, window updates of nothing) while it
                // leaves its answers unread is closed all the same.
                match this.answer_overdue() {
                    Some(e) => Poll::Ready(Err(e)),
                    None => Poll::Ready(Ok(())),
                }
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_read_deadline(cx),
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

/// A connection's service: counts its requests in flight for [`WatchedIo`], charges their
/// header bytes and their answers' bytes to the budgets (503 past one), and hands answers out
/// as [`AnswerBody`].
#[derive(Clone)]
pub struct CountingService<S> {
    inner: S,
    conn: Arc<ConnState>,
}

/// Holds one request in the count until dropped (answered, or abandoned with its connection).
struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request's header bytes, held in the process-wide budget until it is answered.
struct HeaderCharge {
    shared: Arc<Shared>,
    bytes: usize,
}

impl Drop for HeaderCharge {
    fn drop(&mut self) {
        self.shared
            .header_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// What a request's head costs, counted as HTTP/2 counts a header list (each field's name and
/// value plus 32 bytes), its target included.
fn header_bytes<B>(request: &Request<B>) -> usize {
    let fields: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 32)
        .sum();
    let uri = request.uri();
    let target = uri.path_and_query().map_or(0, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len());
    fields + target
}

/// `GET /healthz` or `GET /readyz`.
fn is_probe<B>(request: &Request<B>) -> bool {
    request.method() == Method::GET && matches!(request.uri().path(), "/healthz" | "/readyz")
}

/// A 503 answer naming the budget that refused the request: charged to no budget (it is a few
/// dozen bytes, and HTTP/2 streams bound how many a connection holds), but pending like any
/// answer, so a client that leaves refusals unread is closed all the same.
fn refused<B>(text: String, conn: &Arc<ConnState>) -> Response<AnswerBody<B>> {
    let mut response = Response::new(AnswerBody {
        inner: None,
        rest: Bytes::from(text),
        lease: ChunkLease::Own(Lease::uncharged(conn)),
    });
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

impl<S, RB, B> tower::Service<Request<RB>> for CountingService<S>
where
    S: tower::Service<Request<RB>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
{
    type Response = Response<AnswerBody<B>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<RB>) -> Self::Future {
        let shared = &self.conn.shared;
        // The kubelet's probes are never refused for a budget others spent (a refused liveness
        // probe would let an attacker restart ivory); their heads and answers are tiny, and
        // HTTP/2 streams bound how many a connection holds.
        let probe = is_probe(&request);
        let bytes = if probe { 0 } else { header_bytes(&request) };
        if !charge(&shared.header_bytes, bytes, shared.header_budget) {
            shared.metrics.request_refused("header_budget_exhausted");
            let text = format!(
                "ivory: request headers being judged exceed the server's budget of {} bytes; try again",
                shared.header_budget
            );
            return Box::pin(std::future::ready(Ok(refused(text, &self.conn))));
        }
        let headers = HeaderCharge {
            shared: shared.clone(),
            bytes,
        };
        self.conn.in_flight.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(self.conn.clone());
        let answer = self.inner.call(request);
        let conn = self.conn.clone();
        Box::pin(async move {
            let _guard = guard;
            let response = answer.await;
            drop(headers);
            Ok(AnswerBody::charged(response?, &conn, probe))
        })
    }
}

/// An answer's bytes, held in its connection's and the process-wide answer budgets until the
/// answer's last piece has been handed to the socket.
struct Lease {
    conn: Arc<ConnState>,
    bytes: usize,
}

impl Lease {
    /// `bytes` more for `conn`, or `None` when its budget or the process-wide one cannot cover
    /// them.
    fn take(conn: &Arc<ConnState>, bytes: usize) -> Option<Self> {
        let shared = &conn.shared;
        if !charge(
            &conn.answer_bytes,
            bytes,
            shared.answer_budget_per_connection,
        ) {
            return None;
        }
        if !charge(&shared.answer_bytes, bytes, shared.answer_budget) {
            conn.answer_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return None;
        }
        conn.touch();
        conn.answers.fetch_add(1, Ordering::AcqRel);
        Some(Self {
            conn: conn.clone(),
            bytes,
        })
    }
}

impl Lease {
    /// A pending answer that takes nothing from the budgets.
    fn uncharged(conn: &Arc<ConnState>) -> Self {
        conn.touch();
        conn.answers.fetch_add(1, Ordering::AcqRel);
        Self {
            conn: conn.clone(),
            bytes: 0,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let conn = &self.conn;
        conn.answer_bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        conn.shared
            .answer_bytes
            .fetch_sub(self.bytes, Ordering::AcqRel);
        // The answers still pending count their silence from here.
        conn.touch();
        conn.answers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Who keeps an answer's [`Lease`]: the body alone, one piece (a single-piece answer, no
/// allocation), or the body and every piece handed out (released with the last of them).
enum ChunkLease {
    None,
    Own(Lease),
    Shared(Arc<Lease>),
}

impl ChunkLease {
    fn touch(&self) {
        match self {
            Self::None => {}
            Self::Own(lease) => lease.conn.touch(),
            Self::Shared(lease) => lease.conn.touch(),
        }
    }
}

/// An answer body whose bytes stay charged to the answer budgets until its last piece has
/// been handed to the socket; handed to hyper `ANSWER_CHUNK` bytes at a time.
pub struct AnswerBody<B> {
    /// `None` for a refusal written by [`CountingService`] itself.
    inner: Option<B>,
    /// What is left of the frame being handed out.
    rest: Bytes,
    lease: ChunkLease,
}

impl<B: Body> AnswerBody<B> {
    /// `response` with its body charged to `conn`'s budgets, or a 503 if they cannot cover it;
    /// a probe's answer is pending but never charged or refused.
    fn charged(response: Response<B>, conn: &Arc<ConnState>, probe: bool) -> Response<Self> {
        let hint = response.body().size_hint();
        let declared = hint.exact().unwrap_or(hint.lower());
        let bytes = usize::try_from(declared).unwrap_or(usize::MAX);
        let lease = if probe {
            Some(Lease::uncharged(conn))
        } else {
            Lease::take(conn, bytes)
        };
        let Some(lease) = lease else {
            let shared = &conn.shared;
            shared.metrics.request_refused("answer_budget_exhausted");
            return refused(
                format!(
                    "ivory: answers not yet read exceed the server's budget ({} bytes per connection, {} in all); try again",
                    shared.answer_budget_per_connection, shared.answer_budget
                ),
                conn,
            );
        };
        response.map(|inner| Self {
            inner: Some(inner),
            rest: Bytes::new(),
            lease: ChunkLease::Own(lease),
        })
    }

    fn inner_done(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    /// The lease the next piece keeps: the whole lease for the last piece of an answer never
    /// split, a share of it otherwise.
    fn lease_for_piece(&mut self, last: bool) -> ChunkLease {
        match std::mem::replace(&mut self.lease, ChunkLease::None) {
            ChunkLease::None => ChunkLease::None,
            ChunkLease::Own(lease) if last => ChunkLease::Own(lease),
            ChunkLease::Own(lease) => {
                let shared = Arc::new(lease);
                self.lease = ChunkLease::Shared(shared.clone());
                ChunkLease::Shared(shared)
            }
            ChunkLease::Shared(shared) => {
                if !last {
                    self.lease = ChunkLease::Shared(shared.clone());
                }
                ChunkLease::Shared(shared)
            }
        }
    }
}

impl<B> Body for AnswerBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = AnswerChunk;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(Pin::new(inner).poll_frame(cx)) {
                None => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(frame) => {
                        return Poll::Ready(
                            frame.into_trailers().ok().map(|t| Ok(Frame::trailers(t))),
                        );
                    }
                },
            }
        }
        let bytes = if this.rest.len() > ANSWER_CHUNK {
            this.rest.split_to(ANSWER_CHUNK)
        } else {
            std::mem::take(&mut this.rest)
        };
        let last = this.rest.is_empty() && this.inner_done();
        let lease = this.lease_for_piece(last);
        lease.touch();
        Poll::Ready(Some(Ok(Frame::data(AnswerChunk {
            bytes,
            _lease: lease,
        }))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner_done()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.len() as u64;
        let inner = self
            .inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint());
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint.set_lower(inner.lower().saturating_add(rest));
        hint
    }
}

/// A piece of an answer; the answer's bytes stay charged until the last piece is dropped
/// (written to the socket, or dropped with its connection).
pub struct AnswerChunk {
    bytes: Bytes,
    _lease: ChunkLease,
}

impl Buf for AnswerChunk {
    fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn chunk(&self) -> &[u8] {
        &self.bytes
    }

    fn advance(&mut self, cnt: usize) {
        self.bytes.advance(cnt);
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        self.bytes.copy_to_bytes(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn limits(idle: Duration) -> HttpLimits {
        HttpLimits {
            idle_timeout: idle,
            answer_timeout: idle,
            max_connections: 1,
            ..HttpLimits::default()
        }
    }

    fn watched(
        idle: Duration,
    ) -> (
        WatchedIo<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
        Arc<ConnState>,
    ) {
        let (ours, theirs) = tokio::io::duplex(64);
        let acceptor = GuardedAcceptor::new(&limits(idle), Arc::new(Metrics::new()));
        let slot = acceptor.slots.clone().try_acquire_owned().unwrap();
        let conn = Arc::new(ConnState::new(acceptor.shared.clone()));
        (WatchedIo::new(ours, conn.clone(), slot), theirs, conn)
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
        let (mut io, _client, conn) = watched(Duration::from_secs(5));
        conn.in_flight.store(1, Ordering::Release);
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(60), io.read(&mut buf)).await;
        assert!(read.is_err(), "the read still waits after 60 s: {read:?}");
        conn.in_flight.store(0, Ordering::Release);
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
        let (mut io, _client, conn) = watched(Duration::from_secs(5));
        // Even with a request in flight: the answer is what cannot be delivered.
        conn.in_flight.store(1, Ordering::Release);
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

    #[tokio::test]
    async fn answers_hold_their_bytes_until_their_last_piece_is_dropped() {
        let (_io, _client, conn) = watched(Duration::from_secs(5));
        let shared = conn.shared.clone();
        let big = 3 * ANSWER_CHUNK + 10;
        let answer = Response::new(axum::body::Body::from(vec![7u8; big]));
        let mut body = AnswerBody::charged(answer, &conn, false).into_body();
        assert_eq!(conn.answer_bytes.load(Ordering::Acquire), big);
        assert_eq!(shared.answer_bytes.load(Ordering::Acquire), big);
        let mut pieces = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let piece = frame.unwrap().into_data().ok().unwrap();
            assert!(piece.remaining() <= ANSWER_CHUNK);
            pieces.push(piece);
        }
        assert_eq!(pieces.iter().map(Buf::remaining).sum::<usize>(), big);
        drop(body);
        // hyper still holds pieces it has not written: they stay charged.
        assert_eq!(shared.answer_bytes.load(Ordering::Acquire), big);
        assert_eq!(conn.answers.load(Ordering::Acquire), 1);
        pieces.truncate(1);
        assert_eq!(shared.answer_bytes.load(Ordering::Acquire), big);
        drop(pieces);
        assert_eq!(shared.answer_bytes.load(Ordering::Acquire), 0);
        assert_eq!(conn.answer_bytes.load(Ordering::Acquire), 0);
        assert_eq!(conn.answers.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn answers_past_the_budgets_are_refused() {
        let limits = HttpLimits {
            answer_budget: 100,
            answer_budget_per_connection: 60,
            ..HttpLimits::default()
        };
        let acceptor = GuardedAcceptor::new(&limits, Arc::new(Metrics::new()));
        let a = Arc::new(ConnState::new(acceptor.shared.clone()));
        let b = Arc::new(ConnState::new(acceptor.shared.clone()));
        let answer = |n: usize| Response::new(axum::body::Body::from(vec![1u8; n]));
        let first = AnswerBody::charged(answer(50), &a, false);
        assert_eq!(first.status(), StatusCode::OK);
        // Past the connection's budget, though the process-wide one has room.
        let over = AnswerBody::charged(answer(20), &a, false);
        assert_eq!(over.status(), StatusCode::SERVICE_UNAVAILABLE);
        let second = AnswerBody::charged(answer(50), &b, false);
        assert_eq!(second.status(), StatusCode::OK);
        // Past the process-wide budget, though this connection's has room.
        let third = AnswerBody::charged(answer(5), &b, false);
        assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
        // A refusal is pending like any answer (the answer timeout applies to it)...
        assert_eq!(b.answers.load(Ordering::Acquire), 2);
        drop(third);
        // ...and a probe is answered whatever the budgets hold.
        let probe = AnswerBody::charged(answer(5), &b, true);
        assert_eq!(probe.status(), StatusCode::OK);
        drop(probe);
        drop(first);
        assert_eq!(
            AnswerBody::charged(answer(5), &b, false).status(),
            StatusCode::OK,
            "a dropped answer returns its bytes"
        );
        drop(second);
        assert_eq!(acceptor.shared.answer_bytes.load(Ordering::Acquire), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_answer_closes_a_chatty_connection_after_the_answer_timeout() {
        let (mut io, mut client, conn) = watched(Duration::from_secs(5));
        let answer = Response::new(axum::body::Body::from(vec![1u8; 10]));
        let held = AnswerBody::charged(answer, &conn, false);
        let started = ivory_clock::now();
        let mut buf = [0u8; 8];
        // The client keeps the connection busy (HTTP/2 pings) without taking the answer.
        let err = loop {
            client.write_all(b"p").await.unwrap();
            match io.read(&mut buf).await {
                Ok(_) => tokio::time::advance(Duration::from_millis(500)).await,
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("answer_unread"), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        drop(held);
    }

    #[test]
    fn connections_past_the_cap_are_refused() {
        let metrics = Arc::new(Metrics::new());
        let acceptor = GuardedAcceptor::new(&limits(Duration::from_secs(1)), metrics.clone());
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
