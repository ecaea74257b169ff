//! The one place ivory reads the clocks (`clippy.toml` refuses `Instant::now` and
//! `SystemTime::now` everywhere else).
//!
//! The monotonic clock is tokio's: under a runtime whose clock is paused
//! (`tokio::time::pause`, `#[tokio::test(start_paused = true)]`) [`now`] is the paused time and
//! moves only with `tokio::time::advance` or auto-advance, so a test of a deadline or a
//! cool-down advances time instead of sleeping. Outside such a runtime it is
//! `std::time::Instant::now`, which is what production code always sees. Request deadlines,
//! the CEL evaluation deadline, the L2 circuit breaker's cool-down and cache ages all follow
//! it; there is no fake clock of ivory's own.
//!
//! The wall clock ([`wall`], [`unix_seconds`]) is the system's and no test controls it: code
//! whose answer depends on the date takes the time as an argument (as
//! `PolicyException` expiry does), so a test passes the time it wants.

// This crate is the clock: the one place the reads `clippy.toml` disallows are allowed.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// The monotonic time now: tokio's clock, paused and advanced by tests that pause it.
pub fn now() -> Instant {
    Instant::now()
}

/// The deadline `after` from [`now`] (saturating far in the future instead of overflowing).
pub fn deadline_in(after: Duration) -> Instant {
    let now = now();
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

/// The wall-clock time now (the system's; not paused by tokio).
pub fn wall() -> SystemTime {
    SystemTime::now()
}

/// Whole seconds since the Unix epoch, by the wall clock (0 if the system clock is set before
/// 1970).
pub fn unix_seconds() -> u64 {
    wall()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_paused_runtime_controls_the_monotonic_clock() {
        let before = now();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(now() - before, Duration::from_secs(3600));
        assert_eq!(
            deadline_in(Duration::from_secs(5)) - now(),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn a_far_deadline_saturates_instead_of_panicking() {
        assert!(deadline_in(Duration::MAX) > now());
    }

    #[test]
    fn the_wall_clock_is_after_2020() {
        assert!(unix_seconds() > 1_577_836_800, "{}", unix_seconds());
    }
}
