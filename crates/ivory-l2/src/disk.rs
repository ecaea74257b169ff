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
//! * **Owned**: the folder, its `entries` folder and the key are trusted only when owned by
//!   the user running ivory (or root) and writable by no one else (the key: readable by no
//!   one else). Each is opened once without following a symbolic link and checked on the
//!   opened handle; every later file operation is relative to that handle, so a path swapped
//!   after the check changes nothing. Otherwise the command runs without the cache and says
//!   so: root running `ivory verify --cache-dir` on a folder another user owns would else take
//!   that user's forged verdicts.
//! * **Bounded**: entries larger than [`MAX_ENTRY_BYTES`] are neither written nor read, and
//!   when the files pass `max_bytes` in total the oldest (by modification time) are deleted
//!   until a quarter of the bound is free again.
//! * **Never a dependency**: every failure (unreadable file, full disk) reads as "not cached"
//!   and is counted; the command then asks the registry as it would without a cache.
//!   Concurrent runs are safe: entries are written to a temporary file and renamed.

use std::ffi::{CStr, CString};
use std::fs::{DirBuilder, File};
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::{SecureRandom as _, SystemRandom};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use ivory_verify::{Lookup, SharedCache};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
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
    /// The folder or the key belongs to another user (not the one running ivory, not root):
    /// they could have sealed any verdict with it.
    #[error(
        "{path}: owned by uid {owner}, not by the user running ivory (uid {me}) or root: another user could have forged its entries"
    )]
    Owner {
        /// The file or directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The user running ivory (effective uid).
        me: u32,
    },
    /// The folder or the key is a symbolic link or not the kind of file expected: never
    /// followed, as its target could be anyone's.
    #[error("{path}: {what}")]
    NotPlain {
        /// The file or directory.
        path: PathBuf,
        /// What it is instead.
        what: &'static str,
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
    /// The `entries` folder, for messages.
    entries: PathBuf,
    /// The `entries` folder as opened and checked: every entry is named relative to it.
    entries_dir: OwnedFd,
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
    /// The folder, its `entries` folder and its key must be owned by the user running ivory
    /// (or root), writable by no one else and no symbolic link (see the module's doc).
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Self, DiskError> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| DiskError::Io {
                path: dir.to_owned(),
                source,
            })?;
        let top = private_dir(rustix::fs::CWD, dir, dir)?;
        let entries = dir.join(ENTRIES_DIR);
        match rustix::fs::mkdirat(&top, ENTRIES_DIR, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(io_error(&entries, e)),
        }
        let entries_dir = private_dir(&top, Path::new(ENTRIES_DIR), &entries)?;
        let key_path = dir.join(KEY_FILE);
        let key = read_or_create_key(&top, &key_path)?;
        let keys = Keys::new(&[(KEY_FILE.to_owned(), key)]).map_err(|_| DiskError::BadKey {
            path: key_path,
            len: 0,
        })?;
        let total = scan(&entries_dir).iter().map(|e| e.len).sum();
        Ok(Self {
            inner: Arc::new(Inner {
                entries,
                entries_dir,
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
    /// File name of `name` in the entries folder: names hold `:` and may be long, so the
    /// file is named by their SHA-256.
    fn file_name(name: &str) -> String {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, name.as_bytes());
        hex::encode(digest.as_ref())
    }

    /// Path of `name`'s file, for messages (and tests).
    fn path(&self, name: &str) -> PathBuf {
        self.entries.join(Self::file_name(name))
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self, name: &str) -> Option<Vec<u8>> {
        let file = Self::file_name(name);
        let bytes = match read_entry(&self.entries_dir, &file, MAX_ENTRY_BYTES + SEAL_OVERHEAD) {
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
                tracing::debug!(entry = %self.path(name).display(), ?why, "cache entry ignored and deleted");
                Self::count(&self.rejected);
                Self::count(&self.misses);
                self.remove(&file);
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
        let file = Self::file_name(name);
        let replaced = entry_len(&self.entries_dir, &file).unwrap_or(0);
        match write_atomically(&self.entries_dir, &file, &sealed) {
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
                tracing::debug!(entry = %self.path(name).display(), error = %e, "cache entry not written");
                Self::count(&self.errors);
            }
        }
    }

    /// Deletes the oldest entries until at most three quarters of the bound is used, so a
    /// full cache does not scan its folder on every write.
    fn evict(&self) {
        let mut files = scan(&self.entries_dir);
        files.sort_by_key(|f| f.modified);
        let mut total: u64 = files.iter().map(|f| f.len).sum();
        let target = self.max_bytes / 4 * 3;
        for file in files {
            if total <= target {
                break;
            }
            if rustix::fs::unlinkat(&self.entries_dir, file.name.as_c_str(), AtFlags::empty())
                .is_ok()
            {
                total = total.saturating_sub(file.len);
                Self::count(&self.evictions);
            }
        }
        self.total.store(total, Ordering::Relaxed);
    }

    fn remove(&self, file: &str) {
        if let Some(len) = entry_len(&self.entries_dir, file)
            && rustix::fs::unlinkat(&self.entries_dir, file, AtFlags::empty()).is_ok()
        {
            let _ = self
                .total
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                    Some(t.saturating_sub(len))
                });
        }
    }
}

