//! What one client may cost the server before ivory has judged anything: request bodies are
//! read against a per-request cap, a process-wide budget of body bytes in flight and a
//! deadline; connections against a cap, idle, header, answer and handshake timeouts, and
//! process-wide budgets of header bytes and of answer bytes not yet sent
//! ([`crate::connection`]). Anyone who can open a connection to the webhook port can reach
//! this code, so nothing here waits without a deadline or buffers without a bound.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default request body limit: an UPDATE review carries `object` and `oldObject`, and etcd
/// caps one object at 1.5 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 3 * 1024 * 1024;

/// Bounds on clients of the webhook port: bytes, connections and time.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// Largest accepted request body in bytes (413 past it).
    pub body_limit: usize,
    /// Request-body bytes all requests together may hold at once (503 past it): the sum that
    /// the per-request cap alone leaves unbounded.
    pub body_budget: usize,
    /// A request's whole body must arrive within this (408 past it).
    pub body_timeout: Duration,
    /// An HTTP/1.1 request's headers must arrive within this. hyper starts the same clock while
    /// a keep-alive connection waits for its next request, so it also closes idle HTTP/1.1
    /// connections.
    pub header_timeout: Duration,
    /// A connection with no request in flight that moves no byte for this long is closed
    /// (HTTP/2 included; the API server's own idle timeout is 90 s, so ivory's is longer).
    pub idle_timeout: Duration,
    /// The TLS handshake must finish within this.
    pub handshake_timeout: Duration,
    /// Open connections at once; a connection past it is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Header bytes (counted as HTTP/2 counts a header list) all requests being judged may
    /// hold at once (503 past it): the sum that per-connection stream and header-list bounds
    /// times the connection cap leave far too large.
    pub header_budget: usize,
    /// Answer bytes not yet handed to the socket that all connections together may hold (503
    /// past it).
    pub answer_budget: usize,
    /// Answer bytes not yet handed to the socket that one connection may hold (503 past it).
    pub answer_budget_per_connection: usize,
    /// A connection whose pending answers move no byte for this long, or whose writes wait
    /// this long for a peer that reads nothing, is closed: an answer nobody reads cannot hold
    /// memory or a slot for long.
    pub answer_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            body_limit: DEFAULT_BODY_LIMIT,
            body_budget: 64 * 1024 * 1024,
            body_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            handshake_timeout: Duration::from_secs(10),
            max_connections: 1024,
            header_budget: 8 * 1024 * 1024,
            answer_budget: 64 * 1024 * 1024,
            answer_budget_per_connection: 16 * 1024 * 1024,
            answer_timeout: Duration::from_secs(10),
        }
    }
}

/// The process-wide budget of request-body bytes in flight; cheap to clone.
#[derive(Clone, Debug)]
pub struct BodyBudget {
    permits: Arc<Semaphore>,
    total: usize,
}

impl BodyBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> Self {
        let total = total.min(Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    /// Bytes not held by any request now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    /// Takes `bytes` more for `held`, without waiting: a request that would have to wait for
    /// another's bytes is refused instead, so partial bodies can never wait on each other.
    fn take(&self, held: &mut Option<OwnedSemaphorePermit>, bytes: usize) -> Result<(), BodyError> {
        let exhausted = || BodyError::BudgetExhausted { budget: self.total };
        let n = u32::try_from(bytes).map_err(|_| exhausted())?;
        let permit = self
            .permits
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| exhausted())?;
        match held {
            Some(p) => p.merge(permit),
            None => *held = Some(permit),
        }
        Ok(())
    }
}

/// A request body read whole, with its share of the [`BodyBudget`]; the share returns to the
/// budget when this is dropped (after the request has been answered).
#[derive(Debug)]
pub struct ReadBody {
    /// The body.
    pub bytes: Bytes,
    _held: Option<OwnedSemaphorePermit>,
}

/// Why a request body was not read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Past the per-request cap (413).
    #[error("ivory: the request body is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The cap.
        limit: usize,
    },
    /// The budget of body bytes in flight is spent (503: the API server applies the webhook's
    /// failurePolicy).
    #[error(
        "ivory: request bodies in flight exceed the server's budget of {budget} bytes; try again"
    )]
    BudgetExhausted {
        /// The budget.
        budget: usize,
    },
    /// The body did not arrive in time (408).
    #[error("ivory: the request body did not arrive within {0:?}")]
    TimedOut(Duration),
    /// The connection failed while the body was read (400).
    #[error("ivory: the request body could not be read")]
    Unreadable,
}

impl BodyError {
    /// The metrics label of this refusal.
    pub fn label(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "body_too_large",
            Self::BudgetExhausted { .. } => "body_budget_exhausted",
            Self::TimedOut(_) => "body_timeout",
            Self::Unreadable => "body_unreadable",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BudgetExhausted { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Unreadable => StatusCode::BAD_REQUEST,
        }
    }
}

