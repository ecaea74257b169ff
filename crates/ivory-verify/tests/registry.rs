//! ivory-verify through a real Distribution registry (ivory-testkit) with the fixtures in
//! `fixtures/oci/ivory` (signed by real cosign). Request counts come from the registry's own
//! access log.

// Test helpers outside #[test] fns: failing fast is the point.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use ivory_engine::verifier::{
    ImagePlatform, ImageReference, ImageVerifier, Verification, VerifyRequest,
};
use ivory_policy::types::{Attestation, Attestor, Credentials, Source, TypeRef};
use ivory_registry::{Config, Registry};
use ivory_testkit::{
    FaultOptions, FaultServer, Harness, HarnessOptions, HungRegistry, RegistryHarness, refused_host,
};
use ivory_verify::{CosignVerifier, VerifierConfig};
use serde_json::Value;
use tokio::time::Instant;

fn key(name: &str) -> String {
    std::fs::read_to_string(ivory_testkit::fixtures_dir().join("keys").join(name)).unwrap()
}

fn key_attestor(pem: &str) -> Attestor {
    serde_json::from_value(ivory_testkit::policy::key_attestor_json(pem)).unwrap()
}

fn verifier(h: &Harness) -> CosignVerifier {
    verifier_with(h, VerifierConfig::default())
}

/// A verifier of `h`'s images with `config`.
fn verifier_with(h: &Harness, config: VerifierConfig) -> CosignVerifier {
    let registry = Config {
        ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
        ..Config::default()
    };
    CosignVerifier::new(
        Registry::new(registry).unwrap(),
        config,
        CosignVerifier::anonymous_credentials(),
    )
}

/// The fixture `sig-p256` pushed to `h`, as a signature question about its digest under the
/// key that signed it.
async fn signed_p256(h: &Harness, v: &CosignVerifier) -> VerifyRequest {
    let repo = push(h, "sig-p256").await;
    let digest = v
        .resolve_digest(&reference(&format!("{repo}:v1")), None, soon())
        .await
        .unwrap();
    request(
        format!("{repo}@{digest}"),
        key_attestor(&key("cosign-p256.pub")),
        None,
    )
}

/// Pushes fixture `layout` (which has a `v1` tag); returns its repository, `HOST/ivory/<layout>`.
async fn push(h: &Harness, layout: &str) -> String {
    let (image, _) = h.push_fixture(layout).await.unwrap();
    image.trim_end_matches(":v1").to_owned()
}

/// `image` parsed, as the engine hands images to the verifier.
fn reference(image: &str) -> ImageReference {
    ImageReference::parse(image).unwrap_or_else(|e| panic!("{e}"))
}

fn request(image: String, attestor: Attestor, attestation: Option<Attestation>) -> VerifyRequest {
    VerifyRequest {
        image: reference(&image),
        attestor,
        attestation,
        credentials: None,
        platforms: Default::default(),
    }
}

fn soon() -> Instant {
    ivory_clock::now() + Duration::from_secs(20)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_signatures_attestations_caches_and_coalescing() {
    let h = RegistryHarness::start_default().await.unwrap();
    let v = verifier(&h);

    // Positive and negative key cases, legacy `.sig` format.
    let p256 = push(&h, "sig-p256").await;
    let ok = v
        .verify(
            &request(
                format!("{p256}:v1"),
                key_attestor(&key("cosign-p256.pub")),
                None,
            ),
            soon(),
        )
        .await
        .unwrap();
    assert!(ok.is_verified(), "{ok:?}");
    let wrong = v
        .verify(
            &request(
                format!("{p256}:v1"),
                key_attestor(&key("untrusted-p256.pub")),
                None,
            ),
            soon(),
        )
        .await
        .unwrap();
    assert!(
        matches!(&wrong, Verification::NotVerified { reason, .. } if reason.to_string().contains("invalid signature")),
        "{wrong:?}"
    );
    let unsigned = push(&h, "unsigned").await;
    let none = v
        .verify(
            &request(
                format!("{unsigned}:v1"),
                key_attestor(&key("cosign-p256.pub")),
                None,
            ),
            soon(),
        )
        .await
        .unwrap();
    assert!(
        matches!(&none, Verification::NotVerified { reason, .. } if *reason.unsearched() == ivory_verify::Rejection::NoSignatures),
        "{none:?}"
    );

    // Attestation (`.att`, DSSE) with the verified statement as payload.
    let att = push(&h, "att-p256").await;
    let slsa = Attestation {
        name: "slsa".into(),
        intoto: Some(TypeRef {
            type_: "https://slsa.dev/provenance/v1".into(),
        }),
        referrer: None,
    };
    let got = v
        .verify(
            &request(
                format!("{att}:v1"),
                key_attestor(&key("cosign-p256.pub")),
                Some(slsa),
            ),
            soon(),
        )
        .await
        .unwrap();
    let Verification::Verified {
        payload: Some(st), ..
    } = &got
    else {
        panic!("{got:?}")
    };
    assert_eq!(st["predicateType"], "https://slsa.dev/provenance/v1");
    let missing = Attestation {
        name: "vex".into(),
        intoto: Some(TypeRef {
            type_: "https://openvex.dev/ns".into(),
        }),
        referrer: None,
    };
    let got = v
        .verify(
            &request(
                format!("{att}:v1"),
                key_attestor(&key("cosign-p256.pub")),
                Some(missing),
            ),
            soon(),
        )
        .await
        .unwrap();
    assert!(
        matches!(&got, Verification::NotVerified { reason, .. } if reason.to_string().starts_with("required predicate type https://openvex.dev/ns not found")),
        "{got:?}"
    );

    // Request counts on a fresh verifier and a fresh image. The first call to a host probes
    // auth (`GET /v2/`) once; a `.sig` that verifies means the referrers are never asked.
    let ed = push(&h, "sig-p384").await;
    let registry = Registry::new(Config {
        ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
        ..Config::default()
    })
    .unwrap();
    let on = |r: &Registry| {
        CosignVerifier::new(
            r.clone(),
            VerifierConfig::default(),
            CosignVerifier::anonymous_credentials(),
        )
    };
    let attestor = key_attestor(&key("p384.pub"));
    let warmup = push(&h, "sig-p256").await;
    h.reset_requests();
    let first = on(&registry)
        .verify(
            &request(
                format!("{warmup}:v1"),
                key_attestor(&key("cosign-p256.pub")),
                None,
            ),
            soon(),
        )
        .await
        .unwrap();
    assert!(first.is_verified(), "{first:?}");
    let cold_host = h.requests();
    eprintln!("cold host: {} requests: {cold_host:?}", cold_host.len());
    let count = |log: &[(String, String, u16)], pred: &dyn Fn(&str, &str) -> bool| {
        log.iter().filter(|(m, p, _)| pred(m, p)).count()
    };
    assert_eq!(count(&cold_host, &|_, p| p == "/v2/"), 1, "{cold_host:?}");
    assert_eq!(
        count(&cold_host, &|_, p| p.contains("/referrers/")),
        0,
        "{cold_host:?}"
    );

    let fresh = on(&registry);
    h.reset_requests();
    let cold = fresh
        .verify(&request(format!("{ed}:v1"), attestor.clone(), None), soon())
        .await
        .unwrap();
    assert!(cold.is_verified(), "{cold:?}");
    let cold_tag = h.requests();
    eprintln!("cold tag: {} requests: {cold_tag:?}", cold_tag.len());
    let digest = match &cold {
        Verification::Verified { digest, .. } => digest.clone(),
        other => panic!("{other:?}"),
    };
    let fallback = format!("/v2/ivory/sig-p384/manifests/{}", digest.replace(':', "-"));
    // HEAD, then .sig, then the signature blob(s): nothing else.
    assert_eq!(count(&cold_tag, &|m, _| m == "HEAD"), 1, "{cold_tag:?}");
    assert_eq!(
        count(&cold_tag, &|_, p| p.ends_with(".sig")),
        1,
        "{cold_tag:?}"
    );
    assert_eq!(count(&cold_tag, &|_, p| p == fallback), 0, "{cold_tag:?}");
    let blobs = count(&cold_tag, &|_, p| p.contains("/blobs/"));
    assert!(blobs >= 1, "{cold_tag:?}");
    assert_eq!(cold_tag.len(), 2 + blobs, "{cold_tag:?}");

    h.reset_requests();
    let warm = fresh
        .verify(&request(format!("{ed}:v1"), attestor.clone(), None), soon())
        .await
        .unwrap();
    assert_eq!(warm, cold);
    let started = ivory_clock::now();
    for _ in 0..1000 {
        fresh
            .verify(&request(format!("{ed}:v1"), attestor.clone(), None), soon())
            .await
            .unwrap();
    }
    eprintln!(
        "warm verify (tag ref, debug build): {:?} per call",
        started.elapsed() / 1000
    );
    let warm_requests = h.requests();
    assert!(
        warm_requests.is_empty(),
        "warm path hit the registry: {warm_requests:?}"
    );
    let stats = fresh.cache_stats();
    let tags = stats.iter().find(|s| s.cache == "tags").unwrap();
    let results = stats.iter().find(|s| s.cache == "results").unwrap();
    assert_eq!((tags.misses, tags.hits), (1, 1001), "{stats:?}");
    assert_eq!(
        (results.misses, results.hits, results.negative_hits),
        (1, 1001, 0)
    );

    // A digest reference: no HEAD, two round trips (.sig, then blobs).
    // Then 16 concurrent identical misses on another verifier.
    let by_digest = format!("{ed}@{digest}");
    let third = on(&registry);
    h.reset_requests();
    assert!(
        third
            .verify(&request(by_digest.clone(), attestor.clone(), None), soon())
            .await
            .unwrap()
            .is_verified()
    );
    let cold_digest = h.requests();
    eprintln!(
        "cold digest: {} requests: {cold_digest:?}",
        cold_digest.len()
    );
    assert_eq!(
        count(&cold_digest, &|m, _| m == "HEAD"),
        0,
        "{cold_digest:?}"
    );
    assert_eq!(cold_digest.len(), 1 + blobs, "{cold_digest:?}");

    let fourth = Arc::new(on(&registry));
    h.reset_requests();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (v, r) = (
                fourth.clone(),
                request(by_digest.clone(), attestor.clone(), None),
            );
            tokio::spawn(async move { v.verify(&r, soon()).await })
        })
        .collect();
    for t in tasks {
        assert!(t.await.unwrap().unwrap().is_verified());
    }
    let coalesced = h.requests();
    eprintln!("16 concurrent misses: {} requests", coalesced.len());
    let sorted = |log: &[(String, String, u16)]| {
        let mut v = log.to_vec();
        v.sort();
        v
    };
    assert_eq!(
        sorted(&coalesced),
        sorted(&cold_digest),
        "16 identical misses must share one fetch"
    );
    let results = fourth.cache_stats()[1].clone();
    assert_eq!(results.cache, "results");
    assert_eq!(
        results.misses + results.coalesced + results.hits,
        16,
        "{results:?}"
    );
    assert_eq!(results.misses, 1, "{results:?}");
}

