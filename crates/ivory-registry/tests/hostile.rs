//! Registries that attack their client: endless bodies, bodies meant for the user's eyes,
//! redirects that collect credentials, plain-HTTP token realms, forged digests.

use std::time::Duration;

use ivory_registry::{Config, Credentials, DigestProblem, Error, Registry};
use ivory_testkit::{
    AuthMode, CaptureServer, HOSTILE_SECRET, HarnessOptions, HostileAuth, HostileOptions,
    HostileServer, RegistryHarness,
};

use crate::util::reference;
use crate::util::{client_for, ok_deadline, push_simple};

fn insecure() -> Credentials {
    Credentials::anonymous().allow_insecure(true)
}

async fn hostile(auth: HostileAuth) -> HostileServer {
    HostileServer::start(HostileOptions {
        auth,
        ..HostileOptions::default()
    })
    .await
    .unwrap()
}

/// Neither the message nor the debug form carries registry text.
fn assert_no_registry_text(err: &Error) {
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(HOSTILE_SECRET), "{shown}");
    assert!(!shown.contains("xxxx"), "{shown}");
}

#[tokio::test]
async fn endless_and_huge_answers_are_cut_at_their_limit() {
    let h = hostile(HostileAuth::Open).await;
    let r = Registry::new(Config::default()).unwrap();
    let c = insecure();
    let started = ivory_clock::now();
    for image in ["endless:latest", "hugelength:latest"] {
        let image = format!("{}/{image}", h.host());
        let err = r
            .fetch_manifest(&reference(&image), &c, ok_deadline())
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::TooLarge { what: "manifest", limit, .. } if limit == 4 << 20),
            "{image}: {err}"
        );
        assert!(!err.is_transient());
        assert_no_registry_text(&err);
    }
    // No digest header on HEAD: resolving reads the body, under the same cap.
    let err = r
        .resolve_digest(
            &reference(&format!("{}/endless:v1", h.host())),
            &c,
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

    let subject = format!("{}/endless@{}", h.host(), h.good_digest());
    let err = r
        .referrers(&reference(&subject), None, &c, ok_deadline())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                what: "referrers index",
                ..
            }
        ),
        "{err}"
    );

    let err = r
        .list_tags(&format!("{}/endless", h.host()), &c, ok_deadline())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                what: "listing page",
                ..
            }
        ),
        "{err}"
    );

    let err = r
        .fetch_blob(
            &reference(&format!("{}/endless", h.host())),
            &h.good_digest(),
            1 << 20,
            &c,
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::TooLarge { what: "blob", limit, .. } if limit == 1 << 20),
        "{err}"
    );
    // Each read stopped at its cap instead of running into the deadline.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn manifests_that_would_balloon_once_parsed_are_refused() {
    let h = hostile(HostileAuth::Open).await;
    let r = Registry::new(Config::default()).unwrap();
    let err = r
        .fetch_manifest(
            &reference(&format!("{}/objects:latest", h.host())),
            &insecure(),
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidManifest { .. }), "{err}");
    assert!(err.to_string().contains("JSON values"), "{err}");
}

#[tokio::test]
async fn an_endless_token_answer_is_cut() {
    let h = hostile(HostileAuth::EndlessToken).await;
    let r = Registry::new(Config::default()).unwrap();
    let err = r
        .resolve_digest(
            &reference(&format!("{}/good:latest", h.host())),
            &insecure(),
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                what: "token answer",
                ..
            }
        ),
        "{err}"
    );
    assert!(h.requests().iter().any(|q| q.path == "/token"));
}

#[tokio::test]
async fn error_bodies_never_reach_the_message() {
    let h = hostile(HostileAuth::Open).await;
    let r = Registry::new(Config::default()).unwrap();
    for (code, class) in [
        (400, "client error"),
        (403, "client error"),
        (404, "client error"),
        (500, "server error"),
    ] {
        let image = format!("{}/secret-{code}:latest", h.host());
        let started = ivory_clock::now();
        let err = r
            .fetch_manifest(
                &reference(&image),
                &insecure(),
                ivory_clock::now() + Duration::from_secs(5),
            )
            .await
            .unwrap_err();
        assert_no_registry_text(&err);
        let msg = err.to_string();
        assert!(msg.contains(&h.host()), "{msg}");
        assert!(msg.contains(&format!("HTTP {code}, {class}")), "{msg}");
        assert!(msg.contains("fetch_manifest"), "{msg}");
        // The endless body was not waited for (500 is retried as transient only for 503).
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn redirects_carry_no_credentials_to_another_host() {
    let capture = CaptureServer::start().await.unwrap();
    let h = HostileServer::start(HostileOptions {
        auth: HostileAuth::Basic,
        redirect_to: Some(capture.host()),
    })
    .await
    .unwrap();
    let r = Registry::new(Config::default()).unwrap();
    let creds = insecure().with_basic(&h.host(), "alice", "s3cret");

    // The registry itself asks for and gets the login.
    let d = r
        .resolve_digest(
            &reference(&format!("{}/good:latest", h.host())),
            &creds,
            ok_deadline(),
        )
        .await
        .unwrap();
    assert_eq!(d, h.good_digest());
    assert!(
        h.requests()
            .iter()
            .any(|q| q.path.ends_with("/manifests/latest") && q.authorization.is_some()),
        "{:?}",
        h.requests()
    );

    let err = r
        .fetch_manifest(
            &reference(&format!("{}/redirect:latest", h.host())),
            &creds,
            ok_deadline(),
        )
        .await
        .unwrap_err();
    // The capture server's answer is not a manifest, and is not shown.
    assert!(matches!(err, Error::InvalidManifest { .. }), "{err}");
    assert_no_registry_text(&err);
    let seen = capture.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].authorization, None,
        "credentials followed the redirect"
    );
}

