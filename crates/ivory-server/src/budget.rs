//! The time budget of one admission request.
//!
//! The API server appends `?timeout=<Go duration>` (e.g. `timeout=10s`) to every webhook call:
//! it is the webhook's `timeoutSeconds`, after which the API server stops waiting and applies
//! the webhook's failurePolicy itself. ivory must answer before that, so its own budget is
//!
//! ```text
//! timeout = min(?timeout (default 10s), tightest webhookConfiguration.timeoutSeconds of the
//!               selected policies, 30s)
//! budget  = timeout - min(1s, timeout / 10)
//! ```
//!
//! The margin covers serialisation, the network hop back and the API server's own clock; 10 %
//! keeps short timeouts (1–3 s) usable, 1 s caps it for long ones.

use std::time::Duration;

use tokio::time::Instant;

/// Used when the request carries no (or an unreadable) `timeout` parameter: the API server's
/// default `timeoutSeconds`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bound of the safety margin.
pub const MAX_MARGIN: Duration = Duration::from_secs(1);
/// The longest timeout the API server can have: `timeoutSeconds` is at most 30. A longer
/// `?timeout=` is not from an API server ivory can serve any better by waiting longer.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30);
/// Go's largest `time.Duration` (`math.MaxInt64` nanoseconds): where parsed durations saturate.
pub const MAX_GO_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// How long ivory may work on one request, and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// What the caller allows (after policy timeouts).
    pub timeout: Duration,
    /// What ivory spends at most: `timeout` minus the margin.
    pub budget: Duration,
    /// `start + budget`: passed to the engine and every registry call.
    pub deadline: Instant,
}

impl Budget {
    /// The budget for a request that arrived at `start` with query `timeout` and selected
    /// policies whose tightest `webhookConfiguration.timeoutSeconds` is `policy_timeout`.
    pub fn new(
        start: Instant,
        timeout: Option<Duration>,
        policy_timeout: Option<Duration>,
    ) -> Self {
        let mut timeout = timeout.unwrap_or(DEFAULT_TIMEOUT).min(MAX_TIMEOUT);
        if let Some(p) = policy_timeout.filter(|p| !p.is_zero()) {
            timeout = timeout.min(p);
        }
        let margin = MAX_MARGIN.min(timeout / 10);
        let budget = timeout.saturating_sub(margin);
        Self {
            timeout,
            budget,
            deadline: start.checked_add(budget).unwrap_or(start),
        }
    }
}

/// Finds `timeout=` in a raw query string and parses it as a Go duration.
pub fn timeout_from_query(query: Option<&str>) -> Option<Duration> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "timeout")
        .and_then(|(_, v)| parse_go_duration(v))
}

/// Parses a Go `time.Duration` string (`10s`, `1m30s`, `1.5s`, `500ms`). Returns `None` for
/// anything else, including negative values. Values past Go's range saturate at
/// [`MAX_GO_DURATION`] instead of overflowing later arithmetic.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() || rest.starts_with('-') {
        return None;
    }
    rest = rest.strip_prefix('+').unwrap_or(rest);
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * seconds_per_unit;
    }
    let parsed = Duration::try_from_secs_f64(total).unwrap_or(MAX_GO_DURATION);
    Some(parsed.min(MAX_GO_DURATION))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        for bad in ["", "10", "-3s", "s", "3x", "1..2s"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn huge_durations_saturate() {
        let digits = "9".repeat(400);
        for huge in [
            "10000000000000000000s".to_owned(),
            "2562048h".to_owned(),
            format!("{digits}h"),
            format!("{digits}ns"),
        ] {
            assert_eq!(parse_go_duration(&huge), Some(MAX_GO_DURATION), "{huge}");
        }
        assert_eq!(
            parse_go_duration("2562047h"),
            Some(Duration::from_secs(2_562_047 * 3600))
        );
    }

    #[test]
    fn huge_timeouts_are_capped_without_overflow() {
        let now = ivory_clock::now();
        let query = Some("timeout=10000000000000000000s");
        let b = Budget::new(now, timeout_from_query(query), None);
        assert_eq!(b.timeout, MAX_TIMEOUT);
        assert_eq!(b.budget, MAX_TIMEOUT - MAX_MARGIN);
        assert_eq!(b.deadline, now + b.budget);
        let b = Budget::new(now, Some(Duration::MAX), Some(Duration::MAX));
        assert_eq!(b.timeout, MAX_TIMEOUT);
    }

    #[test]
    fn query_lookup() {
        assert_eq!(
            timeout_from_query(Some("a=b&timeout=3s")),
            Some(Duration::from_secs(3))
        );
        assert_eq!(timeout_from_query(Some("timeout=soon")), None);
        assert_eq!(timeout_from_query(None), None);
    }

    #[test]
    fn margins() {
        let now = ivory_clock::now();
        let b = Budget::new(now, Some(Duration::from_secs(3)), None);
        assert_eq!(b.budget, Duration::from_millis(2700));
        assert_eq!(b.deadline, now + Duration::from_millis(2700));
        let b = Budget::new(now, None, None);
        assert_eq!(
            (b.timeout, b.budget),
            (DEFAULT_TIMEOUT, Duration::from_secs(9))
        );
        let b = Budget::new(now, Some(Duration::from_secs(30)), None);
        assert_eq!(b.budget, Duration::from_secs(29));
        // The policy's own timeout wins when tighter, never when looser.
        let b = Budget::new(
            now,
            Some(Duration::from_secs(10)),
            Some(Duration::from_secs(5)),
        );
        assert_eq!(b.budget, Duration::from_millis(4500));
        let b = Budget::new(
            now,
            Some(Duration::from_secs(2)),
            Some(Duration::from_secs(5)),
        );
        assert_eq!(b.budget, Duration::from_millis(1800));
    }

    /// fuzz/ go_duration crash-83ba88869203e495492e07f3dbaa56d0f6b913bd: a `?timeout=` that
    /// parses but lies beyond the clock's range panicked when the deadline was computed.
    #[test]
    fn fuzz_crash_83ba8886_timeout_beyond_the_clock_does_not_panic() {
        let now = ivory_clock::now();
        let timeout = timeout_from_query(Some("timeout=14854662320090116365s"));
        assert!(timeout.is_some());
        let b = Budget::new(now, timeout, None);
        assert!(b.deadline >= now);
        let b = Budget::new(now, Some(Duration::MAX), None);
        assert!(b.deadline >= now);
    }
}