/// Bundle-only images (cosign v3): the `.sig` tag is read first and is absent, then the
/// referrers; once a repository's signatures were found there, they are read first and the
/// `.sig` tag is not asked at all. A wrong key still reads both before saying "not verified".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signature_sources_are_read_in_the_order_they_were_last_found() {
    let h = RegistryHarness::start_default().await.unwrap();
    let v = verifier(&h);
    let image = format!("{}:v1", push(&h, "bundle-v3").await);
    let sig_reads =
        |log: &[(String, String, u16)]| log.iter().filter(|(_, p, _)| p.ends_with(".sig")).count();
    let bundle_reads = |log: &[(String, String, u16)]| {
        log.iter()
            .filter(|(_, p, _)| p.contains("/manifests/sha256-") && !p.ends_with(".sig"))
            .count()
    };

    h.reset_requests();
    let first = v
        .verify(
            &request(image.clone(), key_attestor(&key("cosign-p256.pub")), None),
            soon(),
        )
        .await
        .unwrap();
    assert!(first.is_verified(), "{first:?}");
    let log = h.requests();
    assert_eq!((sig_reads(&log), bundle_reads(&log)), (1, 1), "{log:?}");

    // The same key under another attestor hash (explicit hashAlgorithm): a verdict-cache miss.
    let mut explicit = key_attestor(&key("cosign-p256.pub"));
    if let Some(k) = explicit.cosign.as_mut().and_then(|c| c.key.as_mut()) {
        k.hash_algorithm = Some("sha256".into());
    }
    h.reset_requests();
    let second = v
        .verify(&request(image.clone(), explicit, None), soon())
        .await
        .unwrap();
    assert!(second.is_verified(), "{second:?}");
    let log = h.requests();
    assert_eq!((sig_reads(&log), bundle_reads(&log)), (0, 1), "{log:?}");

    h.reset_requests();
    let wrong = v
        .verify(
            &request(image, key_attestor(&key("cosign-p256-b.pub")), None),
            soon(),
        )
        .await
        .unwrap();
    assert!(!wrong.is_verified(), "{wrong:?}");
    let log = h.requests();
    assert_eq!((sig_reads(&log), bundle_reads(&log)), (1, 1), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_never_answers_ends_in_a_deadline_error() {
    let hung = HungRegistry::start().await.unwrap();
    let v = CosignVerifier::new(
        Registry::new(Config::default()).unwrap(),
        VerifierConfig::default(),
        CosignVerifier::anonymous_credentials(),
    );
    let image = format!("{}/ivory/hung:v1", hung.host());
    let started = ivory_clock::now();
    let deadline = started + Duration::from_millis(800);
    let err = v
        .verify(
            &request(image, key_attestor(&key("cosign-p256.pub")), None),
            deadline,
        )
        .await
        .unwrap_err();
    assert!(err.is_deadline(), "{err}");
    // A verdict that does not depend on the image (a notary attestor without certs) needs no
    // registry at all.
    let notary = Attestor {
        name: "n".into(),
        cosign: None,
        notary: Some(ivory_policy::types::Notary::default()),
    };
    let hung_image = format!("{}/ivory/hung:v1", hung.host());
    let verdict = v
        .verify(
            &request(hung_image, notary, None),
            ivory_clock::now() + Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(
        verdict,
        Verification::NotVerified {
            digest: None,
            reason: ivory_verify::Rejection::Attestor("notary.certs holds no certificate".into())
        }
    );
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "took {:?}",
        started.elapsed()
    );
}

/// A `manifest.json` attestor with file paths replaced by their contents, in Kyverno's shape.
fn manifest_attestor(name: &str, spec: &Value) -> Attestor {
    let mut spec = spec.clone();
    let read = |v: &Value| {
        std::fs::read_to_string(ivory_testkit::fixtures_dir().join(v.as_str().unwrap())).unwrap()
    };
    let c = spec.get_mut("cosign").unwrap();
    if let Some(k) = c.pointer_mut("/key/data") {
        *k = Value::from(read(k));
    }
    for field in ["cert", "certChain"] {
        if let Some(v) = c.get_mut("certificate").and_then(|x| x.get_mut(field)) {
            *v = serde_json::json!({ "value": read(v) });
        }
    }
    if let Some(v) = c.pointer_mut("/keyless/roots") {
        *v = Value::from(read(v));
    }
    if let Some(v) = c.get_mut("trustedRoot") {
        *v = serde_json::json!({ "value": read(v) });
    }
    let mut attestor: Attestor =
        serde_json::from_value(serde_json::json!({ "name": name })).unwrap();
    attestor.cosign = Some(serde_json::from_value(spec["cosign"].clone()).unwrap());
    attestor
}

/// Every check of `fixtures/manifest.json` (real cosign v2/v3 and sigstore-js signatures, with
/// cosign's own verdicts as the oracle), through the registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixtures_manifest_verdicts() {
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(ivory_testkit::fixtures_dir().join("manifest.json")).unwrap(),
    )
    .unwrap();
    let h = RegistryHarness::start_default().await.unwrap();
    let v = verifier(&h);
    let mut failures = Vec::new();
    let mut checked = 0;
    for image in manifest["images"].as_array().unwrap() {
        let layout = image["layout"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .to_owned();
        let repo = push(&h, &layout).await;
        let tag = image["tag"].as_str().unwrap();
        for check in image["checks"].as_array().unwrap() {
            let name = check["attestor"].as_str().unwrap();
            let attestor = manifest_attestor(name, &manifest["attestors"][name]);
            let attestation = check["predicateType"].as_str().map(|t| Attestation {
                name: "a".into(),
                intoto: Some(TypeRef { type_: t.into() }),
                referrer: None,
            });
            let got = v
                .verify(
                    &request(format!("{repo}:{tag}"), attestor, attestation),
                    soon(),
                )
                .await;
            let want = check["expect"] == "pass";
            checked += 1;
            match &got {
                Ok(verdict) if verdict.is_verified() == want => {}
                _ => failures.push(format!(
                    "{layout} {name} {} {:?}: want {}, got {got:?}",
                    check["check"], check["predicateType"], check["expect"]
                )),
            }
        }
    }
    eprintln!("{checked} manifest checks, {} mismatches", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_verdicts_are_cached_briefly() {
    let h = RegistryHarness::start_default().await.unwrap();
    let unsigned = push(&h, "unsigned").await;
    let config = Config {
        ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
        ..Config::default()
    };
    let short = VerifierConfig {
        negative_ttl: Duration::from_secs(3),
        ..VerifierConfig::default()
    };
    let v = CosignVerifier::new(
        Registry::new(config).unwrap(),
        short,
        CosignVerifier::anonymous_credentials(),
    );
    let digest = v
        .resolve_digest(&reference(&format!("{unsigned}:v1")), None, soon())
        .await
        .unwrap();
    let image = format!("{unsigned}@{digest}");
    let attestor = key_attestor(&key("cosign-p256.pub"));
    h.reset_requests();
    let first = v
        .verify(&request(image.clone(), attestor.clone(), None), soon())
        .await
        .unwrap();
    assert!(!first.is_verified());
    assert!(!h.requests().is_empty());
    h.reset_requests();
    let again = v
        .verify(&request(image.clone(), attestor.clone(), None), soon())
        .await
        .unwrap();
    assert_eq!(again, first);
    assert!(
        h.requests().is_empty(),
        "a fresh negative verdict is served from the cache"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    h.reset_requests();
    v.verify(&request(image, attestor, None), soon())
        .await
        .unwrap();
    assert!(
        !h.requests().is_empty(),
        "an expired negative verdict is fetched again"
    );
}

fn insecure(image: String) -> VerifyRequest {
    let mut r = request(image, key_attestor(&key("cosign-p256.pub")), None);
    r.credentials = Some(Credentials {
        allow_insecure_registry: Some(true),
        ..Credentials::default()
    });
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_errors_are_named_and_never_cached() {
    let f = FaultServer::start(FaultOptions::default()).await.unwrap();
    let v = CosignVerifier::new(
        Registry::new(Config::default()).unwrap(),
        VerifierConfig::default(),
        CosignVerifier::anonymous_credentials(),
    );
    let good = f.digest("good").unwrap().to_owned();

    // 503 on every manifest: a named error, and the next call asks the registry again.
    let broken = insecure(format!("{}/unavailable@{good}", f.host()));
    let deadline = ivory_clock::now() + Duration::from_secs(5);
    let err = v.verify(&broken, deadline).await.unwrap_err();
    assert!(
        !err.is_deadline() || ivory_clock::now() >= deadline,
        "{err}"
    );
    assert!(err.to_string().contains("unavailable"), "{err}");
    let before = f.requests().len();
    assert!(
        v.verify(&broken, ivory_clock::now() + Duration::from_secs(5))
            .await
            .is_err()
    );
    assert!(f.requests().len() > before, "errors must not be cached");

    // 429 twice, then answers: a definite verdict inside the deadline.
    let throttled = insecure(format!("{}/throttled:latest", f.host()));
    let verdict = v
        .verify(&throttled, ivory_clock::now() + Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        matches!(&verdict, Verification::NotVerified { reason, .. } if *reason.unsearched() == ivory_verify::Rejection::NoSignatures),
        "{verdict:?}"
    );

    // Connection refused: a named error, quickly. (`x` alone is no repository by ggcr's
    // grammar: before references were parsed at the seam, this asked nothing at all.)
    let refused = insecure(format!("{}/xx:v1", refused_host().unwrap()));
    let err = v
        .verify(&refused, ivory_clock::now() + Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ivory_engine::verifier::VerifyError::Unavailable { .. }),
        "{err}"
    );
}

/// `source.repository`: the image lives in one repository, its signatures in another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signatures_stored_in_another_repository() {
    let h = RegistryHarness::start_default().await.unwrap();
    let signatures = push(&h, "sig-p256").await;
    // The same image alone (no .sig) in another repository.
    let src = ivory_testkit::fixtures_dir().join("oci/ivory/sig-p256");
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("index.json")).unwrap()).unwrap();
    let entry = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == "v1")
        .unwrap();
    let blob = |d: &str| {
        std::fs::read(
            src.join("blobs/sha256")
                .join(d.trim_start_matches("sha256:")),
        )
        .unwrap()
    };
    let manifest_bytes = blob(entry["digest"].as_str().unwrap());
    let manifest: Value = serde_json::from_slice(&manifest_bytes).unwrap();
    let repo = "ivory/elsewhere";
    h.push_blob(repo, &blob(manifest["config"]["digest"].as_str().unwrap()))
        .await
        .unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        h.push_blob(repo, &blob(layer["digest"].as_str().unwrap()))
            .await
            .unwrap();
    }
    h.push_manifest(
        repo,
        "v1",
        entry["mediaType"].as_str().unwrap(),
        &manifest_bytes,
    )
    .await
    .unwrap();
    let image = format!("{}/{repo}:v1", h.host());

    let v = verifier(&h);
    let plain = v
        .verify(
            &request(image.clone(), key_attestor(&key("cosign-p256.pub")), None),
            soon(),
        )
        .await
        .unwrap();
    assert!(
        matches!(&plain, Verification::NotVerified { reason, .. } if *reason.unsearched() == ivory_verify::Rejection::NoSignatures),
        "{plain:?}"
    );
    let mut attestor = key_attestor(&key("cosign-p256.pub"));
    if let Some(c) = attestor.cosign.as_mut() {
        c.source = Some(Source {
            repository: Some(signatures),
            ..Source::default()
        });
    }
    let moved = v
        .verify(&request(image, attestor, None), soon())
        .await
        .unwrap();
    assert!(moved.is_verified(), "{moved:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_data_for_a_manifest_and_an_index() {
    let h = RegistryHarness::start_default().await.unwrap();
    let v = verifier(&h);
    let amd64 = ImagePlatform::default();
    let single = push(&h, "sig-p256").await;
    let data = v
        .image_data(&reference(&format!("{single}:v1")), None, &amd64, soon())
        .await
        .unwrap();
    assert_eq!(data["tag"], "v1");
    assert!(data["digest"].as_str().unwrap().starts_with("sha256:"));
    assert!(data.get("imageIndex").is_none(), "{data}");
    assert!(data["config"].is_object(), "{data}");
    assert_eq!(
        data["resolvedImage"],
        format!("{single}:v1@{}", data["digest"].as_str().unwrap())
    );
    let index = push(&h, "sig-index").await;
    let data = v
        .image_data(&reference(&format!("{index}:v1")), None, &amd64, soon())
        .await
        .unwrap();
    assert!(data["imageIndex"]["manifests"].is_array(), "{data}");
    assert!(data["manifest"]["layers"].is_array(), "{data}");
    assert_eq!(data["config"]["architecture"], "amd64", "{data}");
    let arm64 = ImagePlatform {
        os: "linux".into(),
        architecture: "arm64".into(),
        allowed: Default::default(),
    };
    let data = v
        .image_data(&reference(&format!("{index}:v1")), None, &arm64, soon())
        .await
        .unwrap();
    assert_eq!(data["config"]["architecture"], "arm64", "{data}");
}

