use std::time::Duration;

use super::http::{BodyError, ReadBudget, read_capped};
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
    let deadline = ivory_clock::now() + Duration::from_secs(1);
    let reference = |image: &str| parse_reference(image).unwrap();
    let got = r
        .resolve_digest(
            &reference(&format!("unreachable.invalid/xy@{d}")),
            &c,
            deadline,
        )
        .await
        .unwrap();
    assert_eq!(got, d);
    // A string that is not a reference never reaches the client: it is refused where it is
    // parsed, naming the image.
    let err = parse_reference("UPPER/Case::").unwrap_err();
    assert!(matches!(err, Error::InvalidReference { .. }), "{err}");
    assert!(err.to_string().contains("UPPER/Case::"), "{err}");
    let err = r
        .fetch_blob(
            &reference("unreachable.invalid/xy"),
            "md5:abc",
            10,
            &c,
            deadline,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidDigest { .. }), "{err}");
    let err = r
        .referrers(&reference("unreachable.invalid/xy:tag"), None, &c, deadline)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("need a digest"), "{err}");
    assert!(r.stats().is_empty());
}

fn answer(body: Vec<u8>) -> reqwest::Response {
    reqwest::Response::from(::http::Response::new(body))
}

#[tokio::test]
async fn capped_reads_stop_at_the_limit_and_stay_within_budget() {
    let budget = ReadBudget::new(1 << 20);
    let body = read_capped(answer(vec![7; 1000]), 1000, &budget)
        .await
        .unwrap();
    assert_eq!(body.len(), 1000);
    assert!(body.capacity() <= 1000, "capacity {}", body.capacity());
    assert!(matches!(
        read_capped(answer(vec![7; 1001]), 1000, &budget).await,
        Err(BodyError::TooLarge)
    ));
    // The budget came back after each read.
    let body = read_capped(answer(vec![1; 1 << 20]), 1 << 20, &budget)
        .await
        .unwrap();
    assert_eq!(body.len(), 1 << 20);
    let tight = ReadBudget::new(100);
    assert!(matches!(
        read_capped(answer(vec![1; 500]), 1000, &tight).await,
        Err(BodyError::BudgetExhausted)
    ));
}
