//! The cosign-style cold path against the real registry: tag → digest, then the `.sig`
//! manifest in parallel with referrers, then the signature blob. Documents the request
//! sequence and checks the floor: once the host is known (auth probed, referrers API known
//! absent), HEAD + (.sig ∥ fallback tag) + blob, nothing else.

use ivory_registry::{Credentials, OCI_MANIFEST, Registry};
use ivory_testkit::{AuthMode, Harness, sha256_digest};
use serde_json::json;

use crate::util::reference;
use crate::util::{client_for, ok_deadline, push_simple, seq, start};

/// Pushes a cosign-style signature manifest for `digest`; returns (sig tag, payload digest).
async fn push_sig(h: &Harness, digest: &str, payload: &[u8]) -> (String, String) {
    let payload_digest = h.push_blob("app", payload).await.unwrap();
    let config = h.push_blob("app", b"{}").await.unwrap();
    let sig = json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2},
        "layers": [{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                    "digest": payload_digest, "size": payload.len()}],
    })
    .to_string();
    let sig_tag = format!("{}.sig", digest.replace(':', "-"));
    h.push_manifest("app", &sig_tag, OCI_MANIFEST, sig.as_bytes())
        .await
        .unwrap();
    (sig_tag, payload_digest)
}

/// Runs the verification path for `repo:tag`: resolve, (.sig ∥ referrers), blob.
async fn verify_path(r: &Registry, creds: &Credentials, repo: &str, tag: &str, payload: &str) {
    let digest = r
        .resolve_digest(&reference(&format!("{repo}:{tag}")), creds, ok_deadline())
        .await
        .unwrap();
    let sig_ref = format!("{repo}:{}.sig", digest.replace(':', "-"));
    let subject = format!("{repo}@{digest}");
    let (sig_ref, subject) = (reference(&sig_ref), reference(&subject));
    let (sig_manifest, referrers) = tokio::join!(
        r.fetch_manifest(&sig_ref, creds, ok_deadline()),
        r.referrers(&subject, None, creds, ok_deadline())
    );
    let sig_manifest = sig_manifest.unwrap();
    assert_eq!(referrers.unwrap()["manifests"], json!([]));
    let layer = sig_manifest.json["layers"][0]["digest"].as_str().unwrap();
    let blob = r
        .fetch_blob(&reference(repo), layer, 1 << 20, creds, ok_deadline())
        .await
        .unwrap();
    assert_eq!(sha256_digest(&blob), payload);
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn cold_tag_verification_path_request_sequence() {
    let h = start(AuthMode::Basic {
        user: "u".into(),
        password: "p".into(),
    })
    .await;
    let one = push_simple(&h, "app", "v1", "budget").await;
    let two = push_simple(&h, "app", "v2", "budget-two").await;
    let (sig1, payload1) = push_sig(&h, &one.manifest.digest, br#"{"critical":{}}"#).await;
    let (sig2, payload2) = push_sig(&h, &two.manifest.digest, br#"{"critical":{"n":2}}"#).await;

    let r = client_for(&h);
    let creds = Credentials::anonymous().with_basic(h.host(), "u", "p");
    let repo = format!("{}/app", h.host());

    // Cold host: auth probe once, and the referrers API is asked once (Distribution 2.8:
    // 404, before auth), then its fallback tag.
    h.reset_requests();
    verify_path(&r, &creds, &repo, "v1", &payload1).await;
    let got = seq(&h);
    eprintln!("cold host: {} requests: {got:?}", got.len());
    let d1 = &one.manifest.digest;
    assert_eq!(got.len(), 6, "{got:?}");
    assert_eq!(got[..2], ["GET /v2/ 401", "HEAD /v2/app/manifests/v1 200"]);
    assert_eq!(
        sorted(got[2..5].to_vec()),
        sorted(vec![
            format!("GET /v2/app/manifests/{sig1} 200"),
            format!("GET /v2/app/referrers/{d1} 404"),
            format!("GET /v2/app/manifests/{} 404", d1.replace(':', "-")),
        ])
    );
    assert_eq!(got[5], format!("GET /v2/app/blobs/{payload1} 200"));

    // Known host: HEAD + (.sig ∥ fallback tag) + blob: three sequential round trips.
    h.reset_requests();
    verify_path(&r, &creds, &repo, "v2", &payload2).await;
    let got = seq(&h);
    eprintln!("known host: {} requests: {got:?}", got.len());
    let d2 = &two.manifest.digest;
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0], "HEAD /v2/app/manifests/v2 200");
    assert_eq!(
        sorted(got[1..3].to_vec()),
        sorted(vec![
            format!("GET /v2/app/manifests/{sig2} 200"),
            format!("GET /v2/app/manifests/{} 404", d2.replace(':', "-")),
        ])
    );
    assert_eq!(got[3], format!("GET /v2/app/blobs/{payload2} 200"));
}

/// Concurrent cold calls to one host share one auth probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cold_calls_ping_once() {
    let h = start(AuthMode::Basic {
        user: "u".into(),
        password: "p".into(),
    })
    .await;
    let img = push_simple(&h, "app", "v1", "ping-once").await;
    let r = client_for(&h);
    let creds = Credentials::anonymous().with_basic(h.host(), "u", "p");
    let image = format!("{}/app:v1", h.host());
    h.reset_requests();
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let (r, creds, image) = (r.clone(), creds.clone(), image.clone());
            tokio::spawn(async move {
                r.resolve_digest(&reference(&image), &creds, ok_deadline())
                    .await
            })
        })
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap(), img.manifest.digest);
    }
    let pings = seq(&h)
        .iter()
        .filter(|l| l.starts_with("GET /v2/ "))
        .count();
    assert_eq!(pings, 1, "{:?}", seq(&h));
    let stats = &r.stats()[0];
    assert_eq!(stats.requests, 9, "{stats:?}");
    // The probe's Basic challenge is a 401; the eight calls are answered.
    assert_eq!(stats.statuses.get("2xx"), Some(&8), "{stats:?}");
    assert_eq!(stats.statuses.get("4xx"), Some(&1), "{stats:?}");
}