/// A TCP proxy on loopback that holds every chunk the client sends for `delay` before
/// passing it on: each request (and TLS handshake flight) takes `delay` longer.
struct SlowProxy {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl SlowProxy {
    async fn start(upstream: String, delay: Duration) -> Self {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = cr.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            tokio::time::sleep(delay).await;
                            if sw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = sw.shutdown().await;
                    };
                    let down = async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                        let _ = cw.shutdown().await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        Self { addr, task }
    }

    fn host(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A shared (coalesced) load runs on its own budget: a short-deadline caller gives up at its
/// deadline without failing a longer-deadline caller waiting on the same load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_callers_keep_their_own_deadlines() {
    let h = RegistryHarness::start_default().await.unwrap();
    push(&h, "sig-p384").await;
    let slow = SlowProxy::start(h.host().to_owned(), Duration::from_millis(250)).await;
    let attestor = key_attestor(&key("p384.pub"));
    let image = format!("{}/ivory/sig-p384:v1", slow.host());
    for shared_cache in ["tags", "results"] {
        let v = Arc::new(verifier(&h));
        if shared_cache == "results" {
            // Resolve first so the two callers meet in the verdict cache, not the tag cache.
            v.resolve_digest(&reference(&image), None, soon())
                .await
                .unwrap();
        }
        // Cold, a verification takes 2 s and more through the proxy; warm connections and a
        // known digest, still at least two 250 ms round trips.
        let short = Duration::from_millis(if shared_cache == "tags" { 1200 } else { 400 });
        let started = ivory_clock::now();
        let a = {
            let (v, r) = (v.clone(), request(image.clone(), attestor.clone(), None));
            tokio::spawn(async move {
                let res = v.verify(&r, started + short).await;
                (res, ivory_clock::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let b = {
            let (v, r) = (v.clone(), request(image.clone(), attestor.clone(), None));
            tokio::spawn(async move { v.verify(&r, started + Duration::from_secs(20)).await })
        };
        let (a, a_done) = a.await.unwrap();
        let err = a.unwrap_err();
        assert!(err.is_deadline(), "{shared_cache}: {err}");
        let late = a_done.saturating_duration_since(started + short);
        assert!(
            late < Duration::from_millis(200),
            "{shared_cache}: A answered {late:?} late"
        );
        let b = b.await.unwrap();
        assert!(
            b.as_ref().is_ok_and(Verification::is_verified),
            "{shared_cache}: B must get the verdict: {b:?} after {:?}",
            started.elapsed()
        );
        eprintln!("{shared_cache}: B verified after {:?}", started.elapsed());
    }
}

/// The detached-load rule: a shared load outlives the caller that started it. The only caller
/// gives up at its deadline; the next caller finds the verdict cached or the same load still
/// running, and never starts a load of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_whose_only_caller_gave_up_still_fills_the_cache() {
    let h = RegistryHarness::start_default().await.unwrap();
    push(&h, "sig-p384").await;
    let slow = SlowProxy::start(h.host().to_owned(), Duration::from_millis(250)).await;
    let attestor = key_attestor(&key("p384.pub"));
    let image = format!("{}/ivory/sig-p384:v1", slow.host());
    let v = verifier(&h);
    // Through the proxy a cold verification needs several 250 ms round trips.
    let err = v
        .verify(
            &request(image.clone(), attestor.clone(), None),
            ivory_clock::now() + Duration::from_millis(300),
        )
        .await
        .unwrap_err();
    assert!(err.is_deadline(), "{err}");
    let verdict = v
        .verify(&request(image, attestor, None), soon())
        .await
        .unwrap();
    assert!(verdict.is_verified(), "{verdict:?}");
    // The first caller gave up while resolving the tag.
    let tags = &v.cache_stats()[0];
    assert_eq!(tags.misses, 1, "one tag resolution: {tags:?}");
    assert_eq!(tags.hits + tags.coalesced, 1, "{tags:?}");
}

/// The retry-once rule: a caller that joined a load started before it arrived, and that load
/// failed, tries once more with a load of its own instead of inheriting the earlier failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_joined_a_failed_load_retries_once_with_its_own() {
    let h = RegistryHarness::start(HarnessOptions::plain_http())
        .await
        .unwrap();
    push(&h, "sig-p384").await;
    let proxy = FirstManifestFails::start(h.host().to_owned(), Duration::from_millis(1500)).await;
    let image = format!("{}/ivory/sig-p384:v1", proxy.addr);
    let v = Arc::new(verifier(&h));
    let request = || {
        let mut r = request(image.clone(), key_attestor(&key("p384.pub")), None);
        r.credentials = Some(Credentials {
            allow_insecure_registry: Some(true),
            ..Credentials::default()
        });
        r
    };
    let first = {
        let (v, r) = (v.clone(), request());
        tokio::spawn(async move { v.verify(&r, soon()).await })
    };
    // Joins the first caller's tag resolution, whose manifest request the proxy fails.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = v.verify(&request(), soon()).await.unwrap();
    assert!(second.is_verified(), "{second:?}");
    let first = first.await.unwrap().unwrap_err();
    assert_eq!(
        first.kind(),
        ivory_engine::verifier::ErrorKind::Unavailable,
        "{first}"
    );
    let tags = &v.cache_stats()[0];
    assert_eq!((tags.misses, tags.coalesced), (2, 1), "{tags:?}");
}

/// A plain-HTTP proxy on loopback that answers the first manifest request with a 500 after
/// `hold`, and passes everything else through.
struct FirstManifestFails {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl FirstManifestFails {
    async fn start(upstream: String, hold: Duration) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let failed = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, failed) = (upstream.clone(), failed.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut cr, cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let cw = Arc::new(tokio::sync::Mutex::new(cw));
                    let down = {
                        let cw = cw.clone();
                        tokio::spawn(async move {
                            let mut buf = vec![0u8; 64 * 1024];
                            while let Ok(n @ 1..) = sr.read(&mut buf).await {
                                if cw.lock().await.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        })
                    };
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = cr.read(&mut buf).await {
                        let manifest = buf[..n].windows(11).any(|w| w == b"/manifests/");
                        if manifest && !failed.swap(true, Ordering::SeqCst) {
                            tokio::time::sleep(hold).await;
                            down.abort();
                            let mut cw = cw.lock().await;
                            let _ = cw
                                .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                                .await;
                            let _ = cw.shutdown().await;
                            return;
                        }
                        if sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    down.abort();
                });
            }
        });
        Self { addr, task }
    }
}

