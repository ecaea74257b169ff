//! Where the process-wide trusted root comes from, kept current off the request path.
//!
//! An attestor that names no `trustedRoot` is verified against the root a [`TrustRoots`]
//! holds: the public-good root embedded in ivory, a `trusted_root.json` file (a mounted
//! ConfigMap or Secret, read again on every refresh), or the `trusted_root.json` target of a
//! TUF repository (the public-good one, or a site's own mirror), fetched through
//! `sigstore-tuf`'s verification over the registry client's guarded, capped GET
//! (`trust_source/tuf.rs`). A refresh runs in the background ([`TrustRoots::spawn_refresh`]), never during an
//! admission; one that fails keeps the root in force, counts the failure and says so in one log
//! line. Until a TUF source has answered once, the last root its cache directory proves (the
//! whole TUF chain verified again from the anchor, offline) or else the embedded root is in
//! force.
//!
//! A root is swapped whole ([`arc_swap`]): a verification sees the old root or the new one,
//! never a mix, and its cache keys carry the root's hash, so verdicts reached under one root
//! are never answered under another.

pub(crate) mod attestor;
pub(crate) mod tuf;

pub use attestor::{Pending, TufSources};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use ivory_registry::Registry;
use sha2::{Digest as _, Sha256};
use sigstore_verify::trust_root::TrustedRoot;

/// The embedded public-good trusted root (byte-identical to sigstore/root-signing
/// `targets/trusted_root.json`, 2026 edition: Fulcio v1/v2, Rekor v1 + v2 `log2025-1`, CT, TSA).
pub const PUBLIC_GOOD_TRUSTED_ROOT: &str =
    sigstore_verify::trust_root::SIGSTORE_PRODUCTION_TRUSTED_ROOT;
/// The public-good TUF repository (Sigstore's CDN).
pub const PUBLIC_GOOD_TUF_MIRROR: &str = "https://tuf-repo-cdn.sigstore.dev";
/// The public-good TUF repository's root (version 16), the anchor its chain is walked from:
/// byte-identical to sigstore/root-signing's, as `sigstore-trust-root` 0.15.1 embeds it.
pub const PUBLIC_GOOD_TUF_ROOT: &[u8] = include_bytes!("trust_source/public-good-tuf-root.json");
/// Largest `trusted_root.json` read from a file (the public-good one is about 20 KiB).
pub const MAX_TRUSTED_ROOT_BYTES: usize = 1024 * 1024;

/// Where the default trusted root comes from.
#[derive(Clone, Debug)]
pub enum TrustSource {
    /// The public-good root embedded in ivory.
    Embedded,
    /// A `trusted_root.json` file, read at start and on every refresh.
    File(PathBuf),
    /// The `trusted_root.json` target of a TUF repository.
    Tuf(TufSource),
}

/// A TUF repository and the root its chain starts from.
#[derive(Clone, Debug)]
pub struct TufSource {
    /// The repository's base URL (`http` or `https`: the metadata is signed).
    pub mirror: String,
    /// The `root.json` trusted to start the chain.
    pub root: Vec<u8>,
    /// Where verified metadata and the target are kept between runs, so a restart with the
    /// mirror down serves the last root the chain proves; `None`: memory only.
    pub cache_dir: Option<PathBuf>,
}

impl TufSource {
    /// Whether this is Sigstore's public-good repository from its embedded anchor.
    pub fn is_public_good(&self) -> bool {
        self.mirror.trim_end_matches('/') == PUBLIC_GOOD_TUF_MIRROR
            && self.root == PUBLIC_GOOD_TUF_ROOT
    }

    /// Sigstore's public-good repository, anchored at the embedded root.
    pub fn public_good(cache_dir: Option<PathBuf>) -> Self {
        Self {
            mirror: PUBLIC_GOOD_TUF_MIRROR.to_owned(),
            root: PUBLIC_GOOD_TUF_ROOT.to_vec(),
            cache_dir,
        }
    }
}

