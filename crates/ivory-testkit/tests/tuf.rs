//! `fixtures/tuf/` is valid TUF as a Sigstore client reads it, and [`TufMirror`] serves it as a
//! mirror would: sigstore-tuf's `Updater` (the client ivory uses) refreshes through the mirror
//! from `root-1.json`, follows the root chain 1→2, and refuses each broken state with the
//! error that names its fault.

#![allow(clippy::unwrap_used)] // a test: a panic is the report

use std::time::Duration;

use ivory_testkit::{TUF_STATES, TufMirror, fixtures_dir, tuf_fixtures_dir};
use serde_json::Value;
use sigstore_tuf::transport::FetchFuture;
use sigstore_tuf::{Error, FileStore, Repository, Updater};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const TARGET: &str = "trusted_root.json";

/// The client side of the test: HTTP GETs through reqwest, 404 as "not there", bounded reads.
struct MirrorRepository {
    base: String,
    client: reqwest::Client,
}

impl MirrorRepository {
    fn new(mirror: &TufMirror) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        Self {
            base: mirror.url(),
            client,
        }
    }

    async fn get(&self, url: String, max_length: u64) -> sigstore_tuf::Result<Option<Vec<u8>>> {
        let response = self
            .client
            .get(&url)
            .send()
            .await
            .map_err(|e| Error::transport_with_source(format!("GET {url}"), e))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(Error::transport(format!(
                "GET {url}: {}",
                response.status()
            )));
        }
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Error::transport_with_source(format!("reading {url}"), e))?;
        if bytes.len() as u64 > max_length {
            return Err(Error::transport(format!("{url}: over {max_length} bytes")));
        }
        Ok(Some(bytes.to_vec()))
    }
}

impl Repository for MirrorRepository {
    fn fetch_metadata<'a>(&'a self, name: &'a str, max_length: u64) -> FetchFuture<'a> {
        Box::pin(self.get(format!("{}/{name}", self.base), max_length))
    }

    fn fetch_target<'a>(&'a self, path: &'a str, max_length: u64) -> FetchFuture<'a> {
        Box::pin(self.get(format!("{}/targets/{path}", self.base), max_length))
    }
}

fn now() -> jiff::Timestamp {
    jiff::Timestamp::try_from(ivory_clock::wall()).unwrap()
}

fn root_1() -> Vec<u8> {
    std::fs::read(tuf_fixtures_dir().join("root-1.json")).unwrap()
}

fn updater(mirror: &TufMirror) -> Updater {
    Updater::new(MirrorRepository::new(mirror), &root_1()).unwrap()
}

/// `fixtures/keyless/trusted_root.json`, byte for byte: state 2's target.
fn full_trusted_root() -> Vec<u8> {
    std::fs::read(fixtures_dir().join("keyless/trusted_root.json")).unwrap()
}

/// State 1's target: the same document without its transparency logs.
fn trusted_root_without_tlogs() -> Value {
    let mut doc: Value = serde_json::from_slice(&full_trusted_root()).unwrap();
    let removed = doc.as_object_mut().unwrap().remove("tlogs");
    assert!(
        removed.is_some(),
        "the keyless trusted root names a Rekor log"
    );
    doc
}

fn consistent_target_path(content: &[u8]) -> String {
    use sha2::Digest as _;
    format!(
        "/targets/{}.{TARGET}",
        hex::encode(sha2::Sha256::digest(content))
    )
}

/// An updater that refreshed against state 2 (root v2, full trusted root downloaded).
async fn updater_at_state_2(mirror: &TufMirror) -> Updater {
    mirror.switch("state-2").unwrap();
    let mut client = updater(mirror);
    client.refresh(now()).await.unwrap();
    assert_eq!(client.trusted().root().version, 2);
    assert_eq!(
        client.get_target(TARGET, now()).await.unwrap(),
        full_trusted_root()
    );
    client
}

