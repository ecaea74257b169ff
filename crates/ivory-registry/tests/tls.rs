//! TLS: the harness CA as `--registry-ca`, a missing CA, and allowInsecureRegistry.

use ivory_registry::{Config, Credentials, Error, Registry, TransportCause};
use ivory_testkit::{AuthMode, HarnessOptions, RegistryHarness};

use crate::util::reference;
use crate::util::{ok_deadline, push_simple, start};

#[tokio::test]
async fn missing_ca_is_a_clear_tls_error_and_insecure_skips_verification() {
    let h = start(AuthMode::None).await;
    let img = push_simple(&h, "app", "v1", "tls").await;
    let image = format!("{}/app:v1", h.host());
    let r = Registry::new(Config::default()).unwrap();

    let err = r
        .resolve_digest(&reference(&image), &Credentials::anonymous(), ok_deadline())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Transport {
                cause: TransportCause::CertificateUnknownIssuer,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("certificate"),
        "TLS cause must be visible: {msg}"
    );
    assert!(err.is_transient());

    let insecure = Credentials::anonymous().allow_insecure(true);
    let d = r
        .resolve_digest(&reference(&image), &insecure, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);
}

#[tokio::test]
async fn plain_http_on_loopback_by_default_and_with_allow_http() {
    let h = RegistryHarness::start(HarnessOptions::plain_http())
        .await
        .unwrap();
    let img = push_simple(&h, "app", "v1", "plain").await;
    let image = format!("{}/app:v1", h.host());
    let anonymous = Credentials::anonymous();
    let r = Registry::new(Config::default()).unwrap();
    let d = r
        .resolve_digest(&reference(&image), &anonymous, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);
    let r = Registry::new(Config {
        plain_http_loopback: false,
        allow_http: true,
        ..Config::default()
    })
    .unwrap();
    let d = r
        .resolve_digest(&reference(&image), &anonymous, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);
}

#[tokio::test]
async fn a_self_signed_registry_is_reached_with_allow_insecure_and_its_tls_error_kept_otherwise() {
    let h = RegistryHarness::start_default().await.unwrap();
    let img = push_simple(&h, "app", "v1", "tls").await;
    let image = format!("{}/app:v1", h.host());
    let anonymous = Credentials::anonymous();
    // Plain HTTP is tried (loopback) and answered with 400 by the TLS server: the TLS
    // failure is the cause reported.
    let err = Registry::new(Config::default())
        .unwrap()
        .resolve_digest(&reference(&image), &anonymous, ok_deadline())
        .await
        .unwrap_err();
    assert!(
        err.summary()
            .ends_with("(TLS certificate signed by an unknown authority)"),
        "{err}"
    );
    let r = Registry::new(Config {
        allow_insecure: true,
        ..Config::default()
    })
    .unwrap();
    let d = r
        .resolve_digest(&reference(&image), &anonymous, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);
}

#[tokio::test]
async fn plain_http_only_with_allow_insecure() {
    let h = RegistryHarness::start(HarnessOptions::plain_http())
        .await
        .unwrap();
    let img = push_simple(&h, "app", "v1", "plain").await;
    let image = format!("{}/app:v1", h.host());
    // Test registries can only live on loopback, which gets the fallback by default (see
    // `plain_http_on_loopback_by_default_and_with_allow_http`); off, it stands for any host.
    let r = Registry::new(Config {
        plain_http_loopback: false,
        ..Config::default()
    })
    .unwrap();

    let err = r
        .resolve_digest(&reference(&image), &Credentials::anonymous(), ok_deadline())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Transport {
                cause: TransportCause::PeerNotTls,
                ..
            }
        ),
        "a plain-HTTP server is recognised by rustls' error type: {err:?}"
    );

    let insecure = Credentials::anonymous().allow_insecure(true);
    let d = r
        .resolve_digest(&reference(&image), &insecure, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);
    // The learned scheme sticks: the next call goes straight to HTTP, one HEAD.
    h.reset_requests();
    r.resolve_digest(&reference(&image), &insecure, ok_deadline())
        .await
        .unwrap();
    assert_eq!(
        h.requests(),
        vec![("HEAD".to_string(), "/v2/app/manifests/v1".to_string(), 200)]
    );
}

#[test]
fn bad_ca_bundle_is_refused_at_construction() {
    let err = Registry::new(Config {
        ca_bundle_pem: Some(
            b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n".to_vec(),
        ),
        ..Config::default()
    })
    .err()
    .unwrap();
    assert!(matches!(err, Error::Config { .. }), "{err}");
}

#[tokio::test]
async fn a_mirror_serves_another_hosts_images_under_their_own_names() {
    let h = start(AuthMode::None).await;
    let img = push_simple(&h, "acme/app", "v1", "mirror").await;
    let mut config = Config {
        ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
        ..Config::default()
    };
    config
        .mirrors
        .insert("ghcr.io".to_owned(), h.host().to_owned());
    let r = Registry::new(config).unwrap();
    let anonymous = Credentials::anonymous();
    // ghcr.io's name, the harness's bytes; the digest is checked against them as always.
    let d = r
        .resolve_digest(&reference("ghcr.io/acme/app:v1"), &anonymous, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);
    let m = r
        .fetch_manifest(
            &reference(&format!("ghcr.io/acme/app@{d}")),
            &anonymous,
            ok_deadline(),
        )
        .await
        .unwrap();
    assert_eq!(m.digest, img.manifest.digest);
    // Only the named host is mirrored, and an error names the image as written.
    let err = r
        .resolve_digest(
            &reference("ghcr.io/acme/missing:v1"),
            &anonymous,
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("ghcr.io/acme/missing:v1"), "{err}");
}
