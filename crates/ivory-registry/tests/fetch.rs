//! Manifests, blobs, limits, platform selection and the referrers fallback.

use std::time::Duration;

use ivory_registry::{Config, Credentials, Error, OCI_INDEX, OCI_MANIFEST, Platform};
use ivory_testkit::{AuthMode, OciLayout, sha256_digest};
use serde_json::json;

use crate::util::reference;
use crate::util::{client_for, client_with, ok_deadline, push_simple, seq, start};

#[tokio::test]
async fn digest_refs_need_no_request() {
    let h = start(AuthMode::None).await;
    let img = push_simple(&h, "app", "v1", "digest").await;
    let r = client_for(&h);
    h.reset_requests();
    let image = format!("{}/app@{}", h.host(), img.manifest.digest);
    let d = r
        .resolve_digest(&reference(&image), &Credentials::anonymous(), ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, img.manifest.digest);
    assert!(h.requests().is_empty(), "{:?}", h.requests());
    assert!(r.stats().is_empty());
}

#[tokio::test]
async fn manifests_and_blobs_are_verified_and_size_limited() {
    let h = start(AuthMode::None).await;
    let img = push_simple(&h, "app", "v1", "fetch").await;
    let r = client_for(&h);
    let creds = Credentials::anonymous();
    h.reset_requests();

    let by_digest = format!("{}/app@{}", h.host(), img.manifest.digest);
    let m = r
        .fetch_manifest(&reference(&by_digest), &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(m.digest, img.manifest.digest);
    assert_eq!(m.media_type, OCI_MANIFEST);
    assert_eq!(sha256_digest(&m.bytes), m.digest);
    assert_eq!(m.json["config"]["digest"], img.config.digest.as_str());
    assert_eq!(
        seq(&h),
        vec![
            "GET /v2/ 200".to_string(),
            format!("GET /v2/app/manifests/{} 200", img.manifest.digest)
        ]
    );

    let repo = format!("{}/app", h.host());
    h.reset_requests();
    let blob = r
        .fetch_blob(
            &reference(&repo),
            &img.config.digest,
            1 << 20,
            &creds,
            ok_deadline(),
        )
        .await
        .unwrap();
    assert_eq!(sha256_digest(&blob), img.config.digest);
    assert_eq!(
        seq(&h),
        vec![format!("GET /v2/app/blobs/{} 200", img.config.digest)],
        "blob pulls use stored auth without a ping"
    );

    let err = r
        .fetch_blob(
            &reference(&repo),
            &img.config.digest,
            10,
            &creds,
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { limit: 10, .. }), "{err}");

    let missing = format!("sha256:{}", "0".repeat(64));
    let err = r
        .fetch_blob(&reference(&repo), &missing, 1 << 20, &creds, ok_deadline())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");

    let tiny = client_with(
        &h,
        Config {
            max_manifest_bytes: 64,
            ..Config::default()
        },
    );
    let err = tiny
        .fetch_manifest(&reference(&by_digest), &creds, ok_deadline())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");

    let err = r
        .fetch_manifest(
            &reference(&format!("{}/app:nope", h.host())),
            &creds,
            ok_deadline(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    assert!(!err.is_transient());

    let stats = r.stats();
    assert!(stats[0].bytes >= (m.bytes.len() + blob.len()) as u64);
    assert!(stats[0].errors >= 2);
}

#[tokio::test]
async fn index_resolves_to_index_digest_and_platform_child() {
    let h = start(AuthMode::None).await;
    let dir = tempfile::tempdir().unwrap();
    let mut layout = OciLayout::create(dir.path()).unwrap();
    let amd = layout
        .add_image(br#"{"os":"linux","architecture":"amd64"}"#, &[b"a"], None)
        .unwrap();
    let arm = layout
        .add_image(br#"{"os":"linux","architecture":"arm64"}"#, &[b"b"], None)
        .unwrap();
    let index = layout
        .add_index(&[
            (
                amd.clone(),
                Some(json!({"os":"linux","architecture":"amd64"})),
            ),
            (
                arm.clone(),
                Some(json!({"os":"linux","architecture":"arm64","variant":"v8"})),
            ),
        ])
        .unwrap();
    layout.add_entry(&index, Some("multi"));
    layout.finish().unwrap();
    h.push_oci_layout(dir.path(), "multi").await.unwrap();

    let r = client_for(&h);
    let creds = Credentials::anonymous();
    let image = format!("{}/multi:multi", h.host());
    let d = r
        .resolve_digest(&reference(&image), &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(d, index.digest, "a multi-arch tag pins to the index");
    let m = r
        .fetch_manifest(&reference(&image), &creds, ok_deadline())
        .await
        .unwrap();
    assert!(m.is_index());
    assert_eq!(m.media_type, OCI_INDEX);
    assert_eq!(m.children().len(), 2);

    let arm64 = Platform {
        os: "linux".into(),
        architecture: "arm64".into(),
        variant: Some("v8".into()),
    };
    let child = r
        .fetch_platform_manifest(&reference(&image), &arm64, &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(child.digest, arm.digest);
    let s390 = Platform {
        os: "linux".into(),
        architecture: "s390x".into(),
        variant: None,
    };
    let err = r
        .fetch_platform_manifest(&reference(&image), &s390, &creds, ok_deadline())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("no entry for linux/s390x"),
        "{err}"
    );
}

#[tokio::test]
async fn referrers_fall_back_to_the_tag_schema() {
    let h = start(AuthMode::None).await;
    let img = push_simple(&h, "app", "v1", "referrers").await;
    let bundle_type = "application/vnd.dev.sigstore.bundle.v0.3+json";
    let empty = h.push_blob("app", b"{}").await.unwrap();
    let layer = h.push_blob("app", b"bundle-bytes").await.unwrap();
    let artifact = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": bundle_type,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": empty, "size": 2},
        "layers": [{"mediaType": bundle_type, "digest": layer, "size": 12}],
        "subject": img.manifest.to_json(),
    })
    .to_string();
    let artifact_digest = h
        .push_manifest(
            "app",
            &sha256_digest(artifact.as_bytes()),
            OCI_MANIFEST,
            artifact.as_bytes(),
        )
        .await
        .unwrap();
    let index = json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{"mediaType": OCI_MANIFEST, "digest": artifact_digest,
                       "size": artifact.len(), "artifactType": bundle_type}],
    })
    .to_string();
    let tag = img.manifest.digest.replace(':', "-");
    h.push_manifest("app", &tag, OCI_INDEX, index.as_bytes())
        .await
        .unwrap();

    let r = client_for(&h);
    let creds = Credentials::anonymous();
    let subject = format!("{}/app@{}", h.host(), img.manifest.digest);
    h.reset_requests();
    let found = r
        .referrers(
            &reference(&subject),
            Some(bundle_type),
            &creds,
            ok_deadline(),
        )
        .await
        .unwrap();
    assert_eq!(found["manifests"][0]["digest"], artifact_digest.as_str());
    assert_eq!(
        seq(&h),
        vec![
            "GET /v2/ 200".to_string(),
            format!("GET /v2/app/referrers/{} 404", img.manifest.digest),
            format!("GET /v2/app/manifests/{tag} 200"),
        ],
        "cold host: the auth probe, Distribution 2.8's 404 (no referrers API), the tag"
    );
    let stats = &r.stats()[0];
    assert_eq!(stats.requests, 3, "{stats:?}");
    let statuses: Vec<_> = stats
        .statuses
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(statuses, [("2xx", 2), ("4xx", 1)], "{stats:?}");
    h.reset_requests();

    let none = r
        .referrers(
            &reference(&subject),
            Some("application/x-other"),
            &creds,
            ok_deadline(),
        )
        .await
        .unwrap();
    assert_eq!(none["manifests"], json!([]));

    let other = push_simple(&h, "app", "v2", "no-referrers").await;
    let empty = r
        .referrers(
            &reference(&format!("{}/app@{}", h.host(), other.manifest.digest)),
            None,
            &creds,
            ok_deadline(),
        )
        .await
        .unwrap();
    assert_eq!(empty["manifests"], json!([]));
    // The host is known to lack the API: straight to the fallback tags.
    assert_eq!(
        seq(&h)
            .into_iter()
            .filter(|l| !l.contains("/blobs/")
                && !l.starts_with("PUT")
                && !l.starts_with("POST")
                && !l.starts_with("HEAD"))
            .collect::<Vec<_>>(),
        vec![
            format!("GET /v2/app/manifests/{tag} 200"),
            format!(
                "GET /v2/app/manifests/{} 404",
                other.manifest.digest.replace(':', "-")
            ),
        ]
    );
}

#[tokio::test]
async fn referrers_api_absence_is_forgotten_after_its_ttl() {
    let h = start(AuthMode::None).await;
    let img = push_simple(&h, "app", "v1", "ttl").await;
    let r = client_with(
        &h,
        Config {
            referrers_api_ttl: Duration::from_millis(300),
            ..Config::default()
        },
    );
    let subject = format!("{}/app@{}", h.host(), img.manifest.digest);
    let creds = Credentials::anonymous();
    let probes =
        |h: &ivory_testkit::Harness| seq(h).iter().filter(|l| l.contains("/referrers/")).count();
    h.reset_requests();
    for _ in 0..2 {
        let idx = r
            .referrers(&reference(&subject), None, &creds, ok_deadline())
            .await
            .unwrap();
        assert_eq!(idx["manifests"], json!([]));
    }
    assert_eq!(probes(&h), 1, "{:?}", seq(&h));
    tokio::time::sleep(Duration::from_millis(400)).await;
    r.referrers(&reference(&subject), None, &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(
        probes(&h),
        2,
        "expired: the API is asked again: {:?}",
        seq(&h)
    );
}
