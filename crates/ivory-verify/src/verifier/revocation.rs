//! Revocation data fetched in the background: the CRLs Notation signatures' certificates name,
//! held in memory for [`crate::notation::revocation`] to judge chains by. An admission never
//! waits for a fetch: a lookup answers from what is held and, for a URL with nothing usable,
//! queues a fetch and returns at once (the verdict, "unknown", is never cached, so a later
//! admission is judged on the data once it arrives).
//!
//! URLs come from certificates (attacker-influenced even though their chains were checked), so
//! a fetch goes through the registry client's URL fetcher (`ivory_registry::UrlFetcher`:
//! http(s) only, no redirects, no link-local or metadata addresses, body capped), under a
//! deadline; at most [`MAX_PENDING`] fetches run at once, a URL is fetched at most once per
//! `retry_after`, and the CRLs held are bounded in total bytes (least used dropped first).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ivory_registry::{Registry, UrlFetcher};
use jiff::Timestamp;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::notation::revocation::{FetchedCrl, RevocationSource, next_update_of};

/// Fetches running at once; more requests wait for a later admission to ask again.
pub(crate) const MAX_PENDING: usize = 64;
/// CRLs whose age [`RevocationStats`] reports (the oldest).
pub(crate) const MAX_EXPORTED: usize = 100;

/// Limits and timings of the revocation data store.
#[derive(Clone, Debug)]
pub struct RevocationConfig {
    /// Largest CRL read.
    pub max_crl_bytes: usize,
    /// CRL bytes held at once (fetched data, least used dropped first).
    pub max_total_bytes: u64,
    /// Deadline of one fetch.
    pub fetch_timeout: Duration,
    /// A URL is fetched again (after a failure or to refresh) no sooner than this.
    pub retry_after: Duration,
    /// Data older than this is refreshed in the background (still used meanwhile, while
    /// its `nextUpdate` has not passed).
    pub refresh_after: Duration,
}

impl Default for RevocationConfig {
    fn default() -> Self {
        Self {
            max_crl_bytes: 16 * 1024 * 1024,
            max_total_bytes: 128 * 1024 * 1024,
            fetch_timeout: Duration::from_secs(10),
            retry_after: Duration::from_secs(10),
            refresh_after: Duration::from_secs(3600),
        }
    }
}

/// The age of one CRL held, for metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct CrlAge {
    /// The distribution point it was fetched from.
    pub url: String,
    /// Seconds since it was fetched.
    pub age_seconds: i64,
    /// Seconds until its `nextUpdate` (negative once passed; `None`: it has none).
    pub next_update_in_seconds: Option<i64>,
}

/// What the revocation store holds and did, for metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RevocationStats {
    /// The CRLs held, the oldest first, at most 100 of them.
    pub crls: Vec<CrlAge>,
    /// Fetches that brought a CRL.
    pub fetched: u64,
    /// Fetches that failed (unreachable, refused address, status, too large, not a CRL).
    pub failed: u64,
}

/// The store; cheap to clone.
#[derive(Clone)]
pub(crate) struct RevocationStore {
    inner: Arc<StoreInner>,
}

struct StoreInner {
    registry: Registry,
    config: RevocationConfig,
    /// Built on first use: processes that never meet a revocable certificate build none.
    fetcher: OnceLock<Option<UrlFetcher>>,
    crls: moka::sync::Cache<String, Arc<FetchedCrl>>,
    pending: Mutex<HashSet<String>>,
    /// URLs fetched lately (whatever the outcome): not fetched again before `retry_after`.
    attempted: moka::sync::Cache<String, ()>,
    settled: Notify,
    fetched: AtomicU64,
    failed: AtomicU64,
}

impl RevocationStore {
    pub(crate) fn new(registry: Registry, config: RevocationConfig) -> Self {
        let crls = moka::sync::Cache::builder()
            .weigher(|_: &String, crl: &Arc<FetchedCrl>| {
                u32::try_from(crl.der.len()).unwrap_or(u32::MAX)
            })
            .max_capacity(config.max_total_bytes)
            .build();
        let attempted = moka::sync::Cache::builder()
            .max_capacity(10_000)
            .time_to_live(config.retry_after)
            .build();
        Self {
            inner: Arc::new(StoreInner {
                registry,
                config,
                fetcher: OnceLock::new(),
                crls,
                pending: Mutex::default(),
                attempted,
                settled: Notify::new(),
                fetched: AtomicU64::new(0),
                failed: AtomicU64::new(0),
            }),
        }
    }

