//! The TUF client of a [`super::TufSource`]: `sigstore-tuf`'s `Updater` (root chain, timestamp,
//! snapshot, targets; thresholds, expiry, rollback, hash and length pinning) over the registry
//! client's guarded GET ([`ivory_registry::UrlFetcher`]: http(s) only, no redirects, the
//! egress rule, bodies capped at what the metadata allows, a deadline per fetch). Every URL is
//! the mirror's base joined with a name the TUF workflow chooses (`N.root.json`,
//! `timestamp.json`, `targets/<sha256>.trusted_root.json`), never one a policy or a request
//! chooses, and a name that could leave the mirror's path is refused.
//!
//! The updater is kept between refreshes, so a rollback to metadata older than what this
//! process saw is refused; with a cache directory the verified metadata is written through, so
//! a later process starts from it (a rollback across restarts is refused too) and, with the
//! mirror down, proves its last root again from the anchor ([`TufClient::cached`]).

use std::path::PathBuf;
use std::time::SystemTime;

use ivory_registry::{Registry, UrlFetchError, UrlFetcher};
use sigstore_tuf::cache::{FileStore, MetadataStore, StoreRepository};
use sigstore_tuf::client::Updater;
use sigstore_tuf::transport::{FetchFuture, Repository, UpdaterConfig};
use tokio::sync::Mutex;

use super::{RefreshConfig, TrustSourceError, TufSource};

/// The Sigstore target holding the trusted root.
const TRUSTED_ROOT_TARGET: &str = "trusted_root.json";
/// Bytes of TUF bodies held at once by the fetches of one fetcher (the server-wide source's,
/// or all attestors' sources together).
const READ_BUDGET_BYTES: usize = 16 * 1024 * 1024;

/// The guarded fetcher TUF sources read through, with the read budget they share.
pub(crate) fn fetcher(registry: &Registry) -> Result<UrlFetcher, TrustSourceError> {
    registry
        .url_fetcher(READ_BUDGET_BYTES)
        .map_err(|e| TrustSourceError::NoClient(e.to_string()))
}
/// Largest `trusted_root.json` target (its length is pinned by the targets metadata as well).
const MAX_TARGET_BYTES: u64 = 1024 * 1024;
/// The cache file whose time says when the mirror last answered.
const TIMESTAMP_FILE: &str = "timestamp.json";
/// Largest cache file read back (sigstore-tuf's largest metadata limit is 5 MB).
const MAX_CACHED_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// One TUF source's client.
pub(crate) struct TufClient {
    mirror: String,
    root: Vec<u8>,
    cache_dir: Option<PathBuf>,
    fetcher: UrlFetcher,
    config: RefreshConfig,
    updater: Mutex<Option<Updater>>,
}

impl TufClient {
    /// The client of `source`, its fetches through `fetcher` (whose read budget it shares).
    pub(crate) fn new(
        source: &TufSource,
        fetcher: &UrlFetcher,
        config: RefreshConfig,
    ) -> Result<Self, TrustSourceError> {
        let mirror = source.mirror.trim_end_matches('/').to_owned();
        let fail = |reason: String| TrustSourceError::Tuf {
            mirror: mirror.clone(),
            reason,
        };
        ivory_registry::checked_url(&mirror).map_err(|e| fail(e.to_string()))?;
        // The anchor must be a root the TUF verification accepts, before anything is fetched.
        sigstore_tuf::trusted::TrustedMetadataSet::from_root(&source.root)
            .map_err(|e| fail(format!("the TUF root is not usable: {e}")))?;
        Ok(Self {
            mirror,
            root: source.root.clone(),
            cache_dir: source.cache_dir.clone(),
            fetcher: fetcher.clone(),
            config,
            updater: Mutex::new(None),
        })
    }

    /// `TUF <mirror>`.
    pub(crate) fn origin(&self) -> String {
        format!("TUF {}", self.mirror)
    }