/// A trusted root in force, and where it came from.
#[derive(Debug)]
pub struct RootState {
    /// The `trusted_root.json` text.
    pub json: Arc<str>,
    /// Its SHA-256: part of every attestor's (and so every verdict's) cache key.
    pub hash: [u8; 32],
    /// Where it came from, for messages, metrics and `ivory doctor`: `embedded`,
    /// `file /etc/ivory/trusted_root.json`, `TUF https://…`.
    pub origin: String,
    /// When it was read or verified from its source; `None` for the embedded root.
    pub obtained: Option<SystemTime>,
    /// Whether it is Sigstore's public-good root (embedded, or from its TUF repository),
    /// which lists every public log: a policy's `ctlog.url` must then name one of them.
    pub public_good: bool,
}

impl RootState {
    fn new(json: &str, origin: String, obtained: Option<SystemTime>, public_good: bool) -> Self {
        Self {
            json: Arc::from(json),
            hash: Sha256::digest(json.as_bytes()).into(),
            origin,
            obtained,
            public_good,
        }
    }

    /// The embedded public-good root.
    pub fn embedded() -> Self {
        Self::new(PUBLIC_GOOD_TRUSTED_ROOT, "embedded".to_owned(), None, true)
    }

    /// `origin`, and when the root was obtained (RFC 3339), for a message.
    pub fn describe(&self) -> String {
        match self.obtained {
            Some(at) => format!("{}, updated {}", self.origin, rfc3339(at)),
            None => format!("{}, built into this ivory", self.origin),
        }
    }
}

/// What refreshing a source did, for metrics and `ivory doctor`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RefreshStats {
    /// The source, as [`RootState::origin`] names it.
    pub source: String,
    /// Refreshes that ended with a root (changed or not).
    pub succeeded: u64,
    /// Refreshes that failed (the root in force was kept).
    pub failed: u64,
    /// When the last refresh succeeded.
    pub last_success: Option<SystemTime>,
    /// Why the last refresh failed, when the last one did.
    pub last_error: Option<String>,
}

/// Why a refresh brought no root. The root in force is kept.
#[derive(Debug, thiserror::Error)]
pub enum TrustSourceError {
    /// The file could not be read or is too large.
    #[error("reading the trusted root {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The document is not a usable `trusted_root.json`.
    #[error("{origin}: not a usable trusted_root.json: {reason}")]
    Invalid {
        /// Where it came from.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No guarded HTTP client to fetch with (none given, or it could not be built).
    #[error("no HTTP client for TUF: {0}")]
    NoClient(String),
    /// An attestor's `tuf.root.path` (a file or URL) could not be read.
    #[error("tuf.root.path {path}: {reason}")]
    Anchor {
        /// The path or URL.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The TUF repository's metadata or target was refused, or could not be fetched.
    #[error("TUF {mirror}: {reason}")]
    Tuf {
        /// The repository.
        mirror: String,
        /// What failed (expired metadata, a rollback, a hash mismatch, a threshold not met,
        /// the mirror unreachable…).
        reason: String,
    },
}

/// Limits and timings of TUF refreshes.
#[derive(Clone, Copy, Debug)]
pub struct RefreshConfig {
    /// Deadline of each metadata or target fetch.
    pub fetch_timeout: Duration,
    /// Deadline of a whole refresh (root chain, timestamp, snapshot, targets, target).
    pub refresh_timeout: Duration,
}

impl Default for RefreshConfig {
    fn default() -> Self {
        Self {
            fetch_timeout: Duration::from_secs(10),
            refresh_timeout: Duration::from_secs(60),
        }
    }
}

/// The process-wide trusted root and its source; cheap to clone.
#[derive(Clone)]
pub struct TrustRoots {
    inner: Arc<Inner>,
}

struct Inner {
    source: TrustSource,
    current: ArcSwap<RootState>,
    generation: AtomicU64,
    stats: Mutex<RefreshStats>,
    tuf: Option<tuf::TufClient>,
}

impl std::fmt::Debug for TrustRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustRoots")
            .field("source", &self.inner.source)
            .field("origin", &self.current().origin)
            .finish()
    }
}

impl Default for TrustRoots {
    fn default() -> Self {
        Self::embedded()
    }
}