impl Drop for FirstManifestFails {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Policy credentials naming `secret` resolve to alice's login; any other set is anonymous.
fn alice_or_anonymous(host: String) -> ivory_verify::CredentialsResolver {
    Arc::new(move |c: Option<&Credentials>| {
        let insecure = c.and_then(|c| c.allow_insecure_registry).unwrap_or(false);
        let base = ivory_registry::Credentials::anonymous().allow_insecure(insecure);
        if c.is_some_and(|c| c.secrets.iter().any(|s| s == "alice")) {
            base.with_basic(&host, "alice", "s3cret")
        } else {
            base
        }
    })
}

fn manifest_requests(h: &Harness) -> usize {
    h.requests()
        .iter()
        .filter(|(_, path, _)| path.contains("/manifests/v1"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolved_tag_is_never_reused_across_credential_sets() {
    let h = RegistryHarness::start(HarnessOptions::basic("alice", "s3cret"))
        .await
        .unwrap();
    let image = format!("{}:v1", push(&h, "unsigned").await);
    let config = Config {
        ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
        ..Config::default()
    };
    let v = CosignVerifier::new(
        Registry::new(config).unwrap(),
        VerifierConfig::default(),
        alice_or_anonymous(h.host().to_owned()),
    );
    let alice = Credentials {
        secrets: vec!["alice".into()],
        ..Credentials::default()
    };
    let digest = v
        .resolve_digest(&reference(&image), Some(&alice), soon())
        .await
        .unwrap();
    assert!(digest.starts_with("sha256:"), "{digest}");

    // Anonymous: the registry refuses, and alice's cached answer must not stand in for it.
    let anonymous = v.resolve_digest(&reference(&image), None, soon()).await;
    let err = anonymous.expect_err("anonymous must not see alice's digest");
    assert_eq!(
        err.kind(),
        ivory_engine::verifier::ErrorKind::Unavailable,
        "{err}"
    );

    // The insecure flag is part of the set too: same login, another cache entry.
    let alice_insecure = Credentials {
        allow_insecure_registry: Some(true),
        ..alice.clone()
    };
    h.reset_requests();
    let again = v
        .resolve_digest(&reference(&image), Some(&alice_insecure), soon())
        .await
        .unwrap();
    assert_eq!(again, digest);
    assert!(manifest_requests(&h) >= 1, "{:?}", h.requests());

    // The same set within the TTL is served from the cache.
    h.reset_requests();
    let cached = v
        .resolve_digest(&reference(&image), Some(&alice), soon())
        .await
        .unwrap();
    assert_eq!(cached, digest);
    assert_eq!(manifest_requests(&h), 0, "{:?}", h.requests());
}

/// Tiny objects past the signature JSON limits: a tree of thousands of map nodes per blob.
fn ballooning_json() -> Vec<u8> {
    let n = ivory_registry::JsonLimits::SIGNATURE.max_objects + 1;
    format!("[{}]", vec![r#"{"balloon":0}"#; n].join(",")).into_bytes()
}

/// Pushes a cosign-style `.sig`/`.att` manifest for `digest` with one layer.
async fn push_cosign_tag(
    h: &Harness,
    repo: &str,
    digest: &str,
    suffix: &str,
    layer_media_type: &str,
    layer: &[u8],
    annotations: Value,
) {
    let config = h.push_blob(repo, b"{}").await.unwrap();
    let layer_digest = h.push_blob(repo, layer).await.unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 2 },
        "layers": [{ "mediaType": layer_media_type, "digest": layer_digest,
                     "size": layer.len(), "annotations": annotations }],
    });
    let tag = format!("{}.{suffix}", digest.replace(':', "-"));
    h.push_manifest(
        repo,
        &tag,
        "application/vnd.oci.image.manifest.v1+json",
        manifest.to_string().as_bytes(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ballooning_signature_and_attestation_blobs_are_not_verified_with_the_reason() {
    use base64::Engine as _;
    let h = RegistryHarness::start_default().await.unwrap();
    let repo = "ivory/hostile-json";
    let tags = h
        .push_oci_layout(
            &ivory_testkit::fixtures_dir().join("oci/ivory/unsigned"),
            repo,
        )
        .await
        .unwrap();
    let digest = tags["v1"].clone();
    let signer = ivory_testkit::CosignSigner::generate().unwrap();
    let payload = ballooning_json();
    let signature =
        base64::engine::general_purpose::STANDARD.encode(signer.sign(&payload).unwrap());
    push_cosign_tag(
        &h,
        repo,
        &digest,
        "sig",
        "application/vnd.dev.cosign.simplesigning.v1+json",
        &payload,
        serde_json::json!({ "dev.cosignproject.cosign/signature": signature }),
    )
    .await;
    push_cosign_tag(
        &h,
        repo,
        &digest,
        "att",
        "application/vnd.dsse.envelope.v1+json",
        &ballooning_json(),
        serde_json::json!({}),
    )
    .await;
    let v = verifier(&h);
    let image = format!("{}/{repo}:v1", h.host());
    let spdx = Attestation {
        name: "sbom".into(),
        intoto: Some(TypeRef {
            type_: "https://spdx.dev/Document".into(),
        }),
        referrer: None,
    };
    for (attestation, what) in [
        (None, "simple-signing payload"),
        (Some(spdx), "DSSE envelope"),
    ] {
        let got = v
            .verify(
                &request(image.clone(), key_attestor(&signer.public_pem), attestation),
                soon(),
            )
            .await
            .unwrap();
        let Verification::NotVerified { reason, digest: d } = &got else {
            panic!("{what}: {got:?}")
        };
        let reason = reason.to_string();
        assert_eq!(d.as_deref(), Some(digest.as_str()));
        assert!(
            reason.contains(&format!("{what} refused as hostile: it holds")),
            "{what}: {reason}"
        );
        assert!(!reason.contains("balloon"), "{what}: {reason}");
    }
}

/// A background scan's view (`revalidating`) reaches again a verdict cached before the scan
/// started: a signature deleted from the registry shows up at the scan, not when the cached
/// positive verdict expires (an hour by default); the scan's verdict then serves the rest of the
/// scan and the admissions that follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_scan_notices_a_deleted_signature_and_admissions_follow_it() {
    let h = RegistryHarness::start_default().await.unwrap();
    let v = verifier(&h);
    let req = signed_p256(&h, &v).await;
    let digest = req.image.digest().unwrap_or_default().to_owned();
    assert!(v.verify(&req, soon()).await.unwrap().is_verified());

    // Distribution deletes a manifest by its digest only.
    let client = h.http_client().unwrap();
    let sig_tag = format!(
        "{}/v2/ivory/sig-p256/manifests/{}.sig",
        h.base_url(),
        digest.replace(':', "-")
    );
    let head = client
        .head(&sig_tag)
        .header(
            "Accept",
            "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json",
        )
        .send()
        .await
        .unwrap();
    let sig_digest = head.headers()["docker-content-digest"]
        .to_str()
        .unwrap()
        .to_owned();
    let deleted = client
        .delete(format!(
            "{}/v2/ivory/sig-p256/manifests/{sig_digest}",
            h.base_url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status().as_u16(), 202, "{deleted:?}");

    h.reset_requests();
    assert!(
        v.verify(&req, soon()).await.unwrap().is_verified(),
        "an admission keeps the cached verdict"
    );
    assert!(h.requests().is_empty());

    let scan = v
        .revalidating(ivory_clock::now())
        .expect("CosignVerifier caches verdicts, so it has a revalidating view");
    let rescanned = scan.verify(&req, soon()).await.unwrap();
    assert!(!rescanned.is_verified(), "{rescanned:?}");
    assert!(!h.requests().is_empty(), "the scan read the registry");

    h.reset_requests();
    assert_eq!(scan.verify(&req, soon()).await.unwrap(), rescanned);
    assert!(
        h.requests().is_empty(),
        "a verdict reached during the scan serves the rest of it"
    );
    assert_eq!(
        v.verify(&req, soon()).await.unwrap(),
        rescanned,
        "admissions follow the scan's verdict"
    );
}

/// `ivory.dev/verify-platforms` in the verifier: every selected platform manifest must verify,
/// a failure names the platform, and a warm verification reads nothing from the registry (the
/// index's children and each manifest's verdict are cached by digest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn platform_manifests_are_verified_each_by_digest_and_cached() {
    use ivory_engine::verifier::{PlatformScope, PlatformSet};
    let h = RegistryHarness::start_default().await.unwrap();
    let signer = ivory_testkit::CosignSigner::generate().unwrap();
    let repo = "ivory/two-platforms";
    let (index, children) = h
        .push_platform_index(repo, "v1", &[("linux", "amd64"), ("linux", "arm64")])
        .await
        .unwrap();
    h.push_cosign_signature(repo, &children[0], &signer)
        .await
        .unwrap();
    let v = verifier(&h);
    let image = format!("{}/{repo}:v1", h.host());
    let scoped = |platforms: PlatformScope| VerifyRequest {
        platforms,
        ..request(image.clone(), key_attestor(&signer.public_pem), None)
    };
    let arch = |a: &str| PlatformSet {
        architecture: Some([a.to_owned()].into()),
        ..PlatformSet::default()
    };

    let all = v
        .verify(
            &scoped(PlatformScope::Platforms(PlatformSet::default())),
            soon(),
        )
        .await
        .unwrap();
    let Verification::NotVerified { digest, reason } = &all else {
        panic!("{all:?}")
    };
    let reason = reason.to_string();
    assert_eq!(digest.as_deref(), Some(index.as_str()));
    assert!(
        reason.starts_with(&format!("platform linux/arm64 ({}): ", children[1])),
        "{reason}"
    );
    let index_only = v
        .verify(&scoped(PlatformScope::Index), soon())
        .await
        .unwrap();
    assert!(!index_only.is_verified(), "the index itself is not signed");

    let amd64 = scoped(PlatformScope::Platforms(arch("amd64")));
    let verified = v.verify(&amd64, soon()).await.unwrap();
    let Verification::Verified {
        digest, signer: by, ..
    } = &verified
    else {
        panic!("{verified:?}")
    };
    assert_eq!(digest, &index, "the answer names the image's own digest");
    assert!(by.as_ref().and_then(|s| s.key.as_ref()).is_some());
    let none = v
        .verify(&scoped(PlatformScope::Platforms(arch("s390x"))), soon())
        .await
        .unwrap();
    let Verification::NotVerified { reason, .. } = &none else {
        panic!("{none:?}")
    };
    assert_eq!(
        reason.to_string(),
        "the image index has no manifest for the platforms to verify (*/s390x)"
    );

    h.reset_requests();
    let again = v.verify(&amd64, soon()).await.unwrap();
    assert!(again.is_verified());
    let asked: Vec<String> = h
        .requests()
        .into_iter()
        .map(|(method, path, _)| format!("{method} {path}"))
        .filter(|r| !r.ends_with(" /v2/"))
        .collect();
    assert!(asked.is_empty(), "a warm verification asked {asked:?}");
}

/// `ivory.dev/verify-platforms` reads an index as containerd does when a node picks its manifest:
/// an entry without `platform` is placed by its image config, `linux/x86_64` and `Linux/AMD64`
/// are linux/amd64 (containerd runs the first entry that matches, so an unsigned one listed
/// before the signed one is what runs), and a nested index is descended into (its own signature
/// vouches for none of its manifests). The unsigned manifest a node would run is not verified;
/// once signed, the image is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn platform_manifests_are_placed_as_containerd_places_them() {
    use ivory_engine::verifier::{PlatformScope, PlatformSet};
    use serde_json::json;
    let h = RegistryHarness::start_default().await.unwrap();
    let signer = ivory_testkit::CosignSigner::generate().unwrap();
    let repo = "ivory/containerd-platforms";
    let (_, children) = h
        .push_platform_index(
            repo,
            "parts",
            &[
                ("linux", "amd64"),
                ("linux", "arm64"),
                ("linux", "x86_64"),
                ("Linux", "AMD64"),
            ],
        )
        .await
        .unwrap();
    let [amd64, arm64, x86_64, upper] = [0, 1, 2, 3].map(|n| children[n].clone());
    h.push_cosign_signature(repo, &amd64, &signer)
        .await
        .unwrap();
    // Descriptors as containerd checks them: the size of what the digest names.
    let registry = Registry::new(Config {
        ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
        ..Config::default()
    })
    .unwrap();
    let mut sizes = std::collections::HashMap::new();
    for digest in &children {
        let pinned = reference(&format!("{}/{repo}@{digest}", h.host()));
        let anonymous = ivory_registry::Credentials::anonymous();
        let manifest = registry
            .fetch_manifest(&pinned, &anonymous, soon())
            .await
            .unwrap();
        sizes.insert(digest.clone(), manifest.bytes.len());
    }
    let entry = |digest: &str, platform: Option<(&str, &str)>| {
        let mut entry = json!({
            "mediaType": ivory_testkit::OCI_MANIFEST,
            "digest": digest,
            "size": sizes.get(digest).copied().unwrap_or_default(),
        });
        if let Some((os, architecture)) = platform {
            entry["platform"] = json!({"os": os, "architecture": architecture});
        }
        entry
    };
    // An index nested in the index, signed as a whole: containerd descends into it and runs
    // its arm64 manifest, which is unsigned.
    let mut nested = entry(&arm64, Some(("linux", "arm64")));
    let inner =
        json!({"schemaVersion": 2, "mediaType": ivory_testkit::OCI_INDEX, "manifests": [nested]})
            .to_string();
    let inner_digest = h
        .push_manifest(repo, "inner", ivory_testkit::OCI_INDEX, inner.as_bytes())
        .await
        .unwrap();
    h.push_cosign_signature(repo, &inner_digest, &signer)
        .await
        .unwrap();
    nested = entry(&inner_digest, Some(("linux", "arm64")));
    nested["mediaType"] = ivory_testkit::OCI_INDEX.into();
    nested["size"] = inner.len().into();
    for (tag, entries) in [
        (
            "nested",
            vec![entry(&amd64, Some(("linux", "amd64"))), nested],
        ),
        (
            "no-platform",
            vec![entry(&amd64, Some(("linux", "amd64"))), entry(&arm64, None)],
        ),
        (
            "x86_64",
            vec![
                entry(&x86_64, Some(("linux", "x86_64"))),
                entry(&amd64, Some(("linux", "amd64"))),
            ],
        ),
        (
            "upper",
            vec![
                entry(&upper, Some(("Linux", "AMD64"))),
                entry(&amd64, Some(("linux", "amd64"))),
            ],
        ),
    ] {
        let index = json!({
            "schemaVersion": 2,
            "mediaType": ivory_testkit::OCI_INDEX,
            "manifests": entries,
        });
        h.push_manifest(
            repo,
            tag,
            ivory_testkit::OCI_INDEX,
            index.to_string().as_bytes(),
        )
        .await
        .unwrap();
    }
    let pod = |os: &str, architecture: &str| PlatformSet {
        os: Some([os.to_owned()].into()),
        architecture: Some([architecture.to_owned()].into()),
    };
    let scoped = |tag: &str, set: PlatformSet| VerifyRequest {
        platforms: PlatformScope::Platforms(set),
        ..request(
            format!("{}/{repo}:{tag}", h.host()),
            key_attestor(&signer.public_pem),
            None,
        )
    };
    // Why `verification` is not the denial naming the unsigned `platform` manifest, if it is not.
    let not_denied = |verification: Verification, platform: &str, digest: &str| {
        let wanted = format!("platform {platform} ({digest}): ");
        match &verification {
            Verification::NotVerified { reason, .. } if reason.to_string().starts_with(&wanted) => {
                None
            }
            other => Some(format!("{platform} {digest}: {other:?}")),
        }
    };
    let questions = [
        (
            scoped("no-platform", PlatformSet::default()),
            "linux/arm64",
            &arm64,
        ),
        (
            scoped("no-platform", pod("linux", "arm64")),
            "linux/arm64",
            &arm64,
        ),
        (
            scoped("x86_64", pod("linux", "amd64")),
            "linux/amd64",
            &x86_64,
        ),
        (
            scoped("x86_64", PlatformSet::default()),
            "linux/amd64",
            &x86_64,
        ),
        (
            scoped("nested", PlatformSet::default()),
            "linux/arm64",
            &arm64,
        ),
        (
            scoped("nested", pod("linux", "arm64")),
            "linux/arm64",
            &arm64,
        ),
        (
            scoped("upper", pod("linux", "amd64")),
            "linux/amd64",
            &upper,
        ),
    ];
    let v = verifier(&h);
    let mut admitted = Vec::new();
    for (question, platform, digest) in &questions {
        let verdict = v.verify(question, soon()).await.unwrap();
        admitted.extend(not_denied(verdict, platform, digest));
    }
    assert!(
        admitted.is_empty(),
        "unsigned manifests a node would run, not denied: {admitted:#?}"
    );
    let elsewhere = v
        .verify(&scoped("no-platform", pod("linux", "amd64")), soon())
        .await
        .unwrap();
    assert!(
        elsewhere.is_verified(),
        "its config places the entry on arm64, where an amd64 node does not run it: {elsewhere:?}"
    );

    for digest in [&arm64, &x86_64, &upper] {
        h.push_cosign_signature(repo, digest, &signer)
            .await
            .unwrap();
    }
    let v = verifier(&h);
    for (question, platform, _) in &questions {
        let verdict = v.verify(question, soon()).await.unwrap();
        assert!(verdict.is_verified(), "{platform}: {verdict:?}");
    }
}

/// Nested indexes a registry serves to make one admission fetch without end: more nested
/// indexes than the platform cap allows are not verified (and not all fetched), and nesting
/// deeper than `MAX_INDEX_DEPTH` is refused as hostile, naming the image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_indexes_are_bounded_in_number_and_depth() {
    use ivory_engine::verifier::{ErrorKind, PlatformScope, PlatformSet};
    use serde_json::json;
    let h = RegistryHarness::start_default().await.unwrap();
    let signer = ivory_testkit::CosignSigner::generate().unwrap();
    let repo = "ivory/nested-indexes";
    let (_, children) = h
        .push_platform_index(repo, "parts", &[("linux", "amd64")])
        .await
        .unwrap();
    let index_of = |entries: Vec<serde_json::Value>| {
        json!({"schemaVersion": 2, "mediaType": ivory_testkit::OCI_INDEX, "manifests": entries})
            .to_string()
    };
    let nested_entry = |digest: &str, size: usize| json!({"mediaType": ivory_testkit::OCI_INDEX, "digest": digest, "size": size});
    let all = |tag: &str| VerifyRequest {
        platforms: PlatformScope::Platforms(PlatformSet::default()),
        ..request(
            format!("{}/{repo}:{tag}", h.host()),
            key_attestor(&signer.public_pem),
            None,
        )
    };

    // 100 distinct nested indexes, each holding the one manifest.
    let mut wide = Vec::new();
    for n in 0..100 {
        let entry = json!({"mediaType": ivory_testkit::OCI_MANIFEST, "digest": children[0], "size": 1, "annotations": {"n": n.to_string()}});
        let inner = index_of(vec![entry]);
        let digest = h
            .push_manifest(
                repo,
                &format!("inner-{n}"),
                ivory_testkit::OCI_INDEX,
                inner.as_bytes(),
            )
            .await
            .unwrap();
        wide.push(nested_entry(&digest, inner.len()));
    }
    let wide = index_of(wide);
    h.push_manifest(repo, "wide", ivory_testkit::OCI_INDEX, wide.as_bytes())
        .await
        .unwrap();
    let v = verifier(&h);
    h.reset_requests();
    let verdict = v.verify(&all("wide"), soon()).await.unwrap();
    let Verification::NotVerified { reason, .. } = &verdict else {
        panic!("{verdict:?}")
    };
    assert_eq!(
        reason.to_string(),
        "the image index lists more than 64 platform manifests; ivory verifies at most 64"
    );
    let fetched = h
        .requests()
        .into_iter()
        .filter(|(method, path, _)| method == "GET" && path.contains("/manifests/sha256:"))
        .count();
    assert!(fetched <= 66, "{fetched} manifests fetched");

    // Six levels of nesting.
    let (mut digest, mut size) = (children[0].clone(), 1);
    for level in 0..6 {
        let inner = index_of(vec![nested_entry(&digest, size)]);
        digest = h
            .push_manifest(
                repo,
                &format!("deep-{level}"),
                ivory_testkit::OCI_INDEX,
                inner.as_bytes(),
            )
            .await
            .unwrap();
        size = inner.len();
    }
    let err = v.verify(&all("deep-5"), soon()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Hostile, "{err}");
    assert!(err.to_string().contains("nesting deeper than 4"), "{err}");
}

/// `verify_known` answers from the verdict cache under the key `verify` uses, counts a hit as
/// `verify` would, and leaves to `verify` what it cannot answer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_verdict_is_known_at_once_under_the_key_verify_keeps_it_by() {
    use ivory_engine::verifier::{PlatformScope, PlatformSet};
    let h = RegistryHarness::start_default().await.unwrap();
    let v = verifier(&h);
    let repo = push(&h, "sig-p256").await;
    let tag = format!("{repo}:v1");
    let digest = v
        .resolve_digest(&reference(&tag), None, soon())
        .await
        .unwrap();
    let pinned = format!("{repo}@{digest}");
    let trusted = request(pinned.clone(), key_attestor(&key("cosign-p256.pub")), None);
    let untrusted = request(
        pinned.clone(),
        key_attestor(&key("untrusted-p256.pub")),
        None,
    );
    let results = |v: &CosignVerifier| {
        let r = v.cache_stats()[1].clone();
        (r.hits, r.negative_hits)
    };

    assert_eq!(v.verify_known(&trusted), None, "nothing kept yet");
    let verified = v.verify(&trusted, soon()).await.unwrap();
    assert!(verified.is_verified(), "{verified:?}");
    let refused = v.verify(&untrusted, soon()).await.unwrap();
    assert!(!refused.is_verified(), "{refused:?}");
    assert_eq!(results(&v), (0, 0));

    h.reset_requests();
    assert_eq!(v.verify_known(&trusted), Some(verified));
    assert_eq!(v.verify_known(&untrusted), Some(refused));
    assert_eq!(results(&v), (2, 1), "counted as verify counts its hits");
    assert!(h.requests().is_empty(), "{:?}", h.requests());

    // Other questions about the same digest have verdicts of their own.
    let slsa = Attestation {
        name: "slsa".into(),
        intoto: Some(TypeRef {
            type_: "https://slsa.dev/provenance/v1".into(),
        }),
        referrer: None,
    };
    let attested = request(
        pinned.clone(),
        key_attestor(&key("cosign-p256.pub")),
        Some(slsa),
    );
    assert_eq!(v.verify_known(&attested), None);
    // A tag is resolved first, and the index's platform manifests are verified one by one:
    // both are left to `verify`, even with the index's own verdict kept.
    let by_tag = request(tag, key_attestor(&key("cosign-p256.pub")), None);
    assert!(v.verify(&by_tag, soon()).await.unwrap().is_verified());
    assert_eq!(v.verify_known(&by_tag), None);
    let platforms = VerifyRequest {
        platforms: PlatformScope::Platforms(PlatformSet::default()),
        ..trusted.clone()
    };
    assert_eq!(v.verify_known(&platforms), None);
    assert_eq!(
        results(&v).0,
        3,
        "only the tag's own verification hit: {:?}",
        results(&v)
    );
}

/// A held verdict (what lets the validating stage reuse a route's decision) is held while the
/// verifier keeps that very verdict: never by another verifier, never for another answer, and
/// no longer once it expires or the trust roots change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_verdict_ends_with_its_expiry_its_trust_root_and_its_verifier() {
    use ivory_verify::{TrustRoots, TrustSource};
    let h = RegistryHarness::start_default().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root_file = dir.path().join("trusted_root.json");
    let captured = ivory_testkit::fixtures_dir().join("captured/trust");
    std::fs::copy(captured.join("public-good.trusted_root.json"), &root_file).unwrap();
    let roots = TrustRoots::new(
        TrustSource::File(root_file.clone()),
        &Registry::new(Config::default()).unwrap(),
        Default::default(),
    )
    .unwrap();
    let built = |verified_ttl: Duration, roots: TrustRoots| {
        let config = VerifierConfig {
            verified_ttl,
            trust_roots: roots,
            ..VerifierConfig::default()
        };
        verifier_with(&h, config)
    };
    let v = built(Duration::from_secs(3600), roots.clone());
    let trusted = signed_p256(&h, &v).await;
    let digest = trusted.image.digest().unwrap_or_default().to_owned();
    assert!(
        v.hold_verdict(
            &trusted,
            &Verification::Verified {
                digest: digest.clone(),
                payload: None,
                signer: None,
            }
        )
        .is_none(),
        "nothing kept yet"
    );
    let verified = v.verify(&trusted, soon()).await.unwrap();
    assert!(verified.is_verified(), "{verified:?}");
    let held = v
        .hold_verdict(&trusted, &verified)
        .expect("the kept verdict is held");
    h.reset_requests();
    assert!(v.still_holds(&held));
    assert!(
        v.still_holds(&held),
        "checking asks nothing and changes nothing"
    );
    assert!(h.requests().is_empty(), "{:?}", h.requests());

    // Another verdict replaced in the cache: the held one is looked up once, and still held.
    let untrusted = VerifyRequest {
        attestor: key_attestor(&key("untrusted-p256.pub")),
        ..trusted.clone()
    };
    assert!(!v.verify(&untrusted, soon()).await.unwrap().is_verified());
    let scan = v.revalidating(ivory_clock::now()).expect("a scan");
    assert!(!scan.verify(&untrusted, soon()).await.unwrap().is_verified());
    assert!(v.still_holds(&held), "another key's change ends nothing");
    // The scan verifies this image again: what it keeps is another verdict, and the held one
    // ends as the scan returns.
    assert!(scan.verify(&trusted, soon()).await.unwrap().is_verified());
    assert!(!v.still_holds(&held), "replaced by the scan's verdict");
    let held = v
        .hold_verdict(&trusted, &verified)
        .expect("the scan's verdict is held");
    assert!(v.still_holds(&held));

    let refused = Verification::NotVerified {
        digest: Some(digest.clone()),
        reason: ivory_engine::verifier::Rejection::NoSignatures,
    };
    assert!(
        v.hold_verdict(&trusted, &refused).is_none(),
        "another answer is not held"
    );

    // Another verifier with the same registry and the same verdict kept does not hold it.
    let other = built(Duration::from_secs(3600), roots.clone());
    assert!(other.verify(&trusted, soon()).await.unwrap().is_verified());
    assert!(!other.still_holds(&held));

    // A new trust root: the verdict reached under the old one is no longer held.
    std::fs::copy(
        captured.join("github.trusted_root.kyverno.json"),
        &root_file,
    )
    .unwrap();
    assert!(roots.refresh().await.unwrap(), "the root changed");
    assert!(!v.still_holds(&held));

    // A verdict that expires.
    let brief = built(Duration::from_millis(300), TrustRoots::embedded());
    let kept = brief.verify(&trusted, soon()).await.unwrap();
    let held = brief.hold_verdict(&trusted, &kept).expect("held");
    assert!(brief.still_holds(&held));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!brief.still_holds(&held), "expired");
}

