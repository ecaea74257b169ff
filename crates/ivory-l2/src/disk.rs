//! The CLI's persistent verification cache: the same [`SharedCache`] seam as the Redis L2, on
//! files, so a second `ivory verify`/`apply`/`audit` over the same images asks the registry
//! nothing. What is stored and under which name is the verifier's decision (verdicts named by
//! digest + signature repository + attestor/trust hash + attestation type, exactly as the
//! server's caches; tag → digest for `--tag-cache-ttl` only; signature source hints); errors
//! are never stored.
//!
//! * **Sealed**: each file is an entry of the L2's format ([`Keys::seal`]: HMAC-SHA256 over
//!   name, expiry and value) under a random per-user key kept beside the entries (`key`, mode
//!   0600, in a 0700 directory). A file edited or copied to another name by hand does not open
//!   and is deleted; an expired one too. The key protects against edits by tools and other
//!   users, not against the user themselves: anyone who can read the key can seal.
//! * **Bounded**: entries larger than [`MAX_ENTRY_BYTES`] are neither written nor read, and
//!   when the files pass `max_bytes` in total the oldest (by modification time) are deleted
//!   until a quarter of the bound is free again.
//! * **Never a dependency**: every failure (unreadable file, full disk) reads as "not cached"
//!   and is counted; the command then asks the registry as it would without a cache.
//!   Concurrent runs are safe: entries are written to a temporary file and renamed.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::{SecureRandom as _, SystemRandom};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use ivory_verify::{Lookup, SharedCache};
use tokio::time::Instant;

use crate::entry::{Keys, MIN_KEY_BYTES, SEAL_OVERHEAD};

/// The largest value stored: what the L2 allows for one entry.
pub const MAX_ENTRY_BYTES: usize = 1024 * 1024;
/// Default bound on the total size of the entries (`--cache-max-size`).
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

const KEY_FILE: &str = "key";
const ENTRIES_DIR: &str = "entries";
/// Prefix of files being written (never read as entries).
const TEMP_PREFIX: &str = ".tmp-";

/// Why the cache directory cannot be used. The commands then run without a cache and say so.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A directory or the key could not be created or read.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// The key or a directory is open to other users: anyone who can read the key can forge
    /// entries, anyone who can write the directory can replace it.
    #[error(
        "{path}: mode {mode:o} is open to other users (the key must be readable by its owner only, the folders writable by their owner only)"
    )]
    Permissions {
        /// The file or directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The key file does not hold a key (truncated, or not made by ivory).
    #[error("{path}: not an ivory cache key ({len} bytes); delete it to start a new cache")]
    BadKey {
        /// The key file.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
}

/// Counters of one process's use of the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Entries found, opened and returned.
    pub hits: u64,
    /// Names with no usable entry.
    pub misses: u64,
    /// Entries that did not open (edited, moved, sealed by another key) or had expired; each
    /// was deleted.
    pub rejected: u64,
    /// Entries written.
    pub writes: u64,
    /// Entries deleted to stay under the size bound.
    pub evictions: u64,
    /// Reads or writes that failed (counted, never fatal).
    pub errors: u64,
}

/// A persistent, sealed, size-bounded [`SharedCache`] in a directory.
#[derive(Clone)]
pub struct DiskCache {
    inner: Arc<Inner>,
}

struct Inner {
    entries: PathBuf,
    keys: Keys,
    max_bytes: u64,
    /// What this process believes the entries take; recomputed from the files on eviction.
    total: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    rejected: AtomicU64,
    writes: AtomicU64,
    evictions: AtomicU64,
    errors: AtomicU64,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache")
            .field("entries", &self.inner.entries)
            .field("max_bytes", &self.inner.max_bytes)
            .finish_non_exhaustive()
    }
}

