//! Micro-benchmarks of ivory's admission hot path (divan): `cargo bench -p ivory-bench`.
//!
//! Every benchmark uses the load harness's AdmissionReview (a Pod with three containers) and
//! the same key-verification policy. Registry and cryptography are replaced by an in-memory
//! verifier except in `cache_lookup`, which asks the real `CosignVerifier` for a verdict it
//! has cached (one cold verification against a docker-registry happens before timing).

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use divan::{Bencher, black_box};
use futures::future::BoxFuture;
use ivory_bench::policy::key_policy;
use ivory_bench::review::pod_review;
use ivory_cel::{Activation, NoHost, Scope};
use ivory_engine::admission::{
    AdmissionRequest, AdmissionReview, ReviewResponse, response_from_decision,
};
use ivory_engine::images::{builtin_images, image_pointers, matches_image};
use ivory_engine::matching::{Route, matches_constraints, select_policies};
use ivory_engine::mutate::mutate;
use ivory_engine::resources::NoResources;
use ivory_engine::validate::validate;
use ivory_engine::verifier::{
    ImagePlatform, ImageReference, ImageVerifier, Signer, Verification, VerifyError, VerifyRequest,
};
use ivory_policy::CompiledPolicy;
use ivory_policy::types::Credentials;
use ivory_testkit::policy::pod_policy;
use serde_json::Value;
use tokio::time::Instant;

const HOST: &str = "registry.example:5000";
const DIGEST: &str = "sha256:9c40de188665dc8c2dbaf142a8cb00afc589345760324238ae75177a00c48fc6";
const FIXTURE_KEY: &str = include_str!("../../fixtures/keys/cosign-p256.pub");

fn main() {
    divan::main();
}

fn images(pinned: bool) -> Vec<String> {
    (0..3)
        .map(|i| {
            if pinned {
                format!("{HOST}/bench/app{i}:v1@{DIGEST}")
            } else {
                format!("{HOST}/bench/app{i}:v1")
            }
        })
        .collect()
}

static PINNED: LazyLock<Vec<u8>> = LazyLock::new(|| pod_review("bench", &images(true)));
static TAGGED: LazyLock<Vec<u8>> = LazyLock::new(|| pod_review("bench", &images(false)));
static POLICIES: LazyLock<Vec<Arc<CompiledPolicy>>> = LazyLock::new(|| {
    let yaml = key_policy("bench", &format!("{HOST}/bench/*"), FIXTURE_KEY);
    let report = ivory_policy::load_str(&yaml, "bench.yaml");
    assert!(
        report.errors.is_empty(),
        "bench policy: {:?}",
        report.errors
    );
    report.policies.into_iter().map(Arc::new).collect()
});

fn request(bytes: &[u8]) -> AdmissionRequest {
    AdmissionReview::parse(bytes)
        .expect("bench review parses")
        .request
}

fn selected() -> Vec<&'static CompiledPolicy> {
    select_policies(
        &POLICIES,
        Route { namespaced: false },
        &["bench".to_owned()],
        Some("shop"),
    )
    .expect("bench policy selected")
}

/// Answers every question positively at once (no registry, no cryptography); with `signer`,
/// its verdicts name the key that verified them, as the real verifier's do, so an admitted
/// response carries the `verified-images` annotation.
struct InstantVerifier {
    signer: Option<Signer>,
}

/// [`InstantVerifier`] without a signer.
const INSTANT: InstantVerifier = InstantVerifier { signer: None };

impl ImageVerifier for InstantVerifier {
    fn resolve_digest<'a>(
        &'a self,
        _: &'a ImageReference,
        _: Option<&'a Credentials>,
        _: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>> {
        Box::pin(async { Ok(DIGEST.to_owned()) })
    }
    fn verify<'a>(
        &'a self,
        _: &'a VerifyRequest,
        _: Instant,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>> {
        Box::pin(async {
            Ok(Verification::Verified {
                digest: DIGEST.to_owned(),
                payload: None,
                signer: self.signer.clone(),
            })
        })
    }
    fn image_data<'a>(
        &'a self,
        _: &'a ImageReference,
        _: Option<&'a Credentials>,
        _: &'a ImagePlatform,
        _: Instant,
    ) -> BoxFuture<'a, Result<Value, VerifyError>> {
        Box::pin(async {
            Ok(serde_json::json!({"config": {"os": "linux", "architecture": "amd64"}}))
        })
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

