//! The trust roots attestors fetch from their own TUF repository (`cosign.tuf.mirror`,
//! `tuf.root.path` — a file or URL — or `tuf.root.data`, base64, as Kyverno defines them; a
//! mirror defaults to the public-good one and a root to its embedded anchor, as sigstore-go's
//! defaults do in Kyverno).
//!
//! The first verification that names a repository starts its source in the background and is
//! answered "not fetched yet" (a verdict never cached; the one-shot commands wait for the first
//! fetch, `TufSources::settle`); from then on the source is refreshed every period like the
//! server-wide one ([`super::TrustRoots`]), and verifications use the last root it proved.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use ivory_policy::types::Tuf;
use ivory_registry::{Registry, UrlFetcher};
use sha2::{Digest as _, Sha256};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{
    PUBLIC_GOOD_TUF_MIRROR, PUBLIC_GOOD_TUF_ROOT, RefreshConfig, RootState, TrustRoots,
    TrustSourceError, TufSource,
};

/// Largest `tuf.root` read from a file or URL (Sigstore's root.json is about 6 KiB).
const MAX_TUF_ROOT_BYTES: usize = 512 * 1024;
/// Repositories followed at once; a policy naming more is answered "not fetched".
const MAX_SOURCES: usize = 64;

/// What an attestor's `tuf` names: the mirror and where its anchor comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TufKey {
    mirror: String,
    root: RootSpec,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum RootSpec {
    /// The public-good anchor built into ivory.
    Embedded,
    /// `root.data`, decoded.
    Data(Vec<u8>),
    /// `root.path`: a file, or an http(s) URL.
    Path(String),
}

impl TufKey {
    /// The key of `tuf`; an error when `root.data` is not base64.
    fn of(tuf: &Tuf) -> Result<Self, Pending> {
        let mirror = tuf
            .mirror
            .as_deref()
            .filter(|m| !m.trim().is_empty())
            .unwrap_or(PUBLIC_GOOD_TUF_MIRROR)
            .trim()
            .trim_end_matches('/')
            .to_owned();
        let root = tuf.root.as_ref();
        let path = root
            .and_then(|r| r.path.as_deref())
            .filter(|p| !p.is_empty());
        let data = root
            .and_then(|r| r.data.as_deref())
            .filter(|d| !d.is_empty());
        // Kyverno reads `path` first.
        let root = match (path, data) {
            (Some(path), _) => RootSpec::Path(path.to_owned()),
            (None, Some(data)) => RootSpec::Data(
                base64::engine::general_purpose::STANDARD
                    .decode(data.trim())
                    .map_err(|e| Pending::Invalid(format!("tuf.root.data is not base64: {e}")))?,
            ),
            (None, None) => RootSpec::Embedded,
        };
        Ok(Self { mirror, root })
    }

    /// A stable name for the source's cache folder.
    fn folder(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.mirror.as_bytes());
        match &self.root {
            RootSpec::Embedded => h.update(b"embedded"),
            RootSpec::Data(d) => h.update(d),
            RootSpec::Path(p) => h.update(p.as_bytes()),
        }
        hex::encode(&h.finalize()[..16])
    }
}

/// One followed repository.
struct Slot {
    /// Set once the anchor is read and the source built.
    roots: Mutex<Option<TrustRoots>>,
    /// Why the source has no root yet (the last failure), for the "not fetched" answer.
    last_error: Mutex<Option<String>>,
    /// Signalled after each refresh attempt.
    attempted: Notify,
}

impl Slot {
    /// The root the source last proved, if it has proved one.
    fn root(&self) -> Option<Arc<RootState>> {
        let roots = self.roots.lock().ok()?.clone()?;
        let stats = roots.stats();
        (stats.succeeded > 0 || roots.generation() > 0).then(|| roots.current())
    }
}

/// The repositories attestors name; cheap to clone.
#[derive(Clone)]
pub struct TufSources {
    inner: Arc<Inner>,
}

struct Inner {
    /// One guarded fetcher for every source, so their reads share one byte budget; why there
    /// is none, without a registry client.
    fetcher: Result<UrlFetcher, TrustSourceError>,
    config: RefreshConfig,
    period: Duration,
    cache_root: Option<PathBuf>,
    slots: Mutex<HashMap<TufKey, Arc<Slot>>>,
    /// Bumped whenever a source proves a new root: plans made before are made again.
    generation: AtomicU64,
}

impl std::fmt::Debug for TufSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TufSources")
            .field("period", &self.inner.period)
            .finish()
    }
}

impl Default for TufSources {
    /// No registry client: every attestor's repository is answered "not fetched".
    fn default() -> Self {
        Self::build(
            Err(TrustSourceError::NoClient(
                "this verifier fetches no TUF repository".into(),
            )),
            RefreshConfig::default(),
            Duration::from_secs(3600),
            None,
        )
    }
}

/// Why an attestor's root is not available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending {
    /// The attestor's `tuf` cannot be used at all (bad base64).
    Invalid(String),
    /// The root is not fetched yet (or every fetch so far failed: the reason).
    NotYet(String),
}

impl TufSources {
    /// Sources fetched through `registry`'s guarded client, refreshed every `period`, their
    /// verified metadata kept under `cache_root/<source>` when given.
    pub fn new(
        registry: Registry,
        config: RefreshConfig,
        period: Duration,
        cache_root: Option<PathBuf>,
    ) -> Self {
        Self::build(super::tuf::fetcher(&registry), config, period, cache_root)
    }

