//! Authentication flows against the real registry, with the request sequences they cost.

use ivory_registry::{Config, Credentials, Error};
use ivory_testkit::AuthMode;

use crate::util::reference;
use crate::util::{client_for, client_with, ok_deadline, push_simple, seq, start};

#[tokio::test]
async fn anonymous_resolve_costs_ping_plus_head() {
    let h = start(AuthMode::None).await;
    let img = push_simple(&h, "team/app", "v1", "anon").await;
    let r = client_for(&h);
    let creds = Credentials::anonymous();
    h.reset_requests();

    let image = format!("{}/team/app:v1", h.host());
    let d = r
        .resolve_digest(&reference(&image), &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);
    assert_eq!(
        seq(&h),
        vec![
            "GET /v2/ 200".to_string(),
            "HEAD /v2/team/app/manifests/v1 200".to_string()
        ]
    );

    // The host answered /v2/ without a challenge once: no more pings for it.
    h.reset_requests();
    r.resolve_digest(&reference(&image), &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(
        seq(&h),
        vec!["HEAD /v2/team/app/manifests/v1 200".to_string()]
    );
    let other = push_simple(&h, "team/other", "v1", "anon2").await;
    h.reset_requests();
    let image2 = format!("{}/team/other:v1", h.host());
    let d2 = r
        .resolve_digest(&reference(&image2), &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d2, other.manifest.digest);
    assert_eq!(
        seq(&h),
        vec!["HEAD /v2/team/other/manifests/v1 200".to_string()],
        "a new repository on a known open host needs no ping"
    );

    let stats = r.stats();
    assert_eq!(stats.len(), 1);
    assert_eq!(stats[0].registry, h.host());
    assert_eq!(stats[0].requests, 4, "probe + 3 HEADs");
    assert_eq!(stats[0].errors, 0);
    assert_eq!(stats[0].latency_count, 3);
}

#[tokio::test]
async fn basic_auth_resolves_and_caches_credentials_per_repo() {
    let auth = AuthMode::Basic {
        user: "alice".into(),
        password: "s3cret".into(),
    };
    let h = start(auth).await;
    let img = push_simple(&h, "private/app", "v1", "basic").await;
    let r = client_for(&h);
    let creds = Credentials::anonymous().with_basic(h.host(), "alice", "s3cret");
    h.reset_requests();

    let image = format!("{}/private/app:v1", h.host());
    let d = r
        .resolve_digest(&reference(&image), &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);
    assert_eq!(
        seq(&h),
        vec![
            "GET /v2/ 401".to_string(),
            "HEAD /v2/private/app/manifests/v1 200".to_string()
        ]
    );
    h.reset_requests();
    r.resolve_digest(&reference(&image), &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(
        seq(&h),
        vec!["HEAD /v2/private/app/manifests/v1 200".to_string()],
        "warm basic auth is one request"
    );
    let other = push_simple(&h, "private/other", "v1", "basic2").await;
    h.reset_requests();
    let d = r
        .resolve_digest(
            &reference(&format!("{}/private/other:v1", h.host())),
            &creds,
            ok_deadline(),
        )
        .await
        .unwrap();
    assert_eq!(d, other.manifest.digest);
    assert_eq!(
        seq(&h),
        vec!["HEAD /v2/private/other/manifests/v1 200".to_string()],
        "a new repository on a probed Basic host needs no ping"
    );

    // Wrong password and no credentials are definite Unauthorized answers.
    let bad = Credentials::anonymous().with_basic(h.host(), "alice", "wrong");
    let err = r
        .resolve_digest(&reference(&image), &bad, ok_deadline())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("private/app"), "{err}");
    let err = r
        .resolve_digest(&reference(&image), &Credentials::anonymous(), ok_deadline())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err}");
}

#[tokio::test]
async fn basic_auth_from_pull_secret_and_docker_config_file() {
    let auth = AuthMode::Basic {
        user: "bob".into(),
        password: "pw".into(),
    };
    let h = start(auth).await;
    let img = push_simple(&h, "app", "v1", "secret").await;
    let image = format!("{}/app:v1", h.host());
    let secret = format!(
        r#"{{"auths":{{"{}":{{"username":"bob","password":"pw"}}}}}}"#,
        h.host()
    );

    let creds = Credentials::anonymous()
        .with_docker_config_json("secret default/pull", secret.as_bytes())
        .unwrap();
    let r = client_for(&h);
    let d = r
        .resolve_digest(&reference(&image), &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, &secret).unwrap();
    let r = client_with(
        &h,
        Config {
            docker_config: Some(path),
            ..Config::default()
        },
    );
    let d = r
        .resolve_digest(&reference(&image), &Credentials::anonymous(), ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);
}

#[tokio::test]
async fn anonymous_token_flow_caches_token_until_expiry() {
    let h = start(AuthMode::Token { login: None }).await;
    let img = push_simple(&h, "public/app", "v1", "token").await;
    let r = client_for(&h);
    let creds = Credentials::anonymous();
    h.reset_requests();
    h.reset_token_requests();

    let image = format!("{}/public/app:v1", h.host());
    let d = r
        .resolve_digest(&reference(&image), &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);
    assert_eq!(
        seq(&h),
        vec![
            "GET /v2/ 401".to_string(),
            "HEAD /v2/public/app/manifests/v1 200".to_string()
        ]
    );
    assert_eq!(
        h.token_requests(),
        vec!["200 scope=repository:public/app:pull".to_string()]
    );

    h.reset_requests();
    h.reset_token_requests();
    let m = r
        .fetch_manifest(&reference(&image), &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(m.digest, img.manifest.digest);
    assert_eq!(
        seq(&h),
        vec!["GET /v2/public/app/manifests/v1 200".to_string()]
    );
    assert!(h.token_requests().is_empty(), "token reused");
}

#[tokio::test]
async fn token_flow_with_login_and_wrong_password() {
    let h = start(AuthMode::Token {
        login: Some(("carol".into(), "pw".into())),
    })
    .await;
    let img = push_simple(&h, "app", "v1", "token-login").await;
    let r = client_for(&h);
    let image = format!("{}/app:v1", h.host());

    let creds = Credentials::anonymous().with_basic(h.host(), "carol", "pw");
    let d = r
        .resolve_digest(&reference(&image), &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);

    let bad = Credentials::anonymous().with_basic(h.host(), "carol", "nope");
    let err = r
        .resolve_digest(&reference(&image), &bad, ok_deadline())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err}");
    assert!(
        h.token_requests().iter().any(|l| l.starts_with("401")),
        "{:?}",
        h.token_requests()
    );
}
