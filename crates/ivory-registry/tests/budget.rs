//! The cosign-style cold path against the real registry: tag → digest, then the `.sig`
//! manifest in parallel with referrers, then the signature blob. Documents the request
//! sequence and checks the floor (3 sequential phases once the host is known).

use ivory_registry::{Credentials, OCI_MANIFEST};
use ivory_testkit::{AuthMode, sha256_digest};
use serde_json::json;

use crate::util::{client_for, ok_deadline, push_simple, seq, start};

#[tokio::test]
async fn cold_tag_verification_path_request_sequence() {
    let h = start(AuthMode::Basic {
        user: "u".into(),
        password: "p".into(),
    })
    .await;
    let img = push_simple(&h, "app", "v1", "budget").await;
    // A cosign-style signature manifest under sha256-<hex>.sig.
    let payload = br#"{"critical":{}}"#.to_vec();
    let payload_digest = h.push_blob("app", &payload).await.unwrap();
    let config = h.push_blob("app", b"{}").await.unwrap();
    let sig = json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2},
        "layers": [{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                    "digest": payload_digest, "size": payload.len()}],
    })
    .to_string();
    let sig_tag = format!("{}.sig", img.manifest.digest.replace(':', "-"));
    h.push_manifest("app", &sig_tag, OCI_MANIFEST, sig.as_bytes())
        .await
        .unwrap();

    let r = client_for(&h);
    let creds = Credentials::anonymous().with_basic(h.host(), "u", "p");
    let repo = format!("{}/app", h.host());
    h.reset_requests();

    // Phase 1: tag → digest.
    let digest = r
        .resolve_digest(&format!("{repo}:v1"), &creds, ok_deadline())
        .await
        .unwrap();
    // Phase 2: .sig manifest ∥ referrers.
    let sig_ref = format!("{repo}:{sig_tag}");
    let subject = format!("{repo}@{digest}");
    let (sig_manifest, referrers) = tokio::join!(
        r.fetch_manifest(&sig_ref, &creds, ok_deadline()),
        r.referrers(&subject, None, &creds, ok_deadline())
    );
    let sig_manifest = sig_manifest.unwrap();
    assert_eq!(referrers.unwrap()["manifests"], json!([]));
    // Phase 3: signature blobs.
    let layer = sig_manifest.json["layers"][0]["digest"].as_str().unwrap();
    let blob = r
        .fetch_blob(&repo, layer, 1 << 20, &creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(sha256_digest(&blob), payload_digest);

    let mut got = seq(&h);
    // Phase 2 runs concurrently; its log order is not fixed.
    got[2..5].sort();
    let mut phase2 = vec![
        format!("GET /v2/app/manifests/{sig_tag} 200"),
        format!("GET /v2/app/referrers/{digest} 404"),
        format!("GET /v2/app/manifests/{} 404", digest.replace(':', "-")),
    ];
    phase2.sort();
    let mut want = vec![
        "GET /v2/ 401".to_string(),
        "HEAD /v2/app/manifests/v1 200".to_string(),
    ];
    want.extend(phase2);
    want.push(format!("GET /v2/app/blobs/{payload_digest} 200"));
    assert_eq!(got, want);
}
