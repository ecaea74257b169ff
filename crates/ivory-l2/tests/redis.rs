//! The shared L2 against a real `redis-server` (ivory-testkit), and two verifiers ("replicas")
//! sharing it in front of a real Distribution registry, whose access log counts what each
//! replica asked.

// Test helpers outside #[test] fns: failing fast is the point.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use ivory_engine::verifier::{ImageVerifier, Verification, VerifyRequest};
use ivory_l2::{Keys, L2Config, RedisL2};
use ivory_policy::types::Attestor;
use ivory_registry::{Config, Registry};
use ivory_testkit::policy::key_attestor_json;
use ivory_testkit::{Harness, RedisServer, RegistryHarness};
use ivory_verify::{CosignVerifier, Lookup, SharedCache, VerifierConfig};
use redis::AsyncCommands as _;
use tokio::time::Instant;

const KEY_A: &[u8] = b"fleet-key-A-0123456789abcdef0123456789";
const KEY_B: &[u8] = b"fleet-key-B-0123456789abcdef0123456789";

fn keys(list: &[&[u8]]) -> Keys {
    let named: Vec<(String, Vec<u8>)> = list
        .iter()
        .enumerate()
        .map(|(i, k)| (format!("test key {i}"), k.to_vec()))
        .collect();
    Keys::new(&named).unwrap()
}