    fn build(
        fetcher: Result<UrlFetcher, TrustSourceError>,
        config: RefreshConfig,
        period: Duration,
        cache_root: Option<PathBuf>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                fetcher,
                config,
                period,
                cache_root,
                slots: Mutex::new(HashMap::new()),
                generation: AtomicU64::new(0),
            }),
        }
    }

    /// Bumped whenever a source proves a new root.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// The root `tuf` names, once fetched; the first call starts following it.
    pub fn root(&self, tuf: &Tuf) -> Result<Arc<RootState>, Pending> {
        let key = TufKey::of(tuf)?;
        let slot = self.slot(&key)?;
        slot.root().ok_or_else(|| {
            let why = slot
                .last_error
                .lock()
                .ok()
                .and_then(|e| e.clone())
                .unwrap_or_else(|| "the first fetch is under way".to_owned());
            Pending::NotYet(format!(
                "the trust root of TUF {} is not fetched yet: {why}",
                key.mirror
            ))
        })
    }

    /// Waits until `tuf`'s source has made an attempt (or `deadline`): the one-shot commands
    /// judge with the root once it is in.
    pub async fn settle(&self, tuf: &Tuf, deadline: Instant) {
        let Ok(key) = TufKey::of(tuf) else {
            return;
        };
        let Ok(slot) = self.slot(&key) else {
            return;
        };
        while slot.root().is_none() {
            let attempted = slot.attempted.notified();
            if slot.root().is_some()
                || slot.last_error.lock().is_ok_and(|e| e.is_some())
                || tokio::time::timeout_at(deadline, attempted).await.is_err()
            {
                return;
            }
        }
    }

    fn slot(&self, key: &TufKey) -> Result<Arc<Slot>, Pending> {
        let mut slots = self
            .inner
            .slots
            .lock()
            .map_err(|_| Pending::NotYet("the TUF sources are unavailable".into()))?;
        if let Some(slot) = slots.get(key) {
            return Ok(Arc::clone(slot));
        }
        if slots.len() >= MAX_SOURCES {
            return Err(Pending::NotYet(format!(
                "ivory follows at most {MAX_SOURCES} TUF repositories"
            )));
        }
        let slot = Arc::new(Slot {
            roots: Mutex::new(None),
            last_error: Mutex::new(None),
            attempted: Notify::new(),
        });
        slots.insert(key.clone(), Arc::clone(&slot));
        drop(slots);
        self.follow(key.clone(), Arc::clone(&slot));
        Ok(slot)
    }

    /// Starts the background task that reads the anchor, then refreshes every period.
    fn follow(&self, key: TufKey, slot: Arc<Slot>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            note(&slot, "no runtime to fetch it in".into());
            return;
        };
        let sources = self.clone();
        runtime.spawn(async move {
            let roots = match sources.start(&key).await {
                Ok(roots) => roots,
                Err(e) => {
                    note(&slot, e.to_string());
                    return;
                }
            };
            if let Ok(mut held) = slot.roots.lock() {
                *held = Some(roots.clone());
            }
            let period = sources.inner.period;
            roots
                .refresh_every(period, |outcome| match outcome {
                    Ok(changed) => {
                        if let Ok(mut e) = slot.last_error.lock() {
                            *e = None;
                        }
                        if *changed {
                            sources.inner.generation.fetch_add(1, Ordering::AcqRel);
                        }
                        slot.attempted.notify_waiters();
                    }
                    Err(e) => note(&slot, e.to_string()),
                })
                .await;
        });
    }

    /// Reads the anchor and builds the source.
    async fn start(&self, key: &TufKey) -> Result<TrustRoots, TrustSourceError> {
        let fetcher = self
            .inner
            .fetcher
            .as_ref()
            .map_err(|why| TrustSourceError::Tuf {
                mirror: key.mirror.clone(),
                reason: why.to_string(),
            })?;
        let root = match &key.root {
            RootSpec::Embedded => PUBLIC_GOOD_TUF_ROOT.to_vec(),
            RootSpec::Data(d) => d.clone(),
            RootSpec::Path(path) => self.read_anchor(fetcher, path).await?,
        };
        let source = TufSource {
            mirror: key.mirror.clone(),
            root,
            cache_dir: self.inner.cache_root.as_ref().map(|c| c.join(key.folder())),
        };
        TrustRoots::tuf(&source, fetcher, self.inner.config)
    }

    /// `tuf.root.path`: an http(s) URL through the guarded fetcher, else a file.
    async fn read_anchor(
        &self,
        fetcher: &UrlFetcher,
        path: &str,
    ) -> Result<Vec<u8>, TrustSourceError> {
        let fail = |reason: String| TrustSourceError::Anchor {
            path: path.to_owned(),
            reason,
        };
        if path.starts_with("http://") || path.starts_with("https://") {
            let deadline = ivory_clock::deadline_in(self.inner.config.fetch_timeout);
            return fetcher
                .get(path, MAX_TUF_ROOT_BYTES, deadline)
                .await
                .map_err(|e| fail(e.to_string()));
        }
        super::read_capped(std::path::Path::new(path), MAX_TUF_ROOT_BYTES)
            .map_err(|e| fail(e.to_string()))
    }
}

fn note(slot: &Slot, error: String) {
    if let Ok(mut e) = slot.last_error.lock() {
        *e = Some(error);
    }
    slot.attempted.notify_waiters();
}