/// cosign v3's fallback index for `bundle-v3` (image digest, the index), from its fixture layout.
fn bundle_v3_fallback() -> (String, Value) {
    let dir = ivory_testkit::fixtures_dir().join("oci/ivory/bundle-v3");
    let layout: Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let tag_of = |e: &&Value| {
        e["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .map(str::to_owned)
    };
    let entries = layout["manifests"].as_array().unwrap();
    let image = entries
        .iter()
        .find(|e| tag_of(e).as_deref() == Some("v1"))
        .unwrap();
    let digest = image["digest"].as_str().unwrap().to_owned();
    let fallback = entries
        .iter()
        .find(|e| tag_of(e) == Some(digest.replace(':', "-")))
        .unwrap();
    let hex = fallback["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:");
    let index = serde_json::from_slice(&std::fs::read(dir.join("blobs/sha256").join(hex)).unwrap())
        .unwrap();
    (digest, index)
}

/// The referrers fallback index is read whatever its descriptors say, within the count cap: at
/// most `max_signatures` manifests are fetched, those labelled as bundles first, and a
/// manifest that is not a Sigstore bundle (an SBOM here) costs its manifest only, never a blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_index_is_read_whatever_its_labels_within_the_count_cap() {
    const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    const EMPTY: &str = "application/vnd.oci.empty.v1+json";
    const BUNDLE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
    let h = RegistryHarness::start_default().await.unwrap();
    let image = push(&h, "bundle-v3").await;
    let repo = "ivory/bundle-v3";
    let (digest, cosign_index) = bundle_v3_fallback();
    let tag = digest.replace(':', "-");
    // Five SBOM referrers, unlabelled in the index.
    let empty = h.push_blob(repo, b"{}").await.unwrap();
    let sbom = h
        .push_blob(repo, br#"{"spdxVersion":"SPDX-2.3"}"#)
        .await
        .unwrap();
    let mut sboms = Vec::new();
    for i in 0..5 {
        let manifest = serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": "application/spdx+json",
            "config": {"mediaType": EMPTY, "digest": empty, "size": 2},
            "layers": [{"mediaType": "application/spdx+json", "digest": sbom, "size": 26}],
            "subject": {"mediaType": OCI_MANIFEST, "digest": digest, "size": 401},
            "annotations": {"n": i.to_string()},
        })
        .to_string();
        let d = h
            .push_manifest(
                repo,
                &format!("sbom-{i}"),
                OCI_MANIFEST,
                manifest.as_bytes(),
            )
            .await
            .unwrap();
        sboms.push(
            serde_json::json!({"mediaType": OCI_MANIFEST, "digest": d, "size": manifest.len()}),
        );
    }
    // The index: the SBOMs first, then cosign's two bundles labelled `label` (None: unlabelled).
    let put_index = |sboms: &[Value], label: Option<&'static str>| {
        let mut manifests = sboms.to_vec();
        for d in cosign_index["manifests"].as_array().unwrap() {
            let mut d = d.clone();
            let o = d.as_object_mut().unwrap();
            o.remove("artifactType");
            if let Some(label) = label {
                o.insert("artifactType".into(), label.into());
            }
            manifests.push(d);
        }
        let index =
            serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})
                .to_string();
        let (h, tag) = (&h, &tag);
        async move {
            h.push_manifest(repo, tag, OCI_INDEX, index.as_bytes())
                .await
                .unwrap();
        }
    };
    let with_cap = |max_signatures: usize| {
        let config = Config {
            ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
            ..Config::default()
        };
        CosignVerifier::new(
            Registry::new(config).unwrap(),
            VerifierConfig {
                max_signatures,
                ..VerifierConfig::default()
            },
            CosignVerifier::anonymous_credentials(),
        )
    };
    let attestor = key_attestor(&key("cosign-p256.pub"));
    let pinned = format!("{image}@{digest}");
    let sbom_blob = format!("/v2/{repo}/blobs/{sbom}");
    let manifest_gets = |log: &[(String, String, u16)]| {
        log.iter()
            .filter(|(m, p, _)| {
                m == "GET" && p.starts_with(&format!("/v2/{repo}/manifests/sha256:"))
            })
            .count()
    };

    for label in [Some(EMPTY), None] {
        put_index(&sboms, label).await;
        // Three manifests read, all SBOMs: no signature, and the answer says so.
        h.reset_requests();
        let capped = with_cap(3)
            .verify(&request(pinned.clone(), attestor.clone(), None), soon())
            .await
            .unwrap();
        let Verification::NotVerified { reason, .. } = &capped else {
            panic!("{label:?}: {capped:?}")
        };
        assert!(
            reason.to_string().ends_with(&format!(
                "fallback tag {tag}: 7 manifests, 0 Sigstore bundles, 3 others (the first 3 read))"
            )),
            "{label:?}: {reason}"
        );
        let log = h.requests();
        assert_eq!(manifest_gets(&log), 3, "{label:?}: {log:?}");
        assert!(!log.iter().any(|(_, p, _)| *p == sbom_blob), "{log:?}");
        // Within the default cap every manifest is read; the bundles verify.
        h.reset_requests();
        let found = verifier(&h)
            .verify(&request(pinned.clone(), attestor.clone(), None), soon())
            .await
            .unwrap();
        assert!(found.is_verified(), "{label:?}: {found:?}");
        let log = h.requests();
        assert_eq!(manifest_gets(&log), 7, "{label:?}: {log:?}");
        assert!(!log.iter().any(|(_, p, _)| *p == sbom_blob), "{log:?}");
    }
    // Labelled as bundles, cosign's descriptors are read first: found within a cap of 3.
    put_index(&sboms, Some(BUNDLE)).await;
    let labelled = with_cap(3)
        .verify(&request(pinned.clone(), attestor.clone(), None), soon())
        .await
        .unwrap();
    assert!(labelled.is_verified(), "{labelled:?}");

    // A referrer listed but deleted since is no evidence and no failed read: a "not verified"
    // reached (cached like any), saying so.
    put_index(&sboms[..1], None).await;
    let url = format!(
        "{}/v2/{repo}/manifests/{}",
        h.base_url(),
        sboms[0]["digest"].as_str().unwrap()
    );
    let deleted = h.http_client().unwrap().delete(&url).send().await.unwrap();
    assert_eq!(deleted.status().as_u16(), 202, "{url}");
    let gone = with_cap(1)
        .verify(&request(pinned.clone(), attestor.clone(), None), soon())
        .await
        .unwrap();
    let Verification::NotVerified { reason, .. } = &gone else {
        panic!("{gone:?}")
    };
    assert!(
        reason.to_string().ends_with(&format!(
            "fallback tag {tag}: 3 manifests, 0 Sigstore bundles, 0 others, 1 missing (the first 1 read))"
        )),
        "{reason}"
    );
}
