//! Trust sources against real TUF repositories (python-tuf built, `fixtures/tuf/`, served on
//! loopback by `ivory_testkit::TufMirror`) and real files.

use std::time::Duration;

use ivory_registry::{Config as RegistryConfig, Registry};
use ivory_testkit::{TufMirror, tuf_fixtures_dir};

use super::*;

fn registry() -> Registry {
    Registry::new(RegistryConfig::default()).expect("registry client")
}

fn anchor() -> Vec<u8> {
    std::fs::read(tuf_fixtures_dir().join("root-1.json")).expect("root-1.json")
}

/// The `trusted_root.json` a state serves: the target its newest targets metadata pins.
fn served(state: &str) -> String {
    let dir = tuf_fixtures_dir().join(state);
    let newest = (1..)
        .map(|n| dir.join(format!("{n}.targets.json")))
        .take_while(|p| p.exists())
        .last()
        .expect("targets metadata");
    let targets: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(newest).expect("read")).expect("json");
    let hash = targets["signed"]["targets"]["trusted_root.json"]["hashes"]["sha256"]
        .as_str()
        .expect("pinned hash");
    std::fs::read_to_string(dir.join(format!("targets/{hash}.trusted_root.json"))).expect("target")
}

fn tlogs(root: &RootState) -> usize {
    let json: serde_json::Value = serde_json::from_str(&root.json).expect("json");
    json["tlogs"].as_array().map_or(0, Vec::len)
}

fn config() -> RefreshConfig {
    RefreshConfig {
        fetch_timeout: Duration::from_secs(2),
        refresh_timeout: Duration::from_secs(5),
    }
}

