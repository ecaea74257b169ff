//! Size-limited in-memory sink for streamed blobs.

use std::pin::Pin;
use std::task::{Context, Poll};

/// Collects a blob in memory and fails the stream once it passes the limit.
pub(super) struct LimitedWriter {
    pub(super) buf: Vec<u8>,
    limit: usize,
    pub(super) exceeded: bool,
}

impl LimitedWriter {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            buf: Vec::new(),
            limit,
            exceeded: false,
        }
    }
}

impl tokio::io::AsyncWrite for LimitedWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.buf.len().saturating_add(data.len()) > self.limit {
            self.exceeded = true;
            return Poll::Ready(Err(std::io::Error::other("blob size limit exceeded")));
        }
        self.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