impl TrustRoots {
    /// The embedded public-good root, for good.
    pub fn embedded() -> Self {
        Self::with(TrustSource::Embedded, RootState::embedded(), None)
    }

    /// Roots from `source`. A file is read now (an unreadable or invalid one is an error: the
    /// operator named it); a TUF source starts from the embedded root until [`Self::refresh`]
    /// (or [`Self::load_cached`]) brings its own. `registry` provides the guarded HTTP client
    /// TUF fetches go through.
    pub fn new(
        source: TrustSource,
        registry: &Registry,
        config: RefreshConfig,
    ) -> Result<Self, TrustSourceError> {
        match &source {
            TrustSource::Embedded => Ok(Self::embedded()),
            TrustSource::File(path) => {
                let state = read_file(path)?;
                Ok(Self::with(source.clone(), state, None))
            }
            TrustSource::Tuf(tuf) => Self::tuf(tuf, &tuf::fetcher(registry)?, config),
        }
    }

    /// Roots from the TUF repository `source`, fetched through `fetcher`.
    pub(crate) fn tuf(
        source: &TufSource,
        fetcher: &ivory_registry::UrlFetcher,
        config: RefreshConfig,
    ) -> Result<Self, TrustSourceError> {
        let client = tuf::TufClient::new(source, fetcher, config)?;
        Ok(Self::with(
            TrustSource::Tuf(source.clone()),
            RootState::embedded(),
            Some(client),
        ))
    }

    fn with(source: TrustSource, state: RootState, tuf: Option<tuf::TufClient>) -> Self {
        let stats = RefreshStats {
            source: source_name(&source),
            ..RefreshStats::default()
        };
        Self {
            inner: Arc::new(Inner {
                source,
                current: ArcSwap::from_pointee(state),
                generation: AtomicU64::new(0),
                stats: Mutex::new(stats),
                tuf,
            }),
        }
    }

    /// The root in force.
    pub fn current(&self) -> Arc<RootState> {
        self.inner.current.load_full()
    }

    /// How many times the root in force changed.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// The source roots come from.
    pub fn source(&self) -> &TrustSource {
        &self.inner.source
    }