    fn error(&self, e: impl std::fmt::Display) -> TrustSourceError {
        TrustSourceError::Tuf {
            mirror: self.mirror.clone(),
            reason: e.to_string(),
        }
    }

    /// The current `trusted_root.json` from the mirror, the whole workflow verified.
    pub(crate) async fn fetch(&self) -> Result<String, TrustSourceError> {
        let mut slot = self.updater.lock().await;
        if slot.is_none() {
            *slot = Some(self.updater()?);
        }
        let Some(updater) = slot.as_mut() else {
            return Err(self.error("no updater"));
        };
        let deadline = ivory_clock::deadline_in(self.config.refresh_timeout);
        let work = async {
            let now = now();
            updater.refresh(now).await?;
            updater.get_target(TRUSTED_ROOT_TARGET, now).await
        };
        let bytes = tokio::time::timeout_at(deadline, work)
            .await
            .map_err(|_| self.error("no answer within the refresh deadline"))?
            .map_err(|e| self.error(chain(&e)))?;
        String::from_utf8(bytes).map_err(|_| self.error("the trusted root is not UTF-8 text"))
    }

    /// The root the cache directory proves on its own, and when the mirror last answered.
    pub(crate) async fn cached(&self) -> Result<Option<(String, SystemTime)>, TrustSourceError> {
        let Some(dir) = &self.cache_dir else {
            return Ok(None);
        };
        let Ok(meta) = std::fs::metadata(dir.join(TIMESTAMP_FILE)) else {
            return Ok(None);
        };
        let store = CacheStore::new(dir);
        let mut updater = Updater::new(StoreRepository::new(store.clone()), &self.root)
            .map_err(|e| self.error(chain(&e)))?
            .with_config(limits())
            .with_store(store);
        let now = now();
        updater
            .refresh(now)
            .await
            .map_err(|e| self.error(format!("the cache: {}", chain(&e))))?;
        let bytes = updater
            .get_target(TRUSTED_ROOT_TARGET, now)
            .await
            .map_err(|e| self.error(format!("the cache: {}", chain(&e))))?;
        let json = String::from_utf8(bytes).map_err(|_| self.error("not UTF-8 text"))?;
        let obtained = meta.modified().unwrap_or_else(|_| ivory_clock::wall());
        Ok(Some((json, obtained)))
    }

    fn updater(&self) -> Result<Updater, TrustSourceError> {
        let repo = Mirror {
            base: self.mirror.clone(),
            fetcher: self.fetcher.clone(),
            fetch_timeout: self.config.fetch_timeout,
        };
        let updater = Updater::new(repo, &self.root)
            .map_err(|e| self.error(chain(&e)))?
            .with_config(limits());
        Ok(match &self.cache_dir {
            Some(dir) => updater.with_store(CacheStore::new(dir)),
            None => updater,
        })
    }
}

/// The cache folder as a TUF metadata store: written as `sigstore-tuf`'s `FileStore` writes
/// (atomic renames), read back only from regular files of at most [`MAX_CACHED_FILE_BYTES`],
/// opened without following a link and without blocking, so whoever can write the folder can
/// plant neither a huge file nor a FIFO or a link to `/dev/zero` (what is read is verified from
/// the anchor anyway).
#[derive(Clone)]
struct CacheStore {
    dir: PathBuf,
    files: FileStore,
}

impl CacheStore {
    fn new(dir: &std::path::Path) -> Self {
        Self {
            dir: dir.to_owned(),
            files: FileStore::new(dir),
        }
    }
}

