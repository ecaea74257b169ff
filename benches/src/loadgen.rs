//! The load generator: HTTPS/1.1 keep-alive over loopback, closed loop at a fixed concurrency
//! (throughput) and open loop at a fixed rate (latency measured from the scheduled send time,
//! so a stalled server cannot hide its queueing).

use std::time::Duration;

use anyhow::{Context as _, Result};
use axum::body::Bytes;
use serde_json::{Value, json};
use tokio::task::JoinSet;

/// Per-request ceiling: anything slower is an error, not a data point.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Keep-alive connections of the open loop, each with its own send schedule.
const OPEN_LOOP_CONNECTIONS: usize = 16;

/// HTTPS client trusting the bench CA.
pub(crate) fn client(ca_pem: &str, max_idle: usize) -> Result<reqwest::Client> {
    let cert = reqwest::Certificate::from_pem(ca_pem.as_bytes()).context("bench CA")?;
    reqwest::Client::builder()
        .tls_certs_merge([cert])
        .http1_only()
        .pool_max_idle_per_host(max_idle)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("building the load client")
}

/// One answer.
pub(crate) struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    pub(crate) fn allowed(&self) -> bool {
        self.status == 200 && self.body["response"]["allowed"] == json!(true)
    }
    pub(crate) fn patch(&self) -> Option<&str> {
        self.body["response"]["patch"].as_str()
    }
}

/// Sends one AdmissionReview and parses the answer.
pub(crate) async fn post(client: &reqwest::Client, url: &str, body: Bytes) -> Result<Answer> {
    let res = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = res.status().as_u16();
    let bytes = res
        .bytes()
        .await
        .with_context(|| format!("reading {url}"))?;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Answer { status, body })
}

/// What one load step measured.
#[derive(Clone, Debug, Default)]
pub(crate) struct Stats {
    pub ok: u64,
    pub errors: u64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Stats {
    fn from(mut micros: Vec<u64>, errors: u64, elapsed: Duration) -> Self {
        micros.sort_unstable();
        let ok = micros.len() as u64;
        Self {
            ok,
            errors,
            rps: ok as f64 / elapsed.as_secs_f64().max(1e-9),
            p50_ms: percentile(&micros, 0.50),
            p99_ms: percentile(&micros, 0.99),
            max_ms: micros.last().map_or(0.0, |m| *m as f64 / 1000.0),
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "ok": self.ok, "errors": self.errors, "rps": round(self.rps, 1),
            "p50_ms": round(self.p50_ms, 3), "p99_ms": round(self.p99_ms, 3),
            "max_ms": round(self.max_ms, 3),
        })
    }
}

/// Nearest-rank percentile of sorted microseconds, in milliseconds.
fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

pub(crate) fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

/// A request repeated under load; only 200 with `"allowed":true` counts as success.
#[derive(Clone)]
pub(crate) struct Target {
    pub client: reqwest::Client,
    pub url: String,
    pub body: Bytes,
}

impl Target {
    async fn once(&self) -> bool {
        let res = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(self.body.clone())
            .send()
            .await;
        match res {
            Ok(r) if r.status().as_u16() == 200 => r
                .bytes()
                .await
                .is_ok_and(|b| memchr(b"\"allowed\":true", &b)),
            _ => false,
        }
    }
}

