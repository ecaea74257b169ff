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
//!
//! [`parse_go_duration`] reads the `?timeout=` and every duration flag of the binary. It is
//! hand-written (the rule in docs/ARCHITECTURE.md) instead of a port of Go's
//! `time.ParseDuration` (go-parse-duration 0.1, go-duration 0.2: small one-author crates, not
//! in the tree): ports keep Go's rules, under which a negative duration parses and one past
//! Go's range is an error, where a budget refuses negatives and saturates (a huge `?timeout=`
//! is capped at 30 s anyway); a wrapper would keep both rules here. Oracle:
//! `tests::agrees_with_gos_time_parse_duration`, against Go's own answers on a committed table
//! (`fixtures/go-duration/table.json`, from `scripts/go-duration-oracle/main.go`).

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
pub const MAX_GO_DURATION: Duration = Duration::from_nanos(MAX_GO_DURATION_NANOS);

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

/// Parses a Go `time.Duration` string (`10s`, `1m30s`, `1.5s`, `500ms`) as Go's
/// `time.ParseDuration` does, to the nanosecond (a fraction's digits past what Go keeps are
/// dropped, as Go drops them). Returns `None` for anything else, including negative values.
/// Values past Go's range saturate at [`MAX_GO_DURATION`] instead of being refused.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    /// Go's bound on the unsigned sum before the sign is applied.
    const LIMIT: u64 = 1 << 63;
    let mut rest = text.trim();
    if rest.starts_with('-') {
        return None;
    }
    rest = rest.strip_prefix('+').unwrap_or(rest);
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut past_range = false;
    while !rest.is_empty() {
        let (whole, after) = leading_digits(rest);
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after_dot) => leading_digits(after_dot),
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let unit: u64 = match &after[..unit_len] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        rest = &after[unit_len..];
        let value = whole_number(whole)
            .filter(|v| *v <= LIMIT / unit)
            .map(|v| v * unit + go_fraction(fraction, unit))
            .filter(|v| *v <= LIMIT);
        match value.and_then(|v| total.checked_add(v)) {
            Some(sum) => total = sum,
            None => past_range = true,
        }
    }
    if past_range || total > MAX_GO_DURATION_NANOS {
        return Some(MAX_GO_DURATION);
    }
    Some(Duration::from_nanos(total))
}

/// `i64::MAX`, Go's largest duration in nanoseconds.
const MAX_GO_DURATION_NANOS: u64 = i64::MAX as u64;

/// The leading ASCII digits of `text`, and what follows them.
fn leading_digits(text: &str) -> (&str, &str) {
    text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    )
}

/// A run of digits as Go's `leadingInt` reads it; `None` past `1 << 63` (an empty run is 0).
fn whole_number(digits: &str) -> Option<u64> {
    digits.bytes().try_fold(0u64, |n, d| {
        n.checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(d - b'0')))
            .filter(|n| *n <= 1 << 63)
    })
}

/// The nanoseconds of a fraction's digits in `unit`, as Go computes them: the digits read
/// until the next would overflow (the rest dropped), then `float64(f) * (float64(unit) /
/// scale)` truncated.
fn go_fraction(digits: &str, unit: u64) -> u64 {
    let mut value: u64 = 0;
    let mut scale = 1f64;
    for d in digits.bytes() {
        let next = (value <= MAX_GO_DURATION_NANOS / 10)
            .then(|| value * 10 + u64::from(d - b'0'))
            .filter(|n| *n <= 1 << 63);
        let Some(next) = next else { break };
        value = next;
        scale *= 10.0;
    }
    if value == 0 {
        return 0;
    }
    // Go's own float arithmetic, so results agree to the nanosecond.
    (value as f64 * (unit as f64 / scale)) as u64
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

    /// The oracle: Go's own `time.ParseDuration` on every input of
    /// `fixtures/go-duration/table.json` (written by `scripts/go-duration-oracle/main.go`).
    /// ivory agrees wherever Go parses a non-negative duration in range and wherever Go refuses,
    /// with three departures on purpose: a negative duration is refused (a budget cannot be
    /// negative), one past Go's range saturates at [`MAX_GO_DURATION`] (the timeout is capped
    /// anyway), and blanks around the text are trimmed.
    #[test]
    fn agrees_with_gos_time_parse_duration() {
        let table: serde_json::Value =
            serde_json::from_str(include_str!("../../../fixtures/go-duration/table.json")).unwrap();
        let rows = table["rows"].as_array().unwrap();
        assert!(rows.len() > 40);
        for row in rows {
            let input = row["input"].as_str().unwrap();
            let go = row["nanos"].as_i64();
            let ours = parse_go_duration(input);
            let trimmed = input.trim();
            let expected = match go {
                _ if trimmed.starts_with('-') => None,
                Some(nanos) => Some(Duration::from_nanos(u64::try_from(nanos).unwrap())),
                None if trimmed != input => {
                    let again = rows.iter().find(|r| r["input"] == trimmed);
                    let go = again.expect("the trimmed input is a row").get("nanos");
                    let go = go.and_then(serde_json::Value::as_i64);
                    go.map(|n| Duration::from_nanos(u64::try_from(n).unwrap()))
                }
                None if row["past_range"] == true => Some(MAX_GO_DURATION),
                None => None,
            };
            assert_eq!(ours, expected, "{input:?}: Go said {go:?}");
        }
    }
}