    /// What refreshing did so far.
    pub fn stats(&self) -> RefreshStats {
        self.inner
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// A TUF source's last root proved by its cache directory alone (no network): the chain
    /// verified again from the anchor, expiry included. `Ok(false)` when there is no cache or
    /// it proves nothing usable (the root in force stays).
    pub async fn load_cached(&self) -> bool {
        let Some(tuf) = &self.inner.tuf else {
            return false;
        };
        match tuf.cached().await {
            Ok(Some((json, obtained))) => self.offer(&json, tuf.origin(), obtained).is_ok(),
            Ok(None) => false,
            Err(e) => {
                tracing::info!(source = %tuf.origin(), error = %e, "the TUF cache proves no trusted root; keeping the root in force");
                false
            }
        }
    }

    /// Reads the source again; swaps the root in force when it changed. A failure keeps it
    /// and is counted. Returns whether the root changed.
    pub async fn refresh(&self) -> Result<bool, TrustSourceError> {
        let result = match (&self.inner.source, &self.inner.tuf) {
            (TrustSource::Embedded, _) => Ok(false),
            (TrustSource::File(path), _) => read_file(path).and_then(|state| {
                let origin = state.origin.clone();
                self.offer(&state.json, origin, ivory_clock::wall())
            }),
            (TrustSource::Tuf(_), Some(tuf)) => match tuf.fetch().await {
                Ok(json) => self.offer(&json, tuf.origin(), ivory_clock::wall()),
                Err(e) => Err(e),
            },
            (TrustSource::Tuf(source), None) => Err(TrustSourceError::Tuf {
                mirror: source.mirror.clone(),
                reason: "no TUF client".into(),
            }),
        };
        self.record(&result);
        result
    }

    /// Validates `json` and puts it in force unless it is the root in force already. The time
    /// a root was obtained only moves forward with a changed root or a successful refresh.
    fn offer(
        &self,
        json: &str,
        origin: String,
        obtained: SystemTime,
    ) -> Result<bool, TrustSourceError> {
        validate(json, &origin)?;
        let public_good = matches!(&self.inner.source, TrustSource::Tuf(t) if t.is_public_good());
        let state = RootState::new(json, origin, Some(obtained), public_good);
        let changed = state.hash != self.current().hash;
        self.inner.current.store(Arc::new(state));
        if changed {
            self.inner.generation.fetch_add(1, Ordering::AcqRel);
        }
        Ok(changed)
    }

    fn record(&self, result: &Result<bool, TrustSourceError>) {
        let Ok(mut stats) = self.inner.stats.lock() else {
            return;
        };
        match result {
            Ok(_) => {
                stats.succeeded += 1;
                stats.last_success = Some(ivory_clock::wall());
                stats.last_error = None;
            }
            Err(e) => {
                stats.failed += 1;
                stats.last_error = Some(e.to_string());
            }
        }
    }

    /// Refreshes now and then every `period`, in the background, until the process ends. A
    /// TUF source first puts its cache's last proven root in force. Each changed root and each
    /// failure is one log line.
    pub fn spawn_refresh(&self, period: Duration) -> tokio::task::JoinHandle<()> {
        let roots = self.clone();
        tokio::spawn(async move { roots.refresh_every(period, |_| {}).await })
    }

    /// The loop of [`Self::spawn_refresh`], never ending: `after` sees each attempt's outcome
    /// (the cache's proof as `Ok(true)`), for a caller that follows the source.
    pub(crate) async fn refresh_every(
        &self,
        period: Duration,
        mut after: impl FnMut(&Result<bool, TrustSourceError>),
    ) {
        if self.load_cached().await {
            tracing::info!(root = %self.current().describe(), "trusted root from the TUF cache");
            after(&Ok(true));
        }
        loop {
            let outcome = self.refresh().await;
            match &outcome {
                Ok(true) => {
                    tracing::info!(root = %self.current().describe(), "trusted root updated");
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    error = %e,
                    kept = %self.current().describe(),
                    "trusted root refresh failed; the root in force is kept"
                ),
            }
            after(&outcome);
            tokio::time::sleep(period).await;
        }
    }
}

fn source_name(source: &TrustSource) -> String {
    match source {
        TrustSource::Embedded => "embedded".to_owned(),
        TrustSource::File(path) => file_origin(path),
        TrustSource::Tuf(tuf) => format!("TUF {}", tuf.mirror),
    }
}

fn file_origin(path: &Path) -> String {
    format!("file {}", path.display())
}

fn read_file(path: &Path) -> Result<RootState, TrustSourceError> {
    let fail = |reason: String| TrustSourceError::File {
        path: path.to_owned(),
        reason,
    };
    let bytes = read_capped(path, MAX_TRUSTED_ROOT_BYTES).map_err(|e| fail(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| fail("not UTF-8 text".into()))?;
    let origin = file_origin(path);
    validate(&text, &origin)?;
    Ok(RootState::new(
        &text,
        origin,
        Some(ivory_clock::wall()),
        false,
    ))
}

/// At most `limit` bytes of `path` (an error past it), read without following more.
fn read_capped(path: &Path, limit: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > limit {
        return Err(std::io::Error::other(format!("larger than {limit} bytes")));
    }
    Ok(bytes)
}

/// `json` is a `trusted_root.json` sigstore-verify can build a verifier from.
fn validate(json: &str, origin: &str) -> Result<(), TrustSourceError> {
    let invalid = |reason: String| TrustSourceError::Invalid {
        origin: origin.to_owned(),
        reason,
    };
    let root = TrustedRoot::from_json(json).map_err(|e| invalid(e.to_string()))?;
    sigstore_verify::Verifier::new(&root).map_err(|e| invalid(e.to_string()))?;
    Ok(())
}

/// `at` as RFC 3339 UTC, to the second.
fn rfc3339(at: SystemTime) -> String {
    jiff::Timestamp::try_from(at)
        .map(|t| t.round(jiff::Unit::Second).unwrap_or(t).to_string())
        .unwrap_or_else(|_| "an unknown time".to_owned())
}

#[cfg(test)]
mod tests;