#[tokio::test]
async fn redirect_loops_are_cut_after_a_few_hops() {
    let h = hostile(HostileAuth::Open).await;
    let r = Registry::new(Config::default()).unwrap();
    let err = r
        .fetch_manifest(
            &reference(&format!("{}/redirectloop:latest", h.host())),
            &insecure(),
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::RedirectRefused {
                reason: ivory_registry::RedirectRefusal::TooMany,
                ..
            }
        ),
        "{err}"
    );
    let hops = h
        .requests()
        .iter()
        .filter(|q| q.path.contains("redirectloop"))
        .count();
    assert_eq!(hops, 4, "the request and three redirects");
}

#[tokio::test]
async fn credentials_never_travel_over_plain_http_without_allow_insecure() {
    let h = hostile(HostileAuth::Basic).await;
    // Loopback (where test servers live) gets the plain-HTTP fallback by default; off, the
    // host stands for any other.
    let r = Registry::new(Config {
        plain_http_loopback: false,
        ..Config::default()
    })
    .unwrap();
    let creds = Credentials::anonymous().with_basic(&h.host(), "alice", "s3cret");
    let err = r
        .resolve_digest(
            &reference(&format!("{}/good:latest", h.host())),
            &creds,
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err}");
    assert!(
        h.requests().iter().all(|q| q.authorization.is_none()),
        "{:?}",
        h.requests()
    );
}

#[tokio::test]
async fn a_plain_http_token_realm_is_refused_for_a_tls_registry() {
    let login = ("carol".to_string(), "pw".to_string());
    let harness = RegistryHarness::start(HarnessOptions {
        auth: AuthMode::Token {
            login: Some(login.clone()),
        },
        plain_http_token_realm: true,
        ..HarnessOptions::default()
    })
    .await
    .unwrap();
    push_simple(&harness, "app", "v1", "plain-realm").await;
    harness.reset_token_requests();
    let r = client_for(&harness);
    let image = format!("{}/app:v1", harness.host());
    for creds in [
        Credentials::anonymous().with_basic(harness.host(), &login.0, &login.1),
        Credentials::anonymous(),
    ] {
        let err = r
            .resolve_digest(&reference(&image), &creds, ok_deadline())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::TokenRealmRefused { .. }), "{err}");
        assert!(err.to_string().contains("plain HTTP"), "{err}");
    }
    assert!(
        harness.token_requests().is_empty(),
        "the realm was contacted: {:?}",
        harness.token_requests()
    );
}

#[tokio::test]
async fn forged_digests_are_registry_errors() {
    let h = hostile(HostileAuth::Open).await;
    let r = Registry::new(Config::default()).unwrap();
    let c = insecure();
    for (repo, problem) in [
        ("upperdigest", DigestProblem::NotLowerHex),
        ("shortdigest", DigestProblem::WrongLength),
        ("lengthdigest", DigestProblem::WrongLength),
        ("md5digest", DigestProblem::UnknownAlgorithm),
    ] {
        let image = format!("{}/{repo}:latest", h.host());
        for err in [
            r.resolve_digest(&reference(&image), &c, ok_deadline())
                .await
                .unwrap_err(),
            r.fetch_manifest(&reference(&image), &c, ok_deadline())
                .await
                .unwrap_err(),
        ] {
            assert!(
                matches!(&err, Error::InvalidDigest { problem: p, field: "Docker-Content-Digest", .. } if *p == problem),
                "{repo}: {err}"
            );
            assert!(!err.is_transient());
            let msg = err.to_string();
            assert!(
                msg.contains("Docker-Content-Digest") && msg.contains(&h.host()),
                "{msg}"
            );
            assert!(!msg.contains("abc") && !msg.contains("AAAA"), "{msg}");
        }
    }

    // A well-formed digest of other content is caught where the body is read.
    let err = r
        .fetch_manifest(
            &reference(&format!("{}/liardigest:latest", h.host())),
            &c,
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    let good = r
        .fetch_manifest(
            &reference(&format!("{}/good:latest", h.host())),
            &c,
            ok_deadline(),
        )
        .await
        .unwrap();
    assert_eq!(good.digest, h.good_digest());

    let err = r
        .fetch_blob(
            &reference(&format!("{}/app", h.host())),
            &h.good_digest(),
            1 << 20,
            &c,
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");

    let subject = format!("{}/badrefs@{}", h.host(), h.good_digest());
    let err = r
        .referrers(&reference(&subject), None, &c, ok_deadline())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidDigest {
                field: "referrers entry",
                ..
            }
        ),
        "{err}"
    );
}