#[tokio::test]
async fn a_client_moves_from_state_1_to_state_2_by_the_root_chain() {
    let mirror = TufMirror::start("state-1").await.unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut client = updater(&mirror).with_store(FileStore::new(cache.path()));

    client.refresh(now()).await.unwrap();
    assert_eq!(client.trusted().root().version, 1);
    let first_bytes = client.get_target(TARGET, now()).await.unwrap();
    let first: Value = serde_json::from_slice(&first_bytes).unwrap();
    assert_eq!(first, trusted_root_without_tlogs());
    // The chain ended where the mirror said 404; the target came by its hash-prefixed name.
    assert_eq!(mirror.requests("/2.root.json"), 1);
    assert_eq!(
        mirror.requests(&consistent_target_path(&first_bytes)),
        1,
        "{:?}",
        mirror.request_counts()
    );

    // Same URL, same updater: the next refresh sees state 2.
    mirror.switch("state-2").unwrap();
    mirror.reset_requests();
    client.refresh(now()).await.unwrap();
    assert_eq!(client.trusted().root().version, 2);
    assert_eq!(client.trusted().timestamp().unwrap().version, 2);
    let second = client.get_target(TARGET, now()).await.unwrap();
    assert_eq!(second, full_trusted_root());
    assert_eq!(mirror.requests("/2.root.json"), 1);
    assert_eq!(mirror.requests("/3.root.json"), 1);
    assert_eq!(mirror.requests("/timestamp.json"), 1);
    assert_eq!(mirror.requests("/2.snapshot.json"), 1);
    assert_eq!(mirror.requests("/2.targets.json"), 1);
    assert_eq!(
        mirror.requests(&consistent_target_path(&full_trusted_root())),
        1
    );

    // A refresh with nothing new fetches the timestamp and the next root probe only.
    mirror.reset_requests();
    client.refresh(now()).await.unwrap();
    assert_eq!(mirror.total_requests(), 2, "{:?}", mirror.request_counts());
}

#[tokio::test]
async fn state_2_is_reached_from_root_1_in_one_refresh() {
    let mirror = TufMirror::start("state-2").await.unwrap();
    updater_at_state_2(&mirror).await;
    assert_eq!(mirror.requests("/1.snapshot.json"), 0);
}

#[tokio::test]
async fn an_expired_timestamp_is_refused_as_expired() {
    let mirror = TufMirror::start("state-2").await.unwrap();
    let mut client = updater_at_state_2(&mirror).await;
    mirror.switch("expired").unwrap();
    let after_state_2 = client.refresh(now()).await.unwrap_err();
    assert!(
        matches!(&after_state_2, Error::Expired { role, .. } if role == "timestamp"),
        "{after_state_2:?}"
    );

    let fresh = updater(&mirror).refresh(now()).await.unwrap_err();
    assert!(
        matches!(&fresh, Error::Expired { role, expires } if role == "timestamp" && expires.to_string() == "2020-01-01T00:00:00Z"),
        "{fresh:?}"
    );
}

#[tokio::test]
async fn lower_versions_signed_by_the_current_keys_are_refused_as_a_rollback() {
    let mirror = TufMirror::start("state-2").await.unwrap();
    let mut client = updater_at_state_2(&mirror).await;
    mirror.switch("rollback").unwrap();
    let err = client.refresh(now()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Rollback { role, trusted: 2, new: 1 } if role == "timestamp"),
        "{err:?}"
    );

    // What was rolled back is otherwise valid: a client that never saw state 2 takes it.
    let mut fresh = updater(&mirror);
    fresh.refresh(now()).await.unwrap();
    assert_eq!(fresh.trusted().root().version, 2);
    assert_eq!(fresh.trusted().timestamp().unwrap().version, 1);
    let target: Value =
        serde_json::from_slice(&fresh.get_target(TARGET, now()).await.unwrap()).unwrap();
    assert_eq!(target, trusted_root_without_tlogs());
}