impl DiskCache {
    /// Opens (creating when missing) the cache in `dir`, keeping the entries under `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Self, DiskError> {
        private_dir(dir)?;
        let entries = dir.join(ENTRIES_DIR);
        private_dir(&entries)?;
        let key = read_or_create_key(&dir.join(KEY_FILE))?;
        let keys = Keys::new(&[(KEY_FILE.to_owned(), key)]).map_err(|_| DiskError::BadKey {
            path: dir.join(KEY_FILE),
            len: 0,
        })?;
        let total = scan(&entries).iter().map(|e| e.len).sum();
        Ok(Self {
            inner: Arc::new(Inner {
                entries,
                keys,
                max_bytes,
                total: AtomicU64::new(total),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
                rejected: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                evictions: AtomicU64::new(0),
                errors: AtomicU64::new(0),
            }),
        })
    }

    /// The default folder: `$XDG_CACHE_HOME/ivory`, else `$HOME/.cache/ivory`.
    pub fn default_dir() -> Option<PathBuf> {
        let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
        std::env::var_os("XDG_CACHE_HOME")
            .and_then(absolute)
            .or_else(|| {
                std::env::var_os("HOME")
                    .and_then(absolute)
                    .map(|h| h.join(".cache"))
            })
            .map(|base| base.join("ivory"))
    }

    /// This process's counters.
    pub fn stats(&self) -> DiskStats {
        let i = &self.inner;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DiskStats {
            hits: load(&i.hits),
            misses: load(&i.misses),
            rejected: load(&i.rejected),
            writes: load(&i.writes),
            evictions: load(&i.evictions),
            errors: load(&i.errors),
        }
    }

    /// Runs blocking file work off the async workers; a panic or a cancelled task is a miss.
    fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Inner) -> T + Send + 'static,
    ) -> BoxFuture<'static, Option<T>> {
        let inner = self.inner.clone();
        async move { tokio::task::spawn_blocking(move || work(&inner)).await.ok() }.boxed()
    }
}

impl SharedCache for DiskCache {
    fn get<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<Vec<u8>>> {
        let name = name.to_owned();
        self.blocking(move |inner| inner.get(&name))
            .map(Option::flatten)
            .boxed()
    }

    fn put<'a>(&'a self, name: &'a str, value: Vec<u8>, ttl: Duration) -> BoxFuture<'a, ()> {
        let name = name.to_owned();
        self.blocking(move |inner| inner.put(&name, &value, ttl))
            .map(|_| ())
            .boxed()
    }

    /// One process per cache: there is no fleet to coordinate with, so a miss loads alone.
    fn lookup<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Lookup> {
        self.get(name)
            .map(|found| found.map_or(Lookup::Alone, Lookup::Found))
            .boxed()
    }

    fn wait<'a>(&'a self, _name: &'a str, _until: Instant) -> BoxFuture<'a, Option<Vec<u8>>> {
        async { None }.boxed()
    }

    fn release<'a>(&'a self, _name: &'a str) -> BoxFuture<'a, ()> {
        async {}.boxed()
    }

    fn keyed_hash(&self, secret: &[u8]) -> [u8; 32] {
        self.inner.keys.keyed_hash(secret)
    }
}

impl Inner {
    /// File of `name`: names hold `:` and may be long, so the file is named by their SHA-256.
    fn path(&self, name: &str) -> PathBuf {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, name.as_bytes());
        self.entries.join(hex::encode(digest.as_ref()))
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self, name: &str) -> Option<Vec<u8>> {
        let path = self.path(name);
        let bytes = match read_bounded(&path, MAX_ENTRY_BYTES + SEAL_OVERHEAD) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                Self::count(&self.misses);
                return None;
            }
            Err(_) => {
                Self::count(&self.errors);
                Self::count(&self.misses);
                return None;
            }
        };
        match self.keys.open(name, &bytes, now_ms()) {
            Ok(value) => {
                Self::count(&self.hits);
                Some(value.to_vec())
            }
            Err(why) => {
                tracing::debug!(entry = %path.display(), ?why, "cache entry ignored and deleted");
                Self::count(&self.rejected);
                Self::count(&self.misses);
                self.remove(&path);
                None
            }
        }
    }

    fn put(&self, name: &str, value: &[u8], ttl: Duration) {
        if value.len() > MAX_ENTRY_BYTES {
            return;
        }
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let sealed = self.keys.seal(name, value, now_ms().saturating_add(ttl_ms));
        let path = self.path(name);
        let replaced = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        match write_atomically(&self.entries, &path, &sealed) {
            Ok(()) => {
                Self::count(&self.writes);
                let len = sealed.len() as u64;
                let before = self
                    .total
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                        Some(t.saturating_sub(replaced).saturating_add(len))
                    })
                    .unwrap_or(0);
                if before.saturating_sub(replaced).saturating_add(len) > self.max_bytes {
                    self.evict();
                }
            }
            Err(e) => {
                tracing::debug!(entry = %path.display(), error = %e, "cache entry not written");
                Self::count(&self.errors);
            }
        }
    }

    /// Deletes the oldest entries until at most three quarters of the bound is used, so a
    /// full cache does not scan its folder on every write.
    fn evict(&self) {
        let mut files = scan(&self.entries);
        files.sort_by_key(|f| f.modified);
        let mut total: u64 = files.iter().map(|f| f.len).sum();
        let target = self.max_bytes / 4 * 3;
        for file in files {
            if total <= target {
                break;
            }
            if fs::remove_file(&file.path).is_ok() {
                total = total.saturating_sub(file.len);
                Self::count(&self.evictions);
            }
        }
        self.total.store(total, Ordering::Relaxed);
    }

    fn remove(&self, path: &Path) {
        if let Ok(meta) = fs::metadata(path)
            && fs::remove_file(path).is_ok()
        {
            let len = meta.len();
            let _ = self
                .total
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                    Some(t.saturating_sub(len))
                });
        }
    }
}