fn io_error(path: &Path, errno: rustix::io::Errno) -> DiskError {
    DiskError::Io {
        path: path.to_owned(),
        source: errno.into(),
    }
}

/// The effective uid: whose files may feed the cache (besides root's).
fn me() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Refuses a file other users could have written: owned by someone else than the user
/// running ivory or root, or with any of the `forbidden` permission bits.
fn check_owner(stat: &Stat, path: &Path, forbidden: u32) -> Result<(), DiskError> {
    let me = me();
    if stat.st_uid != me && stat.st_uid != 0 {
        return Err(DiskError::Owner {
            path: path.to_owned(),
            owner: stat.st_uid,
            me,
        });
    }
    let mode = stat.st_mode & 0o7777;
    if mode & forbidden != 0 {
        return Err(DiskError::Permissions {
            path: path.to_owned(),
            mode: mode & 0o777,
        });
    }
    Ok(())
}

/// Why `name` (in `at`) did not open without following a link: a symbolic link, or not the
/// kind of file expected, refused by name; any other failure as it came.
fn not_followed(
    at: impl AsFd,
    name: impl rustix::path::Arg,
    path: &Path,
    errno: rustix::io::Errno,
) -> DiskError {
    use rustix::io::Errno;
    if !matches!(errno, Errno::LOOP | Errno::NOTDIR) {
        return io_error(path, errno);
    }
    let link = rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink);
    DiskError::NotPlain {
        path: path.to_owned(),
        what: if link {
            "a symbolic link (not followed: its target could be anyone's)"
        } else {
            "not a folder"
        },
    }
}

/// Opens the folder `name` (relative to `at`) without following a link, and checks the
/// opened handle: owned by the user or root, writable by no one else. Readable by others
/// is allowed: entries are not secret, the key is.
fn private_dir(at: impl AsFd, name: &Path, path: &Path) -> Result<OwnedFd, DiskError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir = rustix::fs::openat(at.as_fd(), name, flags, Mode::empty())
        .map_err(|e| not_followed(at.as_fd(), name, path, e))?;
    let stat = rustix::fs::fstat(&dir).map_err(|e| io_error(path, e))?;
    check_owner(&stat, path, 0o022)?;
    Ok(dir)
}

/// The key in `dir` (32 random bytes, 0600, never overwritten), made when missing; an
/// existing one must be a plain file of the user or root that no one else can read or write.
fn read_or_create_key(dir: &OwnedFd, path: &Path) -> Result<Vec<u8>, DiskError> {
    let io = |source| DiskError::Io {
        path: path.to_owned(),
        source,
    };
    let mut key = vec![0u8; MIN_KEY_BYTES];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| io(std::io::Error::other("no system randomness")))?;
    // O_EXCL: two first runs at once keep one key (the loser reads the winner's), and a
    // planted link is never written through.
    let create =
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, KEY_FILE, create, Mode::from_raw_mode(0o600)) {
        Ok(fd) => {
            let mut file = File::from(fd);
            file.write_all(&key).map_err(io)?;
            file.sync_all().map_err(io)?;
            return Ok(key);
        }
        Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(io_error(path, e)),
    }
    let fd = open_plain(dir, KEY_FILE).map_err(|e| not_followed(dir, KEY_FILE, path, e))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| io_error(path, e))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(DiskError::NotPlain {
            path: path.to_owned(),
            what: "not a regular file",
        });
    }
    check_owner(&stat, path, 0o077)?;
    let bytes = read_limited(File::from(fd), MIN_KEY_BYTES + 1).map_err(io)?;
    if bytes.len() != MIN_KEY_BYTES {
        return Err(DiskError::BadKey {
            path: path.to_owned(),
            len: bytes.len(),
        });
    }
    Ok(bytes)
}