impl IntoResponse for BodyError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), self.to_string()).into_response();
        // The connection may still carry the unread rest of the body: never reuse it.
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        response
    }
}

/// Reads `body` whole: at most `limits.body_limit` bytes, each taken from `budget` before it
/// is kept, all within `limits.body_timeout`. A declared `Content-Length` is checked and taken
/// up front, so an oversized or unaffordable body is refused before a byte of it is read.
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limits: &HttpLimits,
    budget: &BodyBudget,
) -> Result<ReadBody, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut held = None;
    let mut prepaid = 0;
    if let Some(len) = declared {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > limits.body_limit {
            return Err(BodyError::TooLarge {
                limit: limits.body_limit,
            });
        }
        budget.take(&mut held, len)?;
        prepaid = len;
    }
    let reading = collect(body, prepaid, limits.body_limit, budget, &mut held);
    let bytes = tokio::time::timeout(limits.body_timeout, reading)
        .await
        .map_err(|_| BodyError::TimedOut(limits.body_timeout))??;
    Ok(ReadBody { bytes, _held: held })
}

/// The frames of `body` into one buffer of `prepaid` bytes (a declared length, already taken
/// from `budget`), taking from `budget` whatever the buffer must grow by beyond it.
async fn collect(
    body: Body,
    prepaid: usize,
    limit: usize,
    budget: &BodyBudget,
    held: &mut Option<OwnedSemaphorePermit>,
) -> Result<Bytes, BodyError> {
    let mut stream = body.into_data_stream();
    let mut out: Vec<u8> = Vec::with_capacity(prepaid);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| BodyError::Unreadable)?;
        let needed = out.len().saturating_add(chunk.len());
        if needed > limit {
            return Err(BodyError::TooLarge { limit });
        }
        if needed > out.capacity() {
            // The budget pays for what is allocated, growth included, not only what arrived.
            let capacity = needed.max(out.capacity().saturating_mul(2)).min(limit);
            budget.take(held, capacity - out.capacity())?;
            out.reserve_exact(capacity - out.len());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn limits(body_limit: usize) -> HttpLimits {
        HttpLimits {
            body_limit,
            body_timeout: Duration::from_millis(200),
            ..HttpLimits::default()
        }
    }

    fn with_length(len: usize) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        h
    }

    /// Reads `len` bytes sent whole with a declared length, under a body limit of 80.
    async fn declared(len: usize, budget: &BodyBudget) -> Result<ReadBody, BodyError> {
        read_body(
            &with_length(len),
            Body::from(vec![1u8; len]),
            &limits(80),
            budget,
        )
        .await
    }

    /// Reads `frames` frames of 10 bytes without a declared length, under a body limit of 80.
    async fn streamed(frames: usize, budget: &BodyBudget) -> Result<ReadBody, BodyError> {
        let chunks =
            futures::stream::iter((0..frames).map(|_| Ok::<_, std::io::Error>(vec![0u8; 10])));
        read_body(
            &HeaderMap::new(),
            Body::from_stream(chunks),
            &limits(80),
            budget,
        )
        .await
    }

    #[tokio::test]
    async fn bodies_hold_their_bytes_of_the_budget_until_dropped() {
        let budget = BodyBudget::new(100);
        let first = declared(60, &budget).await.unwrap();
        assert_eq!(first.bytes.len(), 60);
        assert_eq!(budget.available(), 40);
        // A declared length the budget cannot cover is refused before anything is read.
        let refused = declared(50, &budget).await.unwrap_err();
        assert!(matches!(
            refused,
            BodyError::BudgetExhausted { budget: 100 }
        ));
        // Without a declared length the budget is taken frame by frame.
        let refused = streamed(5, &budget).await.unwrap_err();
        assert!(matches!(refused, BodyError::BudgetExhausted { .. }));
        assert_eq!(
            budget.available(),
            40,
            "a refused body returns what it took"
        );
        drop(first);
        assert_eq!(budget.available(), 100);
    }

    #[tokio::test]
    async fn oversized_and_slow_bodies_are_refused() {
        let budget = BodyBudget::new(1000);
        let big = declared(81, &budget).await.unwrap_err();
        assert!(matches!(big, BodyError::TooLarge { limit: 80 }));
        let undeclared = streamed(9, &budget).await.unwrap_err();
        assert!(matches!(undeclared, BodyError::TooLarge { .. }));
        let stalled = futures::stream::pending::<Result<Vec<u8>, std::io::Error>>();
        let slow = read_body(
            &HeaderMap::new(),
            Body::from_stream(stalled),
            &limits(80),
            &budget,
        )
        .await
        .unwrap_err();
        assert!(matches!(slow, BodyError::TimedOut(_)));
        assert_eq!(budget.available(), 1000);
    }
}
