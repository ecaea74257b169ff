//! `--cache-redis`: the cache shared by the replicas (`ivory-l2`) and its metrics.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ivory_l2::{Keys, L2Config, RedisL2};
use ivory_server::L2Counts;

/// The L2 for `url`, sealed with the keys in `key_files` (the first seals, a second one is
/// still accepted while the fleet rotates), each call bounded by `timeout`; a `rediss://`
/// server's certificate may come from the CA in `ca_file`.
pub(super) fn connect(
    url: &str,
    key_files: &[PathBuf],
    timeout: Duration,
    ca_file: Option<&Path>,
) -> anyhow::Result<Arc<RedisL2>> {
    if key_files.is_empty() {
        bail!(
            "--cache-redis needs --cache-redis-key FILE: an HMAC key (at least {} bytes) shared \
             by the replicas, so that an entry written by anyone else is never trusted",
            ivory_l2::MIN_KEY_BYTES
        );
    }
    let mut keys = Vec::with_capacity(key_files.len());
    for path in key_files {
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading --cache-redis-key {}", path.display()))?;
        // Secrets mounted from files often end with a newline that is not part of the key.
        let trimmed = bytes.trim_ascii_end().to_vec();
        keys.push((format!("--cache-redis-key {}", path.display()), trimmed));
    }
    let keys = Keys::new(&keys)?;
    if timeout.is_zero() {
        bail!("--cache-redis-timeout must be more than 0s");
    }
    let mut config = L2Config::new(url, keys);
    config.deadline = timeout;
    if let Some(path) = ca_file {
        config.ca_pem = Some(
            std::fs::read(path)
                .with_context(|| format!("reading --cache-redis-ca {}", path.display()))?,
        );
    }
    Ok(Arc::new(RedisL2::new(config)?))
}

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