/// Opens `name` in `dir` for reading: never through a link, never waiting (a FIFO opens at
/// once and is then refused as not a regular file).
fn open_plain(dir: &OwnedFd, name: impl rustix::path::Arg) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    rustix::fs::openat(dir, name, flags, Mode::empty())
}

/// At most `limit` bytes of `file`; an error when it holds more (read no further: a planted
/// huge file costs nothing).
fn read_limited(file: File, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > limit {
        return Err(std::io::Error::other("larger than any entry"));
    }
    Ok(bytes)
}

/// The entry file `name`'s bytes, `None` when it does not exist; an error when it is not a
/// regular file or is larger than `limit`.
fn read_entry(dir: &OwnedFd, name: &str, limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    let fd = match open_plain(dir, name) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let stat = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(std::io::Error::other("not a regular file"));
    }
    read_limited(File::from(fd), limit).map(Some)
}

/// Size of the entry file `name`, if there is one (a link is not followed).
fn entry_len(dir: &OwnedFd, name: &str) -> Option<u64> {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .ok()
        .map(|s| u64::try_from(s.st_size).unwrap_or(0))
}

/// Writes `bytes` to a new temporary file in `dir` (0600, created: never through a link) and
/// renames it over `name`, so a reader (another run) sees the old entry or the new one,
/// never a part.
fn write_atomically(dir: &OwnedFd, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let mut suffix = [0u8; 8];
    SystemRandom::new()
        .fill(&mut suffix)
        .map_err(|_| std::io::Error::other("no system randomness"))?;
    let temp = format!("{TEMP_PREFIX}{}", hex::encode(suffix));
    let create =
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, temp.as_str(), create, Mode::from_raw_mode(0o600))?;
    let written = File::from(fd).write_all(bytes);
    let renamed = written.and_then(|()| {
        rustix::fs::renameat(dir, temp.as_str(), dir, name).map_err(std::io::Error::from)
    });
    if renamed.is_err() {
        let _ = rustix::fs::unlinkat(dir, temp.as_str(), AtFlags::empty());
    }
    renamed
}

struct EntryFile {
    name: CString,
    len: u64,
    modified: SystemTime,
}

/// The entry files of `dir` (temporary files older than a minute count too, so a crashed
/// writer's leftovers are evicted like entries).
fn scan(dir: &OwnedFd) -> Vec<EntryFile> {
    let Ok(read) = rustix::fs::Dir::read_from(dir) else {
        return Vec::new();
    };
    let stale = ivory_clock::wall()
        .checked_sub(Duration::from_secs(60))
        .unwrap_or(UNIX_EPOCH);
    read.filter_map(Result::ok)
        .filter_map(|e| {
            let name: &CStr = e.file_name();
            let stat = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
            let modified = modified(&stat);
            let temp = name.to_bytes().starts_with(TEMP_PREFIX.as_bytes());
            let regular = FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile;
            (regular && (!temp || modified < stale)).then(|| EntryFile {
                name: name.to_owned(),
                len: u64::try_from(stat.st_size).unwrap_or(0),
                modified,
            })
        })
        .collect()
}

/// A file's modification time (the epoch when before it).
fn modified(stat: &Stat) -> SystemTime {
    let secs = u64::try_from(stat.st_mtime).unwrap_or(0);
    let nanos = u32::try_from(stat.st_mtime_nsec)
        .unwrap_or(0)
        .min(999_999_999);
    UNIX_EPOCH + Duration::new(secs, nanos)
}

fn now_ms() -> u64 {
    ivory_clock::wall()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