/// An L2 whose deadline leaves room for a busy test machine: these tests are about what is
/// shared, not about time (the paused-server test sets its own).
fn l2(server: &RedisServer, list: &[&[u8]]) -> Arc<RedisL2> {
    let mut config = L2Config::new(server.url(), keys(list));
    config.deadline = Duration::from_secs(2);
    Arc::new(RedisL2::new(config).unwrap())
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn later() -> Instant {
    ivory_clock::now() + Duration::from_secs(5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_round_trip_and_anything_not_sealed_for_its_name_is_ignored_and_counted() {
    let server = RedisServer::start().await.unwrap();
    let a = l2(&server, &[KEY_A]);
    a.put(
        "ivory:test:one",
        b"verified".to_vec(),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        a.get("ivory:test:one").await.as_deref(),
        Some(&b"verified"[..])
    );
    assert_eq!(a.get("ivory:test:absent").await, None);
    assert_eq!((a.stats().hits, a.stats().misses), (1, 1));

    let mut conn = raw(&server).await;
    let sealed: Vec<u8> = conn.get("ivory:test:one").await.unwrap();
    // Moved to another name (another digest or attestor): the HMAC binds the name.
    let _: () = conn.set("ivory:test:two", &sealed).await.unwrap();
    assert_eq!(a.get("ivory:test:two").await, None);
    // Modified in place.
    let mut flipped = sealed.clone();
    let at = flipped.len() - 40;
    flipped[at] ^= 1;
    let _: () = conn.set("ivory:test:one", &flipped).await.unwrap();
    assert_eq!(a.get("ivory:test:one").await, None);
    // Garbage, and a value far larger than an entry may be.
    let _: () = conn.set("ivory:test:three", "verified").await.unwrap();
    assert_eq!(a.get("ivory:test:three").await, None);
    let _: () = conn
        .set("ivory:test:big", vec![b'x'; 2 * 1024 * 1024])
        .await
        .unwrap();
    assert_eq!(a.get("ivory:test:big").await, None);
    // Sealed by a replica with another key.
    let stranger = l2(&server, &[KEY_B]);
    stranger
        .put(
            "ivory:test:four",
            b"verified".to_vec(),
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(a.get("ivory:test:four").await, None);
    assert_eq!(a.stats().rejected, 5, "{:?}", a.stats());
    assert_eq!(a.stats().errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotating_fleet_reads_entries_of_both_keys() {
    let server = RedisServer::start().await.unwrap();
    let (old, rotating, new) = (
        l2(&server, &[KEY_A]),
        l2(&server, &[KEY_B, KEY_A]),
        l2(&server, &[KEY_B]),
    );
    old.put("n:old", b"1".to_vec(), Duration::from_secs(60))
        .await;
    rotating
        .put("n:new", b"2".to_vec(), Duration::from_secs(60))
        .await;
    assert_eq!(rotating.get("n:old").await.as_deref(), Some(&b"1"[..]));
    assert_eq!(old.get("n:new").await, None);
    assert_eq!(new.get("n:new").await.as_deref(), Some(&b"2"[..]));
    assert_eq!(new.get("n:old").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_holds_the_lease_and_the_others_get_its_value() {
    let server = RedisServer::start().await.unwrap();
    let (a, b, c) = (
        l2(&server, &[KEY_A]),
        l2(&server, &[KEY_A]),
        l2(&server, &[KEY_A]),
    );
    assert_eq!(a.lookup("n").await, Lookup::Won);
    assert_eq!(b.lookup("n").await, Lookup::Held);
    assert_eq!(c.lookup("n").await, Lookup::Held);
    let waiter = {
        let b = Arc::clone(&b);
        tokio::spawn(async move { b.wait("n", later()).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    a.put("n", b"value".to_vec(), Duration::from_secs(60)).await;
    assert_eq!(waiter.await.unwrap().as_deref(), Some(&b"value"[..]));
    assert_eq!(b.stats().waits_answered, 1);
    // The put released the lease, and a lookup now finds the value.
    let mut conn = raw(&server).await;
    let lease: Option<String> = conn.get("n:lease").await.unwrap();
    assert_eq!(lease, None);
    assert_eq!(c.lookup("n").await, Lookup::Found(b"value".to_vec()));

    // A holder whose load failed releases the lease: waiters stop waiting and load themselves.
    assert_eq!(a.lookup("m").await, Lookup::Won);
    assert_eq!(b.lookup("m").await, Lookup::Held);
    a.release("m").await;
    assert_eq!(b.wait("m", later()).await, None);
    assert_eq!(c.lookup("m").await, Lookup::Won);
    // Only the holder's own token releases: b never held "m".
    b.release("m").await;
    assert_eq!(a.lookup("m").await, Lookup::Held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_or_stopped_redis_reads_as_empty_and_trips_the_breaker() {
    let mut server = RedisServer::start().await.unwrap();
    let mut config = L2Config::new(server.url(), keys(&[KEY_A]));
    config.deadline = Duration::from_millis(300);
    let a = RedisL2::new(config).unwrap();
    a.put("n", b"v".to_vec(), Duration::from_secs(60)).await;
    assert_eq!(a.get("n").await.as_deref(), Some(&b"v"[..]));

    server.pause().unwrap();
    assert_eq!(a.lookup("x").await, Lookup::Alone);
    assert_eq!(a.get("n").await, None);
    a.put("y", b"v".to_vec(), Duration::from_secs(60)).await;
    let paused = a.stats();
    assert_eq!(paused.errors, 1, "{paused:?}");
    assert_eq!(paused.skipped, 2, "{paused:?}");
    server.resume().unwrap();
    // The timed-out lookup ran when the server resumed and took the lease; the release written
    // behind it on the same connection freed it at once (not after the lease's 5 s).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut conn = raw(&server).await;
    let lease: Option<Vec<u8>> = conn.get("x:lease").await.unwrap();
    assert_eq!(lease, None);
    // Past the cool-down the store is asked again.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(a.get("n").await.as_deref(), Some(&b"v"[..]));

    server.stop();
    assert_eq!(a.get("n").await, None);
    assert!(a.stats().errors > paused.errors);
    server.restart().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    // Empty again after the restart, and usable: the connection came back by itself.
    let mut got = None;
    for _ in 0..20 {
        a.put("z", b"w".to_vec(), Duration::from_secs(60)).await;
        got = a.get("z").await;
        if got.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(got.as_deref(), Some(&b"w"[..]));
}

/// The cool-down is measured on tokio's clock ([`ivory_clock::now`]): with the clock paused, a
/// test moves through an hour-long cool-down by advancing the clock, not by sleeping.
#[tokio::test(start_paused = true)]
async fn the_breaker_cooldown_follows_a_paused_clock() {
    // Accepts connections (the kernel's backlog) and never answers: every call that reaches it
    // fails at its deadline, which the paused clock reaches as soon as the runtime is idle.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let mut config = L2Config::new(url, keys(&[KEY_A]));
    config.cooldown = Duration::from_secs(3600);
    let a = RedisL2::new(config).unwrap();
    // (clock advanced by, then (errors, skipped) after one more call, why)
    let steps = [
        (0, (1, 0), "the first call reaches the store"),
        (3599, (1, 1), "within the cool-down the call is skipped"),
        (1, (2, 1), "past the cool-down the store is asked again"),
    ];
    for (seconds, counts, why) in steps {
        tokio::time::advance(Duration::from_secs(seconds)).await;
        assert_eq!(a.get("n").await, None);
        let stats = a.stats();
        assert_eq!((stats.errors, stats.skipped), counts, "{why}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_password_and_database_are_used() {
    let server = RedisServer::start().await.unwrap();
    let mut conn = raw(&server).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("p@ss/word")
        .query_async(&mut conn)
        .await
        .unwrap();
    let url = |auth: &str| format!("redis://{auth}127.0.0.1:{}/2", server.port());
    let open = |url: String| {
        let mut config = L2Config::new(url, keys(&[KEY_A]));
        config.deadline = Duration::from_secs(2);
        RedisL2::new(config).unwrap()
    };
    let a = open(url(":p%40ss%2Fword@"));
    a.put("n", b"v".to_vec(), Duration::from_secs(60)).await;
    assert_eq!(a.get("n").await.as_deref(), Some(&b"v"[..]));
    assert_eq!(a.stats().errors, 0, "{:?}", a.stats());
    // The entry is in database 2, written by an authenticated client.
    let mut authed = redis::Client::open(format!(
        "redis://:p%40ss%2Fword@127.0.0.1:{}/2",
        server.port()
    ))
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .unwrap();
    let stored: Option<Vec<u8>> = authed.get("n").await.unwrap();
    assert!(stored.is_some());
    // A wrong password is a failed call, never an entry.
    let wrong = open(url(":nope@"));
    assert_eq!(wrong.get("n").await, None);
    assert_eq!(wrong.stats().errors, 1, "{:?}", wrong.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_the_server_closed_are_not_used() {
    let server = RedisServer::start().await.unwrap();
    let a = l2(&server, &[KEY_A]);
    a.put("n", b"v".to_vec(), Duration::from_secs(60)).await;
    let mut conn = raw(&server).await;
    // The server closes connections idle for a second (a common production setting).
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("timeout")
        .arg("1")
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(a.get("n").await.as_deref(), Some(&b"v"[..]));
    assert_eq!(a.stats().errors, 0, "{:?}", a.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_or_replayed_leases_cost_a_waiter_at_most_one_poll() {
    let server = RedisServer::start().await.unwrap();
    let (a, b) = (l2(&server, &[KEY_A]), l2(&server, &[KEY_A]));
    let mut conn = raw(&server).await;

    // Planted by someone with write access to Redis but not the key, with no expiry: nobody
    // waits for it, whether they see it at lookup or while waiting.
    let _: () = conn.set("n:lease", "planted").await.unwrap();
    let start = ivory_clock::now();
    assert_eq!(b.lookup("n").await, Lookup::Alone);
    let until = ivory_clock::now() + Duration::from_secs(10);
    assert_eq!(b.wait("n", until).await, None);
    let waited = start.elapsed();
    eprintln!("planted lease: lookup + wait returned in {waited:?} (budget 10 s)");
    assert!(waited < Duration::from_secs(1), "{waited:?}");
    assert_eq!(b.stats().leases_waited, 0);
    assert_eq!(b.stats().rejected, 2, "{:?}", b.stats());

    // A genuine lease copied to another name does not open there.
    assert_eq!(a.lookup("m").await, Lookup::Won);
    let genuine: Vec<u8> = conn.get("m:lease").await.unwrap();
    assert_eq!(b.lookup("m").await, Lookup::Held);
    let _: () = conn.set("o:lease", &genuine).await.unwrap();
    assert_eq!(b.lookup("o").await, Lookup::Alone);

    // A genuine lease replayed after its sealed expiry (with no expiry in Redis) is over.
    let mut config = L2Config::new(server.url(), keys(&[KEY_A]));
    config.deadline = Duration::from_secs(2);
    config.lease_ttl = Duration::from_millis(100);
    let short = RedisL2::new(config).unwrap();
    assert_eq!(short.lookup("p").await, Lookup::Won);
    let old: Vec<u8> = conn.get("p:lease").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _: () = conn.set("p:lease", &old).await.unwrap();
    let start = ivory_clock::now();
    assert_eq!(b.lookup("p").await, Lookup::Alone);
    assert_eq!(
        b.wait("p", ivory_clock::now() + Duration::from_secs(10))
            .await,
        None
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );

    // A live lease is waited for, but never longer than a lease lives: its holder is gone.
    assert_eq!(short.lookup("q").await, Lookup::Won);
    let start = ivory_clock::now();
    assert_eq!(
        short
            .wait("q", ivory_clock::now() + Duration::from_secs(10))
            .await,
        None
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_reaches_a_tls_redis_server_whose_certificate_is_from_the_given_ca() {
    let server = RedisServer::start_tls().await.unwrap();
    let url = server.tls_url().unwrap();
    let ca = server.ca_pem().unwrap().as_bytes().to_vec();
    let mut config = L2Config::new(url.clone(), keys(&[KEY_A]));
    config.deadline = Duration::from_secs(2);
    config.ca_pem = Some(ca);
    let a = RedisL2::new(config).unwrap();
    assert!(a.connect(Duration::from_secs(2)).await);
    a.put("n", b"over tls".to_vec(), Duration::from_secs(60))
        .await;
    assert_eq!(a.get("n").await.as_deref(), Some(&b"over tls"[..]));
    assert_eq!(a.lookup("m").await, Lookup::Won);
    assert_eq!(a.stats().errors, 0, "{:?}", a.stats());
    // The same data is there for a plain client: it went to this server.
    let mut conn = raw(&server).await;
    let lease: Option<Vec<u8>> = conn.get("m:lease").await.unwrap();
    assert!(lease.is_some());

    // Without the CA the server's certificate is not trusted: nothing is sent or read.
    let mut config = L2Config::new(url, keys(&[KEY_A]));
    config.deadline = Duration::from_secs(2);
    let untrusted = RedisL2::new(config).unwrap();
    assert!(!untrusted.connect(Duration::from_secs(2)).await);
    assert_eq!(untrusted.get("n").await, None);
    assert_eq!(untrusted.stats().errors, 1, "{:?}", untrusted.stats());
}

/// The key attestor of the fixture P-256 key.
fn attestor() -> Attestor {
    let pem = std::fs::read_to_string(ivory_testkit::fixtures_dir().join("keys/cosign-p256.pub"))
        .unwrap();
    serde_json::from_value(key_attestor_json(&pem)).unwrap()
}

fn replica(h: &Harness, l2: Arc<RedisL2>) -> CosignVerifier {
    let config = Config {
        ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
        ..Config::default()
    };
    CosignVerifier::with_shared_cache(
        Registry::new(config).unwrap(),
        VerifierConfig::default(),
        CosignVerifier::anonymous_credentials(),
        Some(l2),
    )
}

async fn push(h: &Harness, layout: &str) -> String {
    let repo = format!("ivory/{layout}");
    h.push_oci_layout(
        &ivory_testkit::fixtures_dir().join("oci/ivory").join(layout),
        &repo,
    )
    .await
    .unwrap();
    format!("{}/{repo}:v1", h.host())
}

async fn verify(v: &CosignVerifier, image: &str) -> Verification {
    let request = VerifyRequest {
        image: ivory_engine::verifier::ImageReference::parse(image).unwrap(),
        attestor: attestor(),
        attestation: None,
        credentials: None,
        platforms: Default::default(),
    };
    v.verify(&request, later()).await.unwrap()
}

/// Registry requests other than the one-time `/v2/` probe of a new client.
fn registry_requests(h: &Harness) -> Vec<String> {
    h.requests()
        .into_iter()
        .map(|(method, path, _)| format!("{method} {path}"))
        .filter(|r| !r.ends_with(" /v2/"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_verdicts_and_tags_and_redis_alone_cannot_verify_an_image() {
    let h = RegistryHarness::start_default().await.unwrap();
    let server = RedisServer::start().await.unwrap();
    let signed = push(&h, "sig-p256").await;
    let unsigned = push(&h, "unsigned").await;
    let first = replica(&h, l2(&server, &[KEY_A]));
    h.reset_requests();
    assert!(verify(&first, &signed).await.is_verified());
    assert!(!verify(&first, &unsigned).await.is_verified());
    assert!(!registry_requests(&h).is_empty());

    // A second replica (fresh in-process caches) answers both from the L2: tag and verdict.
    h.reset_requests();
    let second_l2 = l2(&server, &[KEY_A]);
    let second = replica(&h, Arc::clone(&second_l2));
    assert!(verify(&second, &signed).await.is_verified());
    assert!(!verify(&second, &unsigned).await.is_verified());
    assert_eq!(registry_requests(&h), Vec::<String>::new());
    // Tag and verdict of each image.
    assert_eq!(second_l2.stats().hits, 4, "{:?}", second_l2.stats());

    // Someone with write access to Redis but not the key copies the signed image's verdict
    // entries over the unsigned image's ones: a third replica ignores them, counts them, and
    // still says "not verified" from the registry.
    let mut conn = raw(&server).await;
    let names: Vec<String> = conn.keys("ivory:v2:verdict:*").await.unwrap();
    assert_eq!(names.len(), 2, "{names:?}");
    let mut entries = Vec::new();
    for n in &names {
        let bytes: Vec<u8> = conn.get(n).await.unwrap();
        entries.push(bytes);
    }
    let verified_at = entries
        .iter()
        .position(|e| {
            e.windows(8).any(|w| w == b"verified") && !e.windows(12).any(|w| w == b"not_verified")
        })
        .unwrap();
    let other = 1 - verified_at;
    let _: () = conn
        .set(&names[other], &entries[verified_at])
        .await
        .unwrap();
    let third_l2 = l2(&server, &[KEY_A]);
    let third = replica(&h, Arc::clone(&third_l2));
    assert!(verify(&third, &signed).await.is_verified());
    assert!(!verify(&third, &unsigned).await.is_verified());
    assert_eq!(third_l2.stats().rejected, 1, "{:?}", third_l2.stats());

    // No credential and no raw reference appears in a name.
    let all: Vec<String> = conn.keys("*").await.unwrap();
    assert!(all.iter().all(|n| n.starts_with("ivory:v2:")), "{all:?}");
    assert!(all.iter().all(|n| !n.contains("ivory/")), "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_on_three_replicas_cost_one_registry_request_set() {
    let h = RegistryHarness::start_default().await.unwrap();
    let server = RedisServer::start().await.unwrap();
    let signed = push(&h, "sig-p256").await;
    // The cost of one cold verification, on a replica of its own.
    let bare = {
        let config = Config {
            ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
            ..Config::default()
        };
        CosignVerifier::new(
            Registry::new(config).unwrap(),
            VerifierConfig::default(),
            CosignVerifier::anonymous_credentials(),
        )
    };
    h.reset_requests();
    assert!(verify(&bare, &signed).await.is_verified());
    let one_set = registry_requests(&h);
    assert!(!one_set.is_empty());

    let replicas: Vec<(CosignVerifier, Arc<RedisL2>)> = (0..3)
        .map(|_| {
            let shared = l2(&server, &[KEY_A]);
            (replica(&h, Arc::clone(&shared)), shared)
        })
        .collect();
    // Each replica's registry client says hello (`/v2/`) once; not part of the set.
    h.reset_requests();
    let mut tasks = Vec::new();
    for (v, _) in &replicas {
        for _ in 0..32 {
            let (v, image) = (v.clone(), signed.clone());
            tasks.push(tokio::spawn(async move { verify(&v, &image).await }));
        }
    }
    for t in tasks {
        assert!(t.await.unwrap().is_verified());
    }
    assert_eq!(registry_requests(&h), one_set);
    let won: u64 = replicas.iter().map(|(_, l)| l.stats().leases_won).sum();
    let waited: u64 = replicas.iter().map(|(_, l)| l.stats().leases_waited).sum();
    // One lease for the tag and one for the verdict; whoever did not win waited or read.
    assert_eq!(won, 2);
    assert!(waited <= 4);
}