#[divan::bench]
fn admission_parse(b: Bencher<'_, '_>) {
    b.bench(|| AdmissionReview::parse(black_box(&PINNED)).is_ok());
}

#[divan::bench]
fn policy_match(b: Bencher<'_, '_>) {
    let req = request(&PINNED);
    let images = images(true);
    b.bench(|| {
        let selected = selected();
        let mut matched = 0;
        for policy in &selected {
            if matches_constraints(policy, black_box(&req), None).unwrap_or(false) {
                matched += images
                    .iter()
                    .filter(|i| matches_image(policy, i).unwrap_or(false))
                    .count();
            }
        }
        matched
    });
}

#[divan::bench]
fn image_extraction(b: Bencher<'_, '_>) {
    let req = request(&PINNED);
    let object = req.object.clone().expect("pod object");
    b.bench(|| {
        (
            image_pointers(black_box(&object), "Pod").len(),
            builtin_images(black_box(&req)).len(),
        )
    });
}

/// One Kyverno-style expression over the Pod, compiled once.
#[divan::bench]
fn cel_expression(b: Bencher<'_, '_>) {
    let req = request(&PINNED);
    let object = req.object.as_ref().expect("pod object").value().clone();
    let program = ivory_cel::compile(
        "object.spec.containers.map(c, c.image).all(i, i.startsWith('registry.example:5000/'))",
        &Scope::new(["object"]),
    )
    .expect("expression compiles");
    b.bench(|| {
        let mut act = Activation::new(&NoHost);
        act.bind_json("object", black_box(&object));
        program.evaluate(&act).is_ok()
    });
}

/// The whole validating stage with instant verdicts: image filtering, prefetch plan and the
/// policy's CEL (`verifyImageSignatures` over three containers), decision.
#[divan::bench]
fn cel_validate_stage(b: Bencher<'_, '_>) {
    let rt = runtime();
    let req = request(&PINNED);
    let policies = selected();
    b.bench(|| {
        let deadline = ivory_clock::now() + Duration::from_secs(10);
        let d = rt.block_on(validate(
            &INSTANT,
            &NoResources,
            &policies,
            black_box(&req),
            None,
            deadline,
        ));
        assert!(d.allowed);
    });
}

/// A policy reading the image data of every container, selecting the images `glob` matches.
fn image_data_policy(glob: &str) -> CompiledPolicy {
    let yaml = pod_policy(
        "bench",
        glob,
        "  validationConfigurations:
    verifyDigest: false
    required: false
  attestors: []
  validations:
    - expression: object.spec.containers.all(c, image.GetMetadata(c.image).config.os == 'linux')
",
    );
    let report = ivory_policy::load_str(&yaml, "bench.yaml");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    report.policies.into_iter().next().expect("one policy")
}

/// The validating stage of a policy reading every container's image data: all three images
/// selected (prefetched, one evaluation) or only the first (the other two fetched when the
/// expression asks, then a second evaluation).
#[divan::bench(args = ["selected", "outside the globs"])]
fn image_data_stage(b: Bencher<'_, '_>, scope: &str) {
    let rt = runtime();
    let req = request(&PINNED);
    let glob = match scope {
        "selected" => format!("{HOST}/bench/*"),
        _ => format!("{HOST}/bench/app0*"),
    };
    let policy = image_data_policy(&glob);
    b.bench(|| {
        let deadline = ivory_clock::now() + Duration::from_secs(10);
        let d = rt.block_on(validate(
            &INSTANT,
            &NoResources,
            &[&policy],
            black_box(&req),
            None,
            deadline,
        ));
        assert!(d.allowed, "{:?}", d.message);
    });
}

