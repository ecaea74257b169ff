use std::fs;
use std::os::unix::fs::PermissionsExt as _;

use super::*;

const NAME: &str = "ivory:v2:verdict:0123";
const OTHER: &str = "ivory:v2:verdict:4567";
const HOUR: Duration = Duration::from_secs(3600);

fn open(dir: &Path) -> DiskCache {
    DiskCache::open(dir, DEFAULT_MAX_BYTES).unwrap_or_else(|e| panic!("{e}"))
}

fn entry_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir.join(ENTRIES_DIR))
        .map(|r| r.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
}

#[tokio::test]
async fn entries_survive_the_process_and_only_their_own_name_opens_them() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    assert_eq!(cache.get(NAME).await, None);
    cache.put(NAME, b"verified".to_vec(), HOUR).await;
    drop(cache);
    // Another process: same folder, same key.
    let cache = open(dir.path());
    assert_eq!(cache.get(NAME).await.as_deref(), Some(&b"verified"[..]));
    assert_eq!(
        cache.lookup(NAME).await,
        Lookup::Found(b"verified".to_vec())
    );
    assert_eq!(cache.lookup(OTHER).await, Lookup::Alone);
    // An entry copied by hand to another name's file does not open there, and is deleted.
    let files = entry_files(dir.path());
    assert_eq!(files.len(), 1);
    let other = cache.inner.path(OTHER);
    fs::copy(&files[0], &other).unwrap();
    assert_eq!(cache.get(OTHER).await, None);
    assert!(!other.exists());
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.rejected), (2, 1), "{stats:?}");
    // The key is the same after a reopen, so names built with it (tags) are too.
    assert_eq!(
        open(dir.path()).keyed_hash(b"creds"),
        cache.keyed_hash(b"creds")
    );
    let elsewhere = tempfile::tempdir().unwrap();
    assert_ne!(
        open(elsewhere.path()).keyed_hash(b"creds"),
        cache.keyed_hash(b"creds")
    );
}

#[tokio::test]
async fn an_entry_edited_by_hand_is_ignored_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    cache
        .put(NAME, br#"{"verdict":"not_verified"}"#.to_vec(), HOUR)
        .await;
    let file = cache.inner.path(NAME);
    let mut bytes = fs::read(&file).unwrap();
    // Turn the sealed value into a positive verdict of the same length.
    let at = bytes
        .windows(3)
        .position(|w| w == b"not")
        .expect("value in the file");
    bytes[at..at + 3].copy_from_slice(b"yes");
    fs::write(&file, &bytes).unwrap();
    assert_eq!(cache.get(NAME).await, None);
    assert!(!file.exists(), "a rejected entry is deleted");
    // So is one sealed with another key (a cache folder copied from another user).
    let foreign = tempfile::tempdir().unwrap();
    let theirs = open(foreign.path());
    theirs.put(NAME, b"verified".to_vec(), HOUR).await;
    fs::copy(theirs.inner.path(NAME), &file).unwrap();
    assert_eq!(cache.get(NAME).await, None);
    assert_eq!(cache.stats().rejected, 2);
}

#[tokio::test]
async fn entries_expire_with_their_sealed_lifetime() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    cache
        .put(NAME, b"sha256:aaaa".to_vec(), Duration::from_millis(30))
        .await;
    assert!(cache.get(NAME).await.is_some());
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(cache.get(NAME).await, None);
    assert!(entry_files(dir.path()).is_empty());
}

#[tokio::test]
async fn the_folder_stays_under_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let value = vec![b'x'; 1000];
    let bound = 10 * (value.len() + SEAL_OVERHEAD) as u64;
    let cache = DiskCache::open(dir.path(), bound).unwrap();
    for i in 0..50 {
        cache.put(&format!("name-{i}"), value.clone(), HOUR).await;
        let total: u64 = entry_files(dir.path())
            .iter()
            .map(|p| fs::metadata(p).map(|m| m.len()).unwrap_or(0))
            .sum();
        assert!(total <= bound, "{total} > {bound} after {i}");
    }
    assert!(cache.stats().evictions >= 40, "{:?}", cache.stats());
    // The newest entry is kept.
    assert!(cache.get("name-49").await.is_some());
    // Values larger than any entry are not written at all.
    cache.put(OTHER, vec![0; MAX_ENTRY_BYTES + 1], HOUR).await;
    assert!(!cache.inner.path(OTHER).exists());
}

#[tokio::test]
async fn a_planted_huge_file_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let file = fs::File::create(cache.inner.path(NAME)).unwrap();
    file.set_len(64 * 1024 * 1024).unwrap();
    assert_eq!(cache.get(NAME).await, None);
    assert_eq!(cache.stats().errors, 1);
}