fn memchr(needle: &[u8], hay: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `concurrency` workers send back-to-back for `duration`.
pub(crate) async fn closed_loop(target: &Target, concurrency: usize, duration: Duration) -> Stats {
    let run = Run::closed_loop(target, concurrency, duration).await;
    Stats::from(run.micros, run.errors, run.elapsed)
}

/// Closed loops at `concurrency` against each of `targets` in turn, `slice` at a time, until
/// each has had `duration`. On a machine whose speed drifts over seconds (a shared VM's does,
/// BENCHMARKS.md), two steps run one after the other measure the drift as much as the
/// servers; slices taken in turn fall on both sides alike, so the ratio of their rates holds.
pub(crate) async fn closed_loops_in_turn<const N: usize>(
    targets: [&Target; N],
    concurrency: usize,
    duration: Duration,
    slice: Duration,
) -> [Stats; N] {
    let slices = (duration.as_secs_f64() / slice.as_secs_f64())
        .ceil()
        .max(1.0) as usize;
    let mut runs: [Run; N] = std::array::from_fn(|_| Run::default());
    for _ in 0..slices {
        for (target, run) in targets.iter().zip(runs.iter_mut()) {
            run.add(Run::closed_loop(target, concurrency, slice).await);
        }
    }
    runs.map(|run| Stats::from(run.micros, run.errors, run.elapsed))
}

/// What closed-loop sending measured before it is summed up: latencies in microseconds,
/// failures and the time taken.
#[derive(Default)]
struct Run {
    micros: Vec<u64>,
    errors: u64,
    elapsed: Duration,
}

impl Run {
    async fn closed_loop(target: &Target, concurrency: usize, duration: Duration) -> Self {
        let start = ivory_clock::now();
        let until = start + duration;
        let mut set = JoinSet::new();
        for _ in 0..concurrency.max(1) {
            let t = target.clone();
            set.spawn(async move {
                let (mut lat, mut errors) = (Vec::new(), 0u64);
                while ivory_clock::now() < until {
                    let s = ivory_clock::now();
                    if t.once().await {
                        lat.push(s.elapsed().as_micros() as u64);
                    } else {
                        errors += 1;
                    }
                }
                (lat, errors)
            });
        }
        let mut run = Run::default();
        while let Some(r) = set.join_next().await {
            if let Ok((lat, e)) = r {
                run.micros.extend(lat);
                run.errors += e;
            } else {
                run.errors += 1;
            }
        }
        run.elapsed = start.elapsed();
        run
    }

    fn add(&mut self, other: Run) {
        self.micros.extend(other.micros);
        self.errors += other.errors;
        self.elapsed += other.elapsed;
    }
}

/// Sends at `rate` per second for `duration` over [`OPEN_LOOP_CONNECTIONS`] keep-alive
/// connections, each on its own fixed schedule (wrk2's method): a request is due every
/// `OPEN_LOOP_CONNECTIONS / rate` seconds per connection, whether or not the previous one
/// has answered.
///
/// Latency counts from the scheduled send time when the connection was still busy (the
/// server's queueing shows), and from the actual send time when it was idle and only the
/// timer woke it late (tokio timers have millisecond granularity; that slop is the
/// generator's, not the server's).
pub(crate) async fn open_loop(target: &Target, rate: f64, duration: Duration) -> Stats {
    let connections = OPEN_LOOP_CONNECTIONS;
    let period = Duration::from_secs_f64(connections as f64 / rate.max(1.0));
    let start = ivory_clock::now();
    let until = start + duration;
    let mut set = JoinSet::new();
    for worker in 0..connections {
        let t = target.clone();
        // Spread the connections' schedules evenly over one period.
        let offset = period.mul_f64(worker as f64 / connections as f64);
        set.spawn(async move {
            let (mut lat, mut errors) = (Vec::new(), 0u64);
            let mut due = start + offset;
            while due < until {
                let free = ivory_clock::now();
                let sent = if free < due {
                    tokio::time::sleep_until(due).await;
                    ivory_clock::now()
                } else {
                    due
                };
                if t.once().await {
                    lat.push(sent.elapsed().as_micros() as u64);
                } else {
                    errors += 1;
                }
                due += period;
            }
            (lat, errors)
        });
    }
    let (mut all, mut errors) = (Vec::new(), 0u64);
    while let Some(r) = set.join_next().await {
        match r {
            Ok((lat, e)) => {
                all.extend(lat);
                errors += e;
            }
            Err(_) => errors += 1,
        }
    }
    // Throughput over the sending window: the tail of in-flight requests is not idle time.
    Stats::from(all, errors, duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let us: Vec<u64> = (1..=100).map(|v| v * 1000).collect();
        assert_eq!(percentile(&us, 0.50), 50.0);
        assert_eq!(percentile(&us, 0.99), 99.0);
        assert_eq!(percentile(&us[..1], 0.99), 1.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn slices_taken_in_turn_add_up_to_one_rate_over_their_whole_time() {
        let slice = |micros: Vec<u64>, millis| Run {
            micros,
            errors: 1,
            elapsed: Duration::from_millis(millis),
        };
        let mut run = slice(vec![1000; 3], 500);
        run.add(slice(vec![2000; 1], 1500));
        let s = Stats::from(run.micros, run.errors, run.elapsed);
        // Four answers in two seconds, not the mean of the slices' rates (6 and 2/3 per second).
        assert_eq!((s.ok, s.errors, s.rps), (4, 2, 2.0));
        assert_eq!(s.max_ms, 2.0);
    }

    #[test]
    fn stats_count_successes_only() {
        let s = Stats::from(vec![3000, 1000, 2000], 2, Duration::from_secs(1));
        assert_eq!((s.ok, s.errors), (3, 2));
        assert_eq!((s.rps, s.p50_ms, s.max_ms), (3.0, 2.0, 3.0));
    }

    #[test]
    fn allowed_needs_status_200_and_allowed_true() {
        let body = json!({"response": {"allowed": true, "patch": "W10="}});
        let a = Answer { status: 200, body };
        assert!(a.allowed());
        assert_eq!(a.patch(), Some("W10="));
        let denied = Answer {
            status: 200,
            body: json!({"response": {"allowed": false}}),
        };
        assert!(!denied.allowed());
        let error = Answer {
            status: 500,
            body: json!({"response": {"allowed": true}}),
        };
        assert!(!error.allowed());
        assert!(memchr(
            b"\"allowed\":true",
            br#"{"response":{"allowed":true}}"#
        ));
        assert!(!memchr(
            b"\"allowed\":true",
            br#"{"response":{"allowed":false}}"#
        ));
    }
}
