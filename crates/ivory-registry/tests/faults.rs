//! Registries that hang, refuse, throttle, fail, or serve bad manifests: every call ends
//! in a definite result or a named error before its deadline.

use std::time::Duration;

use ivory_registry::{Config, Credentials, Error, Platform, Registry};
use ivory_testkit::{FaultOptions, FaultServer, HungRegistry, refused_host};

use crate::util::ok_deadline;
use crate::util::reference;

/// Slack allowed past a deadline before we call it a hang.
const SLACK: Duration = Duration::from_millis(500);

fn insecure() -> Credentials {
    Credentials::anonymous().allow_insecure(true)
}

fn amd64() -> Platform {
    Platform {
        os: "linux".into(),
        architecture: "amd64".into(),
        variant: None,
    }
}

#[tokio::test]
async fn hung_registry_ends_in_deadline_exceeded_on_time() {
    let hung = HungRegistry::start().await.unwrap();
    let r = Registry::new(Config::default()).unwrap();
    let budget = Duration::from_millis(800);
    for op in ["resolve", "manifest", "blob"] {
        let started = ivory_clock::now();
        let deadline = started + budget;
        let image = format!("{}/app:v1", hung.host());
        let err = match op {
            "resolve" => r
                .resolve_digest(&reference(&image), &Credentials::anonymous(), deadline)
                .await
                .err(),
            "manifest" => r
                .fetch_manifest(&reference(&image), &Credentials::anonymous(), deadline)
                .await
                .err(),
            _ => r
                .fetch_blob(
                    &reference(&format!("{}/app", hung.host())),
                    &format!("sha256:{}", "1".repeat(64)),
                    100,
                    &Credentials::anonymous(),
                    deadline,
                )
                .await
                .err(),
        }
        .unwrap();
        let elapsed = started.elapsed();
        assert!(matches!(err, Error::DeadlineExceeded { .. }), "{op}: {err}");
        assert!(err.is_transient());
        assert!(elapsed >= budget, "{op}: gave up early after {elapsed:?}");
        assert!(elapsed < budget + SLACK, "{op}: took {elapsed:?}");
        assert!(err.to_string().contains(&hung.host()), "{err}");
    }
}

/// Building an HTTPS client loads root certificates, which is slow (figures in
/// BENCHMARKS.md). Concurrent cold calls must neither each build one nor build it on the async
/// workers: built inline, 48 cold calls kept a 2-worker runtime busy for seconds and every
/// call missed its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cold_calls_keep_their_deadline() {
    let hung = HungRegistry::start().await.unwrap();
    let r = Registry::new(Config::default()).unwrap();
    let budget = Duration::from_secs(1);
    let started = ivory_clock::now();
    let deadline = started + budget;
    let image = format!("{}/app:v1", hung.host());
    let calls: Vec<_> = (0..48)
        .map(|i| {
            let (r, image) = (r.clone(), image.clone());
            // Half share one credential set (one client, built once), half bring their own
            // (one client each, built off the async workers).
            let creds = if i % 2 == 0 {
                Credentials::anonymous()
            } else {
                Credentials::anonymous().with_basic(&hung.host(), &format!("u{i}"), "p")
            };
            tokio::spawn(async move {
                let err = r
                    .resolve_digest(&reference(&image), &creds, deadline)
                    .await
                    .unwrap_err();
                (err, ivory_clock::now())
            })
        })
        .collect();
    let mut worst = Duration::ZERO;
    for c in calls {
        let (err, done) = c.await.unwrap();
        assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err}");
        worst = worst.max(done.saturating_duration_since(deadline));
    }
    eprintln!("48 concurrent cold calls: worst {worst:?} after the deadline");
    // Slack for a loaded 2-core machine running other tests; building clients inline put the
    // worst answer 500 ms or more past the deadline.
    assert!(
        worst < Duration::from_millis(350),
        "answered {worst:?} after the deadline"
    );
}

/// A fresh Registry's first call pays for building its client inside the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_client_build_respects_the_deadline() {
    let hung = HungRegistry::start().await.unwrap();
    let r = Registry::new(Config::default()).unwrap();
    let budget = Duration::from_millis(200);
    let started = ivory_clock::now();
    let err = r
        .resolve_digest(
            &reference(&format!("{}/app:v1", hung.host())),
            &Credentials::anonymous(),
            started + budget,
        )
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err}");
    assert!(
        elapsed < budget + Duration::from_millis(150),
        "took {elapsed:?}"
    );
}