#[tokio::test]
async fn the_rollback_floor_survives_a_restart_through_the_file_store() {
    let mirror = TufMirror::start("state-2").await.unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut first = updater(&mirror).with_store(FileStore::new(cache.path()));
    first.refresh(now()).await.unwrap();
    drop(first);

    mirror.switch("rollback").unwrap();
    let mut restarted = updater(&mirror).with_store(FileStore::new(cache.path()));
    assert_eq!(
        restarted.trusted().root().version,
        2,
        "root v2 from the cache"
    );
    let err = restarted.refresh(now()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Rollback { role, trusted: 2, new: 1 } if role == "timestamp"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_changed_target_is_refused_by_its_hash() {
    let mirror = TufMirror::start("tampered").await.unwrap();
    let served = std::fs::read(
        tuf_fixtures_dir()
            .join("tampered")
            .join(consistent_target_path(&full_trusted_root()).trim_start_matches('/')),
    )
    .unwrap();
    assert_eq!(
        served.len(),
        full_trusted_root().len(),
        "only the hash can tell"
    );
    assert_ne!(served, full_trusted_root());

    let mut client = updater(&mirror);
    client.refresh(now()).await.unwrap();
    let err = client.get_target(TARGET, now()).await.unwrap_err();
    assert!(
        matches!(&err, Error::IntegrityMismatch(detail) if detail == "trusted_root.json: sha256 mismatch"),
        "{err:?}"
    );
}

#[tokio::test]
async fn every_state_is_served() {
    for state in TUF_STATES {
        assert!(tuf_fixtures_dir().join(state).is_dir(), "{state}");
    }
    let mirror = TufMirror::start("state-1").await.unwrap();
    assert!(mirror.switch("no-such-state").is_err());
    assert!(mirror.switch("../tuf").is_err());
    assert_eq!(mirror.state(), "state-1");
}

#[tokio::test]
async fn down_refuses_connections_and_up_answers_on_the_same_url() {
    let mut mirror = TufMirror::start("state-1").await.unwrap();
    let url = format!("{}/timestamp.json", mirror.url());
    let client = reqwest::Client::new();
    assert!(client.get(&url).send().await.unwrap().status().is_success());

    mirror.down().await;
    assert!(!mirror.is_up());
    let refused = tokio::net::TcpStream::connect(mirror.addr())
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    // A pooled keep-alive connection was closed too: the request cannot reach the mirror.
    assert!(client.get(&url).send().await.is_err());

    mirror.up().await.unwrap();
    assert_eq!(format!("{}/timestamp.json", mirror.url()), url);
    assert!(client.get(&url).send().await.unwrap().status().is_success());
    assert_eq!(mirror.requests("/timestamp.json"), 2);
}

#[tokio::test]
async fn a_hanging_mirror_takes_requests_and_never_answers() {
    let mirror = TufMirror::start("state-1").await.unwrap();
    mirror.hang();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let err = client
        .get(format!("{}/timestamp.json", mirror.url()))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(mirror.requests("/timestamp.json"), 1);

    // The updater's refresh is stuck the same way: only the client's deadline ends it.
    let mut tuf = updater(&mirror);
    let stuck = tokio::time::timeout(Duration::from_millis(300), tuf.refresh(now())).await;
    assert!(
        stuck.is_err(),
        "a refresh finished against a hanging mirror"
    );

    mirror.resume();
    let answered = client
        .get(format!("{}/timestamp.json", mirror.url()))
        .send()
        .await
        .unwrap();
    assert!(answered.status().is_success());
}

/// Sends `path` verbatim (reqwest would normalise `..` away) and returns the status line.
async fn raw_get(mirror: &TufMirror, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(mirror.addr()).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.lines().next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn paths_outside_the_state_directory_are_refused() {
    let mirror = TufMirror::start("state-1").await.unwrap();
    assert_eq!(raw_get(&mirror, "/1.root.json").await, "HTTP/1.1 200 OK");
    for outside in [
        "/../root-1.json",
        "/targets/../../state-2/2.root.json",
        "/%2e%2e/root-1.json",
        "/./1.root.json",
    ] {
        assert_eq!(
            raw_get(&mirror, outside).await,
            "HTTP/1.1 400 Bad Request",
            "{outside}"
        );
    }
    assert_eq!(
        raw_get(&mirror, "/2.root.json").await,
        "HTTP/1.1 404 Not Found"
    );
}
