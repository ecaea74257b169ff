use std::time::Duration;

use tokio::time::Instant;

use super::limit::LimitedWriter;
use super::transport::backoff;
use super::*;

#[test]
fn backoff_doubles_and_caps() {
    assert_eq!(backoff(1), Duration::from_millis(100));
    assert_eq!(backoff(2), Duration::from_millis(200));
    assert_eq!(backoff(5), Duration::from_millis(1600));
    assert_eq!(backoff(6), Duration::from_secs(2));
    assert_eq!(backoff(40), Duration::from_secs(2));
}

#[test]
fn ca_bundle_must_hold_a_certificate() {
    assert!(matches!(
        parse_ca_bundle(b"hello"),
        Err(Error::Config { .. })
    ));
    assert!(
        Registry::new(Config {
            ca_bundle_pem: Some(b"".to_vec()),
            ..Config::default()
        })
        .is_err()
    );
}

#[test]
fn zero_concurrency_is_refused() {
    let err = Registry::new(Config {
        per_registry_concurrency: 0,
        ..Config::default()
    })
    .err()
    .unwrap();
    assert!(err.to_string().contains("per_registry_concurrency"));
}

#[test]
fn platform_matching_honours_variant() {
    let p = serde_json::json!({"os":"linux","architecture":"arm64","variant":"v8"});
    let mut want = Platform {
        os: "linux".into(),
        architecture: "arm64".into(),
        variant: None,
    };
    assert!(platform_matches(Some(&p), &want));
    want.variant = Some("v7".into());
    assert!(!platform_matches(Some(&p), &want));
    assert!(!platform_matches(None, &want));
}

#[tokio::test]
async fn digest_refs_and_bad_input_need_no_network() {
    let r = Registry::new(Config::default()).unwrap();
    let c = Credentials::anonymous();
    let d = format!("sha256:{}", "a".repeat(64));
    let deadline = Instant::now() + Duration::from_secs(1);
    let got = r
        .resolve_digest(&format!("unreachable.invalid/xy@{d}"), &c, deadline)
        .await
        .unwrap();
    assert_eq!(got, d);
    let err = r
        .resolve_digest("UPPER/Case::", &c, deadline)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidReference { .. }), "{err}");
    let err = r
        .fetch_blob("unreachable.invalid/xy", "md5:abc", 10, &c, deadline)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidReference { .. }), "{err}");
    let err = r
        .referrers("unreachable.invalid/xy:tag", None, &c, deadline)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("need a digest"), "{err}");
    assert!(r.stats().is_empty());
}

#[tokio::test]
async fn limited_writer_stops_at_limit() {
    use tokio::io::AsyncWriteExt;
    let mut w = LimitedWriter::new(4);
    w.write_all(b"abc").await.unwrap();
    assert!(w.write_all(b"de").await.is_err());
    assert!(w.exceeded);
}