impl MetadataStore for CacheStore {
    fn load(&self, name: &str) -> sigstore_tuf::Result<Option<Vec<u8>>> {
        use rustix::fs::{FileType, Mode, OFlags};
        use std::io::Read as _;
        if !stays_on_the_mirror(name) {
            return Err(sigstore_tuf::Error::Malformed(format!(
                "unsafe cache name {name:?}"
            )));
        }
        let path = self.dir.join(name);
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match rustix::fs::open(&path, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => {
                return Err(sigstore_tuf::Error::io(
                    format!("opening {}", path.display()),
                    e.into(),
                ));
            }
        };
        let stat = rustix::fs::fstat(&fd).map_err(|e| {
            sigstore_tuf::Error::io(format!("reading {}", path.display()), e.into())
        })?;
        let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
            || size > MAX_CACHED_FILE_BYTES
        {
            return Err(sigstore_tuf::Error::Malformed(format!(
                "{} is not a regular file of at most {MAX_CACHED_FILE_BYTES} bytes",
                path.display()
            )));
        }
        let mut bytes = Vec::new();
        std::fs::File::from(fd)
            .take(MAX_CACHED_FILE_BYTES)
            .read_to_end(&mut bytes)
            .map_err(|e| sigstore_tuf::Error::io(format!("reading {}", path.display()), e))?;
        Ok(Some(bytes))
    }

    fn store(&self, name: &str, bytes: &[u8]) -> sigstore_tuf::Result<()> {
        self.files.store(name, bytes)
    }
}

/// `sigstore-tuf`'s defaults (python-tuf's), with the target capped at what a trusted root
/// can be.
fn limits() -> UpdaterConfig {
    let mut config = UpdaterConfig::default();
    config.target_max_length = MAX_TARGET_BYTES;
    config
}

fn now() -> jiff::Timestamp {
    jiff::Timestamp::try_from(ivory_clock::wall()).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

/// An error with its causes, one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The mirror as a `sigstore-tuf` repository.
struct Mirror {
    base: String,
    fetcher: UrlFetcher,
    fetch_timeout: std::time::Duration,
}

impl Mirror {
    async fn get(&self, path: String, max_length: u64) -> sigstore_tuf::Result<Option<Vec<u8>>> {
        if !stays_on_the_mirror(&path) {
            return Err(sigstore_tuf::Error::transport(format!(
                "refused to fetch {path:?}: not a plain name under the mirror"
            )));
        }
        let url = format!("{}/{path}", self.base);
        let limit = usize::try_from(max_length).unwrap_or(usize::MAX);
        let deadline = ivory_clock::deadline_in(self.fetch_timeout);
        match self.fetcher.get(&url, limit, deadline).await {
            Ok(bytes) => Ok(Some(bytes)),
            // The end of the root chain (and a missing file) is a 404; some CDNs answer 403.
            Err(UrlFetchError::Status(404 | 403)) => Ok(None),
            Err(e) => Err(sigstore_tuf::Error::transport(format!("GET {url}: {e}"))),
        }
    }
}

impl Repository for Mirror {
    fn fetch_metadata<'a>(&'a self, name: &'a str, max_length: u64) -> FetchFuture<'a> {
        Box::pin(self.get(name.to_owned(), max_length))
    }

    fn fetch_target<'a>(&'a self, path: &'a str, max_length: u64) -> FetchFuture<'a> {
        Box::pin(self.get(format!("targets/{path}"), max_length))
    }
}

/// A relative path of plain segments (`[A-Za-z0-9._-]`, none `.` or `..`): joined to the
/// mirror's base, it cannot name another host, a query or a parent directory.
fn stays_on_the_mirror(path: &str) -> bool {
    !path.is_empty()
        && path.split('/').all(|segment| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        })
}

#[cfg(test)]
mod tests {
    use super::stays_on_the_mirror;

    #[test]
    fn only_plain_names_under_the_mirror_are_fetched() {
        for good in [
            "1.root.json",
            "timestamp.json",
            "targets/0123abcd.trusted_root.json",
            "delegated/role-1.json",
        ] {
            assert!(stays_on_the_mirror(good), "{good}");
        }
        for bad in [
            "",
            "../root.json",
            "targets/../../etc/passwd",
            "/abs.json",
            "a//b",
            "x?y=1",
            "x#y",
            "@evil.example/x",
            "%2e%2e/x",
            "a\\b",
            "./x",
        ] {
            assert!(!stays_on_the_mirror(bad), "{bad}");
        }
    }
}
