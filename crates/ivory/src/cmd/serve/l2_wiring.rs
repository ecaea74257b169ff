//! `--cache-redis`: the cache shared by the replicas (`ivory-l2`) and its metrics.

use std::time::Duration;

use ivory_l2::RedisL2;
use ivory_server::L2Counts;

/// How long start-up waits for the shared cache to answer before serving without it (it is
/// then connected on first use).
const CONNECT_LIMIT: Duration = Duration::from_secs(2);

/// Connects before serving, so that the first admissions' L2 calls do not include connecting.
pub(super) async fn warm_up(l2: &RedisL2) {
    if l2.connect(CONNECT_LIMIT).await {
        tracing::info!("shared cache connected");
    } else {
        tracing::warn!(
            limit_ms = CONNECT_LIMIT.as_millis() as u64,
            "shared cache did not answer; serving without it until it does"
        );
    }
}

/// The L2's counters for `/metrics`.
pub(super) fn counts(l2: &RedisL2) -> L2Counts {
    let s = l2.stats();
    L2Counts {
        events: vec![
            ("hits", s.hits),
            ("misses", s.misses),
            ("errors", s.errors),
            ("skipped", s.skipped),
            ("rejected", s.rejected),
            ("leases_won", s.leases_won),
            ("leases_waited", s.leases_waited),
            ("waits_answered", s.waits_answered),
        ],
        calls: s.calls,
        call_micros: s.call_micros,
    }
}