/// Creates `dir` (0700) when missing; refuses one that other users may write (they could
/// replace the key). One they may only read is used: entries are not secret, the key is.
fn private_dir(dir: &Path) -> Result<(), DiskError> {
    let io = |source| DiskError::Io {
        path: dir.to_owned(),
        source,
    };
    match DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) => return Err(io(e)),
    }
    let mode = fs::metadata(dir).map_err(io)?.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(DiskError::Permissions {
            path: dir.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// The key in `path`, made (32 random bytes, 0600, never overwritten) when missing.
fn read_or_create_key(path: &Path) -> Result<Vec<u8>, DiskError> {
    let io = |source| DiskError::Io {
        path: path.to_owned(),
        source,
    };
    let mut key = vec![0u8; MIN_KEY_BYTES];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| io(std::io::Error::other("no system randomness")))?;
    // `create_new`: two first runs at once keep one key (the loser reads the winner's).
    let created = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match created {
        Ok(mut file) => {
            file.write_all(&key).map_err(io)?;
            file.sync_all().map_err(io)?;
            return Ok(key);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    let mode = fs::metadata(path).map_err(io)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(DiskError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }
    let bytes = read_bounded(path, MIN_KEY_BYTES + 1)
        .map_err(io)?
        .unwrap_or_default();
    if bytes.len() != MIN_KEY_BYTES {
        return Err(DiskError::BadKey {
            path: path.to_owned(),
            len: bytes.len(),
        });
    }
    Ok(bytes)
}

/// The file's bytes, `None` when it does not exist; an error when it is larger than `limit`
/// (read no further: a planted huge file costs nothing).
fn read_bounded(path: &Path, limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > limit {
        return Err(std::io::Error::other("larger than any entry"));
    }
    Ok(Some(bytes))
}

/// Writes `bytes` to a new temporary file in `dir` (0600) and renames it over `path`, so a
/// reader (another run) sees the old entry or the new one, never a part.
fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut suffix = [0u8; 8];
    SystemRandom::new()
        .fill(&mut suffix)
        .map_err(|_| std::io::Error::other("no system randomness"))?;
    let temp = dir.join(format!("{TEMP_PREFIX}{}", hex::encode(suffix)));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .and_then(|mut f| f.write_all(bytes));
    let renamed = written.and_then(|()| fs::rename(&temp, path));
    if renamed.is_err() {
        let _ = fs::remove_file(&temp);
    }
    renamed
}

struct EntryFile {
    path: PathBuf,
    len: u64,
    modified: SystemTime,
}

/// The entry files of `dir` (temporary files older than a minute count too, so a crashed
/// writer's leftovers are evicted like entries).
fn scan(dir: &Path) -> Vec<EntryFile> {
    let Ok(read) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let stale = ivory_clock::wall()
        .checked_sub(Duration::from_secs(60))
        .unwrap_or(UNIX_EPOCH);
    read.filter_map(Result::ok)
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            let modified = meta.modified().unwrap_or(UNIX_EPOCH);
            let temp = e.file_name().to_string_lossy().starts_with(TEMP_PREFIX);
            (meta.is_file() && (!temp || modified < stale)).then(|| EntryFile {
                path: e.path(),
                len: meta.len(),
                modified,
            })
        })
        .collect()
}

fn now_ms() -> u64 {
    ivory_clock::wall()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