    /// Waits until no fetch is running, or `deadline` (the one-shot commands judge once the
    /// data they asked for is in; admissions never wait).
    pub(crate) async fn settled(&self, deadline: Instant) {
        loop {
            let notified = self.inner.settled.notified();
            if self.pending() == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }

    fn pending(&self) -> usize {
        self.inner.pending.lock().map(|p| p.len()).unwrap_or(0)
    }

    pub(crate) fn stats(&self) -> RevocationStats {
        let now = Timestamp::now();
        let mut crls: Vec<CrlAge> = self
            .inner
            .crls
            .iter()
            .map(|(url, crl)| CrlAge {
                url: url.as_ref().clone(),
                age_seconds: now.as_second() - crl.fetched_at.as_second(),
                next_update_in_seconds: crl.next_update.map(|t| t.as_second() - now.as_second()),
            })
            .collect();
        // The oldest first, and only so many: URLs come from certificates, and every one
        // would be a metric series.
        crls.sort_by(|a, b| b.age_seconds.cmp(&a.age_seconds).then(a.url.cmp(&b.url)));
        crls.truncate(MAX_EXPORTED);
        RevocationStats {
            crls,
            fetched: self.inner.fetched.load(Ordering::Relaxed),
            failed: self.inner.failed.load(Ordering::Relaxed),
        }
    }

    fn fetcher(&self) -> Option<UrlFetcher> {
        self.inner
            .fetcher
            .get_or_init(|| {
                let budget =
                    usize::try_from(self.inner.config.max_total_bytes).unwrap_or(usize::MAX);
                match self.inner.registry.url_fetcher(budget) {
                    Ok(f) => Some(f),
                    Err(error) => {
                        tracing::error!(%error, "cannot build the client that fetches CRLs");
                        None
                    }
                }
            })
            .clone()
    }

    /// One fetch of `url`, its outcome kept (a failure keeps what was held before).
    async fn fetch(self, url: String) {
        let config = &self.inner.config;
        let outcome = match self.fetcher() {
            None => Err("no HTTP client".to_owned()),
            Some(fetcher) => fetcher
                .get(
                    &url,
                    config.max_crl_bytes,
                    ivory_clock::now() + config.fetch_timeout,
                )
                .await
                .map_err(|e| e.to_string())
                .and_then(|der| {
                    // Read once here for refreshes and metrics; judged (issuer, signature,
                    // times) only against a chain, by the check.
                    use x509_cert::der::Decode as _;
                    x509_cert::crl::CertificateList::from_der(&der)
                        .map(|_| der)
                        .map_err(|e| format!("not a CRL: {e}"))
                }),
        };
        match outcome {
            Ok(der) => {
                tracing::info!(url, bytes = der.len(), "CRL fetched");
                self.inner.fetched.fetch_add(1, Ordering::Relaxed);
                let next_update = next_update_of(&der);
                self.inner.crls.insert(
                    url.clone(),
                    Arc::new(FetchedCrl {
                        der,
                        fetched_at: Timestamp::now(),
                        next_update,
                    }),
                );
            }
            Err(error) => {
                tracing::warn!(url, %error, "CRL fetch failed");
                self.inner.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Ok(mut pending) = self.inner.pending.lock() {
            pending.remove(&url);
        }
        self.inner.settled.notify_waiters();
    }

    /// Held data old enough, or close enough to its `nextUpdate`, to be fetched again.
    fn due(&self, crl: &FetchedCrl, now: Timestamp) -> bool {
        let refresh = i64::try_from(self.inner.config.refresh_after.as_secs()).unwrap_or(i64::MAX);
        now.as_second() - crl.fetched_at.as_second() >= refresh
            || crl
                .next_update
                .is_none_or(|next| next.as_second() - now.as_second() < 300)
    }
}

impl RevocationSource for RevocationStore {
    fn crl(&self, url: &str) -> Option<Arc<FetchedCrl>> {
        let crl = self.inner.crls.get(url)?;
        if self.due(&crl, Timestamp::now()) {
            self.request(url);
        }
        Some(crl)
    }

    fn request(&self, url: &str) {
        if self.inner.attempted.contains_key(url) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let Ok(mut pending) = self.inner.pending.lock() else {
                return;
            };
            if pending.len() >= MAX_PENDING || !pending.insert(url.to_owned()) {
                return;
            }
        }
        self.inner.attempted.insert(url.to_owned(), ());
        runtime.spawn(self.clone().fetch(url.to_owned()));
    }
}