/// Tag → digest pinning of three containers and the JSON Patch in the response review, written
/// as the webhook writes it ([`ReviewResponse::to_json`]).
#[divan::bench]
fn patch_building(b: Bencher<'_, '_>) {
    let rt = runtime();
    let req = request(&TAGGED);
    let policies = selected();
    b.bench(|| {
        let deadline = ivory_clock::now() + Duration::from_secs(10);
        let d = rt.block_on(mutate(
            &INSTANT,
            &NoResources,
            &policies,
            black_box(&req),
            None,
            deadline,
        ));
        ReviewResponse::new(&response_from_decision(&req, &d))
            .to_json()
            .len()
    });
}

/// The webhook's writer of the response review.
const TEXT_WRITER: &str = "ReviewResponse::to_json (production)";

/// The admitted response of the validating stage (its `verified-images` annotation included)
/// written as text: by the webhook's writer, and, for comparison only, by serde_json from the
/// same review's serde derive, which production does not run.
#[divan::bench(args = [TEXT_WRITER, "serde_json::to_string (comparison)"])]
fn response_writing(b: Bencher<'_, '_>, writer: &str) {
    let rt = runtime();
    let req = request(&PINNED);
    let deadline = ivory_clock::now() + Duration::from_secs(10);
    let d = rt.block_on(validate(
        &InstantVerifier {
            signer: Some(Signer {
                key: Some(format!("sha256:{}", "ab".repeat(32))),
                log_index: Some(123_456_789),
                ..Signer::default()
            }),
        },
        &NoResources,
        &selected(),
        &req,
        None,
        deadline,
    ));
    assert!(d.allowed && !d.audit_annotations.is_empty(), "{d:?}");
    let response = response_from_decision(&req, &d);
    let review = ReviewResponse::new(&response);
    if writer == TEXT_WRITER {
        b.bench(|| black_box(&review).to_json().len());
    } else {
        b.bench(|| serde_json::to_string(black_box(&review)).map_or(0, |text| text.len()));
    }
}

/// A cached verdict from the real verifier (cold-verified once against docker-registry).
#[divan::bench]
fn cache_lookup(b: Bencher<'_, '_>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (_registry, verifier, request) = rt.block_on(cached_verifier());
    b.bench(|| {
        let deadline = ivory_clock::now() + Duration::from_secs(10);
        let v = rt.block_on(verifier.verify(black_box(&request), deadline));
        assert!(matches!(v, Ok(Verification::Verified { .. })));
    });
}

async fn cached_verifier() -> (
    ivory_testkit::Harness,
    ivory_verify::CosignVerifier,
    VerifyRequest,
) {
    let registry = ivory_testkit::RegistryHarness::start(ivory_testkit::HarnessOptions::default())
        .await
        .expect("docker-registry starts (Debian package docker-registry)");
    let layout = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/oci/ivory/sig-p256"
    );
    let tags = registry
        .push_oci_layout(std::path::Path::new(layout), "ivory/sig-p256")
        .await
        .expect("fixture pushed");
    let config = ivory_registry::Config {
        ca_bundle_pem: Some(registry.ca_pem().as_bytes().to_vec()),
        ..ivory_registry::Config::default()
    };
    let verifier = ivory_verify::CosignVerifier::new(
        ivory_registry::Registry::new(config).expect("registry client"),
        ivory_verify::VerifierConfig::default(),
        ivory_verify::CosignVerifier::anonymous_credentials(),
    );
    let yaml = key_policy(
        "fixture",
        &format!("{}/ivory/*", registry.host()),
        FIXTURE_KEY,
    );
    let report = ivory_policy::load_str(&yaml, "fixture.yaml");
    let attestor = report.policies[0].attestors[0].attestor.clone();
    let request = VerifyRequest {
        image: ivory_engine::verifier::ImageReference::parse(&format!(
            "{}/ivory/sig-p256@{}",
            registry.host(),
            tags["v1"]
        ))
        .expect("the fixture's reference parses"),
        attestor,
        attestation: None,
        credentials: None,
        platforms: Default::default(),
    };
    let deadline = ivory_clock::now() + Duration::from_secs(30);
    let first = verifier.verify(&request, deadline).await;
    assert!(
        matches!(first, Ok(Verification::Verified { .. })),
        "cold verification: {first:?}"
    );
    (registry, verifier, request)
}
