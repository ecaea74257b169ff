//! Circuit breaker: after a failed or late L2 call, the L2 is skipped for a cool-down, so a
//! down or paused store costs admissions at most one L2 deadline per cool-down instead of one
//! per call. After the cool-down calls go through again; the first failure reopens it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Open/closed state, lock-free (every L2 call reads it).
#[derive(Debug)]
pub(crate) struct Breaker {
    origin: Instant,
    cooldown: Duration,
    /// Milliseconds since `origin` until which calls are skipped; 0 when closed.
    open_until_ms: AtomicU64,
}

impl Breaker {
    /// A closed breaker that stays open `cooldown` after each failure.
    pub(crate) fn new(cooldown: Duration) -> Self {
        Self {
            origin: ivory_clock::now(),
            cooldown,
            open_until_ms: AtomicU64::new(0),
        }
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether a call may go to the store at `now`.
    pub(crate) fn allows(&self, now: Instant) -> bool {
        self.ms(now) >= self.open_until_ms.load(Ordering::Relaxed)
    }

    /// A call that failed or ran past its deadline at `now`.
    pub(crate) fn failed(&self, now: Instant) {
        let until = self.ms(now).saturating_add(
            u64::try_from(self.cooldown.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        self.open_until_ms.fetch_max(until, Ordering::Relaxed);
    }

    /// Whether the breaker is open at `now` (for metrics and logs).
    pub(crate) fn is_open(&self, now: Instant) -> bool {
        !self.allows(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_opens_the_breaker_for_the_cooldown() {
        let b = Breaker::new(Duration::from_secs(1));
        let t0 = b.origin + Duration::from_secs(10);
        assert!(b.allows(t0));
        b.failed(t0);
        assert!(!b.allows(t0 + Duration::from_millis(999)));
        assert!(b.is_open(t0 + Duration::from_millis(500)));
        assert!(b.allows(t0 + Duration::from_secs(1)));
        // A later failure extends, an earlier one never shortens.
        b.failed(t0 + Duration::from_secs(2));
        b.failed(t0);
        assert!(!b.allows(t0 + Duration::from_millis(2_500)));
        assert!(b.allows(t0 + Duration::from_secs(3)));
    }
}