#[test]
fn a_key_or_folder_open_to_others_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("ivory");
    drop(open(&cache_dir));
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cache_dir), 0o700);
    assert_eq!(mode(&cache_dir.join(KEY_FILE)), 0o600);
    let key = cache_dir.join(KEY_FILE);
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    let err = DiskCache::open(&cache_dir, DEFAULT_MAX_BYTES).unwrap_err();
    assert!(
        matches!(err, DiskError::Permissions { mode: 0o644, .. }),
        "{err}"
    );
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(&cache_dir, fs::Permissions::from_mode(0o777)).unwrap();
    let err = DiskCache::open(&cache_dir, DEFAULT_MAX_BYTES).unwrap_err();
    assert!(
        matches!(err, DiskError::Permissions { mode: 0o777, .. }),
        "{err}"
    );
    fs::set_permissions(&cache_dir, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(&key, b"short").unwrap();
    let err = DiskCache::open(&cache_dir, DEFAULT_MAX_BYTES).unwrap_err();
    assert!(matches!(err, DiskError::BadKey { len: 5, .. }), "{err}");
}

#[test]
fn a_linked_folder_key_or_entries_folder_is_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    drop(open(&real));
    // The folder itself a link (to a folder that would otherwise be trusted).
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let err = DiskCache::open(&link, DEFAULT_MAX_BYTES).unwrap_err();
    assert!(matches!(err, DiskError::NotPlain { .. }), "{err}");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    // The key a link to another cache's key.
    let other = dir.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::set_permissions(&other, fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(real.join(KEY_FILE), other.join(KEY_FILE)).unwrap();
    let err = DiskCache::open(&other, DEFAULT_MAX_BYTES).unwrap_err();
    assert!(matches!(err, DiskError::NotPlain { .. }), "{err}");
    // The entries folder a link.
    fs::remove_file(other.join(KEY_FILE)).unwrap();
    fs::remove_dir(other.join(ENTRIES_DIR)).unwrap();
    std::os::unix::fs::symlink(real.join(ENTRIES_DIR), other.join(ENTRIES_DIR)).unwrap();
    let err = DiskCache::open(&other, DEFAULT_MAX_BYTES).unwrap_err();
    assert!(matches!(err, DiskError::NotPlain { .. }), "{err}");
}

#[tokio::test]
async fn an_entry_that_is_a_link_or_a_fifo_is_a_miss_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cache = open(dir.path());
    let secret = dir.path().join("elsewhere");
    fs::write(&secret, b"not an entry").unwrap();
    std::os::unix::fs::symlink(&secret, cache.inner.path(NAME)).unwrap();
    assert_eq!(cache.get(NAME).await, None);
    let status = std::process::Command::new("mkfifo")
        .arg(cache.inner.path(OTHER))
        .status()
        .unwrap();
    assert!(status.success());
    // Would block forever without O_NONBLOCK: no writer ever opens the FIFO.
    let got = tokio::time::timeout(Duration::from_secs(20), cache.get(OTHER)).await;
    assert_eq!(got, Ok(None));
    assert_eq!(cache.stats().errors, 2, "{:?}", cache.stats());
    // A write replaces the link itself, never its target.
    cache.put(NAME, b"verified".to_vec(), HOUR).await;
    assert_eq!(fs::read(&secret).unwrap(), b"not an entry");
    assert_eq!(cache.get(NAME).await.as_deref(), Some(&b"verified"[..]));
}

/// A uid that no account on this machine has (the test's "other user").
fn unused_uid() -> u32 {
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    let used: Vec<u32> = passwd
        .lines()
        .filter_map(|l| l.split(':').nth(2)?.parse().ok())
        .collect();
    (40_000..60_000).find(|u| !used.contains(u)).unwrap()
}

#[test]
fn a_folder_or_key_of_another_user_is_refused() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: giving files to another user needs root (CI runs as root)");
        return;
    }
    let other = unused_uid();
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("ivory");
    drop(open(&cache_dir));
    let chown = |p: &Path| std::os::unix::fs::chown(p, Some(other), Some(other)).unwrap();
    let unchown = |p: &Path| std::os::unix::fs::chown(p, Some(0), Some(0)).unwrap();
    for (what, path) in [
        ("folder", cache_dir.clone()),
        ("entries", cache_dir.join(ENTRIES_DIR)),
        ("key", cache_dir.join(KEY_FILE)),
    ] {
        chown(&path);
        let err = DiskCache::open(&cache_dir, DEFAULT_MAX_BYTES).unwrap_err();
        assert!(
            matches!(&err, DiskError::Owner { owner, me: 0, path: p } if *owner == other && *p == path),
            "{what}: {err}"
        );
        unchown(&path);
    }
    drop(open(&cache_dir));
    // Group-writable folders are refused too (the group could replace the key).
    let entries = cache_dir.join(ENTRIES_DIR);
    fs::set_permissions(&entries, fs::Permissions::from_mode(0o770)).unwrap();
    let err = DiskCache::open(&cache_dir, DEFAULT_MAX_BYTES).unwrap_err();
    assert!(
        matches!(err, DiskError::Permissions { mode: 0o770, .. }),
        "{err}"
    );
}