fn tuf(mirror: &TufMirror, cache_dir: Option<PathBuf>) -> TrustRoots {
    let source = TrustSource::Tuf(TufSource {
        mirror: mirror.url(),
        root: anchor(),
        cache_dir,
    });
    TrustRoots::new(source, &registry(), config()).expect("a TUF source")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tuf_source_follows_rotations_and_keeps_its_root_through_every_refused_state() {
    let mirror = TufMirror::start("state-1").await.expect("mirror");
    let roots = tuf(&mirror, None);
    // Before the first refresh: the embedded root.
    assert_eq!(roots.current().origin, "embedded");
    assert!(roots.refresh().await.expect("state 1"), "changed");
    let first = roots.current();
    assert_eq!(first.origin, format!("TUF {}", mirror.url()));
    assert_eq!(tlogs(&first), 0, "state 1's root lists no transparency log");
    assert!(!first.public_good);
    let generation = roots.generation();
    // Nothing new: no change, no new generation.
    assert!(!roots.refresh().await.expect("state 1 again"));
    assert_eq!(roots.generation(), generation);

    // Root keys rotated (v1 -> v2) and a log added: the same client moves on.
    mirror.switch("state-2").expect("state 2");
    assert!(roots.refresh().await.expect("state 2"));
    let second = roots.current();
    assert!(
        tlogs(&second) > 0,
        "state 2's root knows the mock Rekor log"
    );
    assert_eq!(roots.generation(), generation + 1);

    // Expired timestamp, then a rollback: refused, the state-2 root kept, each failure counted.
    for (state, why) in [("expired", "expired"), ("rollback", "rollback")] {
        mirror.switch(state).expect(state);
        let err = roots.refresh().await.expect_err(state).to_string();
        assert!(err.contains(why), "{state}: {err}");
        assert_eq!(roots.current().hash, second.hash, "{state}");
    }
    let stats = roots.stats();
    assert_eq!((stats.succeeded, stats.failed), (3, 2));
    assert!(stats.last_error.is_some_and(|e| e.contains("rollback")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_target_is_refused_and_nothing_is_applied() {
    let mirror = TufMirror::start("tampered").await.expect("mirror");
    let roots = tuf(&mirror, None);
    let err = roots.refresh().await.expect_err("tampered").to_string();
    assert!(err.contains("sha256 mismatch"), "{err}");
    assert_eq!(roots.current().origin, "embedded");
    assert_eq!(roots.generation(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_the_mirror_down_serves_the_last_root_the_cache_proves() {
    let mut mirror = TufMirror::start("state-2").await.expect("mirror");
    let cache = tempfile::tempdir().expect("cache");
    let roots = tuf(&mirror, Some(cache.path().to_owned()));
    assert!(roots.refresh().await.expect("state 2"));
    let fetched = roots.current();
    mirror.down().await;

    // A new process: the cache proves state 2 again from the anchor, with no request.
    let restarted = tuf(&mirror, Some(cache.path().to_owned()));
    assert!(restarted.load_cached().await);
    assert_eq!(restarted.current().hash, fetched.hash);
    let err = restarted.refresh().await.expect_err("the mirror is down");
    assert!(err.to_string().contains("TUF"), "{err}");
    assert_eq!(restarted.current().hash, fetched.hash, "kept");

    // No cache: the embedded root.
    let bare = tuf(&mirror, None);
    assert!(!bare.load_cached().await);
    assert!(bare.refresh().await.is_err());
    assert_eq!(bare.current().origin, "embedded");

    // A cache whose files were edited proves nothing: the embedded root stays.
    let edited = tempfile::tempdir().expect("cache");
    for entry in std::fs::read_dir(cache.path()).expect("cache files") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            let name = path.file_name().expect("name");
            std::fs::copy(&path, edited.path().join(name)).expect("copy");
        }
    }
    let timestamp = edited.path().join("timestamp.json");
    let text = std::fs::read_to_string(&timestamp).expect("timestamp");
    std::fs::write(&timestamp, text.replacen("\"version\"", "\"version \"", 1)).expect("edit");
    let forged = tuf(&mirror, Some(edited.path().to_owned()));
    assert!(!forged.load_cached().await);
    assert_eq!(forged.current().origin, "embedded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_that_never_answers_ends_the_refresh_at_its_deadline() {
    let mirror = TufMirror::start("state-1").await.expect("mirror");
    mirror.hang();
    let roots = tuf(&mirror, None);
    let started = ivory_clock::now();
    let err = roots.refresh().await.expect_err("no answer");
    assert!(
        (ivory_clock::now() - started) < Duration::from_secs(8),
        "{:?}",
        (ivory_clock::now() - started)
    );
    assert!(err.to_string().contains("TUF"), "{err}");
    assert_eq!(roots.current().origin, "embedded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_source_is_read_again_on_refresh_and_a_bad_file_keeps_the_root() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("trusted_root.json");
    std::fs::write(&path, served("state-1")).expect("write");
    let roots = TrustRoots::new(TrustSource::File(path.clone()), &registry(), config())
        .expect("a file source");
    assert_eq!(roots.current().origin, format!("file {}", path.display()));
    assert_eq!(tlogs(&roots.current()), 0);
    std::fs::write(&path, served("state-2")).expect("write");
    assert!(roots.refresh().await.expect("changed file"));
    assert!(tlogs(&roots.current()) > 0);
    let good = roots.current().hash;
    std::fs::write(&path, "{\"not\": \"a trusted root\"}").expect("write");
    let err = roots.refresh().await.expect_err("bad file").to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert_eq!(roots.current().hash, good);
    // A file that cannot be used at start is an error naming it.
    let missing = dir.path().join("missing.json");
    let err = TrustRoots::new(TrustSource::File(missing.clone()), &registry(), config())
        .expect_err("missing")
        .to_string();
    assert!(err.contains(&missing.display().to_string()), "{err}");
}

#[test]
fn the_root_in_force_describes_its_source_and_age() {
    let embedded = RootState::embedded();
    assert_eq!(embedded.describe(), "embedded, built into this ivory");
    let at = std::time::UNIX_EPOCH + Duration::from_secs(1_765_000_000);
    let fetched = RootState::new("{}", "TUF http://127.0.0.1:1".into(), Some(at), false);
    assert_eq!(
        fetched.describe(),
        "TUF http://127.0.0.1:1, updated 2025-12-06T05:46:40Z"
    );
}

fn attestor_tuf(
    mirror: &TufMirror,
    root: ivory_policy::types::TufRoot,
) -> ivory_policy::types::Tuf {
    ivory_policy::types::Tuf {
        mirror: Some(mirror.url()),
        root: Some(root),
    }
}

/// An attestor's own repository (`cosign.tuf`, Kyverno's fields): its root given as base64
/// data, a file or a URL; unknown at first (never a verdict), then followed in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attestors_tuf_repository_is_followed_from_data_a_file_or_a_url() {
    use base64::Engine as _;
    let mirror = TufMirror::start("state-2").await.expect("mirror");
    let sources = TufSources::new(registry(), config(), Duration::from_secs(3600), None);
    let anchor_file = tuf_fixtures_dir().join("root-1.json");
    let roots = [
        ivory_policy::types::TufRoot {
            data: Some(base64::engine::general_purpose::STANDARD.encode(anchor())),
            path: None,
        },
        ivory_policy::types::TufRoot {
            data: None,
            path: Some(anchor_file.display().to_string()),
        },
        // state 2 serves its chain's first root as 1.root.json.
        ivory_policy::types::TufRoot {
            data: None,
            path: Some(format!("{}/1.root.json", mirror.url())),
        },
    ];
    for root in roots {
        let tuf = attestor_tuf(&mirror, root.clone());
        let before = sources.generation();
        match sources.root(&tuf) {
            Err(Pending::NotYet(why)) => assert!(why.contains("not fetched yet"), "{why}"),
            other => panic!("{root:?}: expected not fetched yet, got {other:?}"),
        }
        sources
            .settle(&tuf, ivory_clock::deadline_in(Duration::from_secs(10)))
            .await;
        let state = sources
            .root(&tuf)
            .unwrap_or_else(|e| panic!("{root:?}: {e:?}"));
        assert!(tlogs(&state) > 0, "{root:?}");
        assert_eq!(state.origin, format!("TUF {}", mirror.url()));
        assert!(sources.generation() > before, "{root:?}");
    }
    // Root data that is not base64 is the attestor's error, not a pending fetch.
    let bad = attestor_tuf(
        &mirror,
        ivory_policy::types::TufRoot {
            data: Some("not base64!".into()),
            path: None,
        },
    );
    assert!(matches!(sources.root(&bad), Err(Pending::Invalid(_))));
    // Without a root, the public-good anchor (Kyverno's default too): this mirror's metadata is
    // not signed by its keys, so every fetch fails, and the answer says why.
    let stranger = ivory_policy::types::Tuf {
        mirror: Some(mirror.url()),
        root: None,
    };
    assert!(matches!(sources.root(&stranger), Err(Pending::NotYet(_))));
    sources
        .settle(&stranger, ivory_clock::deadline_in(Duration::from_secs(10)))
        .await;
    match sources.root(&stranger) {
        Err(Pending::NotYet(why)) => assert!(why.contains("threshold"), "{why}"),
        other => panic!("expected a refused chain, got {other:?}"),
    }
}

/// Makes a planted file at a path.
type Plant = dyn Fn(&Path);

/// Whoever can write the cache folder can plant a link to `/dev/zero`, a FIFO or a huge file
/// where metadata should be: refused without reading past the cap or waiting for a writer, and
/// the root in force stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_cache_files_are_refused_without_hanging_or_reading_them_whole() {
    let mut mirror = TufMirror::start("state-2").await.expect("mirror");
    let cache = tempfile::tempdir().expect("cache");
    assert!(
        tuf(&mirror, Some(cache.path().to_owned()))
            .refresh()
            .await
            .expect("state 2")
    );
    mirror.down().await;
    let timestamp = cache.path().join("timestamp.json");
    let plant: [(&str, &Plant); 3] = [
        ("a link to /dev/zero", &|p| {
            std::os::unix::fs::symlink("/dev/zero", p).expect("symlink")
        }),
        ("a FIFO", &|p| {
            let status = std::process::Command::new("mkfifo")
                .arg(p)
                .status()
                .expect("mkfifo");
            assert!(status.success());
        }),
        ("a huge sparse file", &|p| {
            std::fs::File::create(p)
                .and_then(|f| f.set_len(1 << 34))
                .expect("sparse file")
        }),
    ];
    for (what, make) in plant {
        std::fs::remove_file(&timestamp).expect("remove");
        make(&timestamp);
        let restarted = tuf(&mirror, Some(cache.path().to_owned()));
        let started = ivory_clock::now();
        let proved = tokio::time::timeout(Duration::from_secs(10), restarted.load_cached())
            .await
            .unwrap_or_else(|_| panic!("{what}: the cache read hung"));
        assert!(!proved, "{what}");
        assert!(
            ivory_clock::now() - started < Duration::from_secs(5),
            "{what}"
        );
        assert_eq!(restarted.current().origin, "embedded", "{what}");
    }
}