#[tokio::test]
async fn a_host_that_does_not_resolve_is_named_a_dns_failure_by_type() {
    // `.invalid` never resolves (RFC 6761); the failure comes from ivory's resolver.
    let r = Registry::new(Config::default()).unwrap();
    let err = r
        .resolve_digest(
            &reference("registry.ivory-test.invalid/app:v1"),
            &Credentials::anonymous(),
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Transport {
                cause: ivory_registry::TransportCause::DnsLookupFailed,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.summary(),
        "cannot reach registry.ivory-test.invalid (DNS lookup failed)"
    );
}

#[tokio::test]
async fn refused_connection_is_a_transient_transport_error() {
    let host = refused_host().unwrap();
    let r = Registry::new(Config::default()).unwrap();
    let err = r
        .resolve_digest(
            &reference(&format!("{host}/app:v1")),
            &Credentials::anonymous(),
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Transport {
                cause: ivory_registry::TransportCause::ConnectionRefused,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_transient());
}

#[tokio::test]
async fn concurrency_cap_queues_calls_per_registry() {
    let hung = HungRegistry::start().await.unwrap();
    let r = Registry::new(Config {
        per_registry_concurrency: std::num::NonZeroUsize::MIN,
        ..Config::default()
    })
    .unwrap();
    // Long enough for the first client build on a loaded machine, so one call does get a permit.
    let deadline = ivory_clock::now() + Duration::from_secs(2);
    let image = format!("{}/app:v1", hung.host());
    let creds = Credentials::anonymous();
    let image = reference(&image);
    let (a, b) = tokio::join!(
        r.resolve_digest(&image, &creds, deadline),
        r.resolve_digest(&image, &creds, deadline)
    );
    assert!(matches!(a, Err(Error::DeadlineExceeded { .. })));
    assert!(matches!(b, Err(Error::DeadlineExceeded { .. })));
    let stats = r.stats();
    assert_eq!(stats[0].requests, 1, "the second call never got a permit");
    assert_eq!(stats[0].errors, 2);
}

#[tokio::test]
async fn throttling_is_retried_then_succeeds() {
    let f = FaultServer::start(FaultOptions {
        throttle_count: 2,
        ..FaultOptions::default()
    })
    .await
    .unwrap();
    let r = Registry::new(Config::default()).unwrap();
    let d = r
        .resolve_digest(
            &reference(&format!("{}/throttled:latest", f.host())),
            &insecure(),
            ok_deadline(),
        )
        .await
        .unwrap();
    assert_eq!(Some(d.as_str()), f.digest("good"));
    let statuses: Vec<u16> = f
        .requests()
        .into_iter()
        .filter(|(_, p, _)| p.contains("/manifests/"))
        .map(|(_, _, s)| s)
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&200));
    let stats = r.stats();
    assert!(stats[0].throttled >= 1, "{stats:?}");
}

#[tokio::test]
async fn persistent_503_gives_up_before_the_deadline() {
    let f = FaultServer::start(FaultOptions::default()).await.unwrap();
    let r = Registry::new(Config::default()).unwrap();
    let budget = Duration::from_millis(1500);
    let started = ivory_clock::now();
    let err = r
        .resolve_digest(
            &reference(&format!("{}/unavailable:latest", f.host())),
            &insecure(),
            started + budget,
        )
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(
        matches!(err, Error::Throttled { status: 503, attempts, .. } if attempts > 1),
        "{err}"
    );
    assert!(err.is_transient());
    assert!(elapsed < budget + SLACK, "took {elapsed:?}");
}

#[tokio::test]
async fn oversized_manifests_and_blobs_are_refused() {
    let f = FaultServer::start(FaultOptions::default()).await.unwrap();
    let r = Registry::new(Config::default()).unwrap();
    let err = r
        .fetch_manifest(
            &reference(&format!("{}/big:latest", f.host())),
            &insecure(),
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                what: "manifest",
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.is_transient());

    let blob = f.digest("bigblob-config").unwrap().to_string();
    let err = r
        .fetch_blob(
            &reference(&format!("{}/bigblob", f.host())),
            &blob,
            1 << 20,
            &insecure(),
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { what: "blob", .. }), "{err}");
    let ok = r
        .fetch_blob(
            &reference(&format!("{}/bigblob", f.host())),
            &blob,
            4 << 20,
            &insecure(),
            ok_deadline(),
        )
        .await
        .unwrap();
    assert_eq!(ok.len(), 2 * 1024 * 1024);
}

#[tokio::test]
async fn self_referencing_and_deep_indexes_end_in_errors() {
    let f = FaultServer::start(FaultOptions::default()).await.unwrap();
    let r = Registry::new(Config::default()).unwrap();
    let started = ivory_clock::now();
    let err = r
        .fetch_platform_manifest(
            &reference(&format!("{}/loop:latest", f.host())),
            &amd64(),
            &insecure(),
            ok_deadline(),
        )
        .await
        .unwrap_err();
    // The child "is" the index itself, which its content cannot hash to.
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let err = r
        .fetch_platform_manifest(
            &reference(&format!("{}/deep:latest", f.host())),
            &amd64(),
            &insecure(),
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidManifest { .. }), "{err}");
    assert!(err.to_string().contains("nesting deeper"), "{err}");
}

#[tokio::test]
async fn digest_header_lies_and_omissions() {
    let f = FaultServer::start(FaultOptions::default()).await.unwrap();
    let r = Registry::new(Config::default()).unwrap();
    let good = f.digest("good").unwrap().to_string();

    // No Docker-Content-Digest: HEAD, then GET and hash the body.
    let d = r
        .resolve_digest(
            &reference(&format!("{}/nodigest:latest", f.host())),
            &insecure(),
            ok_deadline(),
        )
        .await
        .unwrap();
    assert_eq!(d, good);
    let calls: Vec<String> = f
        .requests()
        .into_iter()
        .filter(|(_, p, _)| p.contains("nodigest"))
        .map(|(m, _, _)| m)
        .collect();
    assert_eq!(calls, vec!["HEAD", "GET"]);

    // A false header is caught when the body is read.
    let err = r
        .fetch_manifest(
            &reference(&format!("{}/wrongdigest:latest", f.host())),
            &insecure(),
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
}

#[tokio::test]
async fn unknown_media_types_and_garbage_are_invalid_manifests() {
    let f = FaultServer::start(FaultOptions::default()).await.unwrap();
    let r = Registry::new(Config::default()).unwrap();
    for repo in ["unknowntype", "malformed"] {
        let err = r
            .fetch_manifest(
                &reference(&format!("{}/{repo}:latest", f.host())),
                &insecure(),
                ok_deadline(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidManifest { .. }),
            "{repo}: {err}"
        );
        assert!(!err.is_transient());
    }
}
