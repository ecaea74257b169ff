//! An image attested with a Sigstore bundle whose DSSE envelope is logged in Rekor v2 as
//! `dsse/0.0.2`, pushed to the real Distribution registry (ivory-testkit) as cosign v3 pushes
//! bundles there (no referrers API: the fallback tag `sha256-<hex>` indexes the bundle
//! manifests). A key attestor with the test log and TSA in its trusted root admits it; the
//! same image with a tampered bundle is denied.

// Test helpers outside #[test] fns: failing fast is the point.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ivory_engine::verifier::{ImageReference, ImageVerifier, Verification, VerifyRequest};
use ivory_policy::types::{Attestation, Attestor, Cosign, CosignKey, StringSource, TypeRef};
use ivory_registry::{Config, Registry};
use ivory_testkit::{
    CosignSigner, DsseVerifier, Harness, OpensslTsa, RegistryHarness, RekorV2Log, TsaKey,
    dsse_v002_body,
};
use ivory_verify::{CosignVerifier, VerifierConfig};
use serde_json::{Value, json};

const PREDICATE: &str = "https://slsa.dev/provenance/v1";
const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
const BUNDLE_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// The signer, TSA and log of one test, and the trusted root naming the TSA and log.
struct World {
    signer: CosignSigner,
    tsa: OpensslTsa,
    log: RekorV2Log,
}

impl World {
    fn new() -> Self {
        Self {
            signer: CosignSigner::generate().unwrap(),
            tsa: OpensslTsa::new(TsaKey::EcP256).unwrap(),
            log: RekorV2Log::generate("log2025-test.rekor.ivory.test").unwrap(),
        }
    }

    fn trusted_root(&self) -> String {
        let der = |pem: &str| -> String {
            pem.lines()
                .skip_while(|l| !l.starts_with("-----BEGIN"))
                .skip(1)
                .take_while(|l| !l.starts_with("-----END"))
                .collect()
        };
        json!({
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [self.log.trusted_root_tlog("2020-01-01T00:00:00Z", None)],
            "certificateAuthorities": [],
            "ctlogs": [],
            "timestampAuthorities": [{
                "subject": {"organization": "ivory", "commonName": "tsa"},
                "uri": "https://tsa.ivory.test",
                "certChain": {"certificates": [
                    {"rawBytes": der(&self.tsa.tsa_pem)}, {"rawBytes": der(&self.tsa.root_pem)}
                ]},
                "validFor": {"start": "2020-01-01T00:00:00Z"},
            }],
        })
        .to_string()
    }

    fn public_der(&self) -> Vec<u8> {
        let b64: String = self
            .signer
            .public_pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        STANDARD.decode(b64).unwrap()
    }

    /// A bundle attesting `digest`; `tamper` may change the entry's body before it is logged,
    /// and the bundle after.
    fn bundle(
        &self,
        digest: &str,
        tamper_body: impl FnOnce(Vec<u8>) -> Vec<u8>,
        tamper_bundle: impl FnOnce(&mut Value),
    ) -> Vec<u8> {
        let statement = json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": "image", "digest": {"sha256": digest.trim_start_matches("sha256:")}}],
            "predicateType": PREDICATE,
            "predicate": {"builder": {"id": "ivory-test"}},
        })
        .to_string();
        let pae = sigstore_pae(statement.as_bytes());
        let signature = self.signer.sign(&pae).unwrap();
        let key = self.public_der();
        let body = tamper_body(dsse_v002_body(
            statement.as_bytes(),
            &signature,
            DsseVerifier::PublicKey(&key),
        ));
        let stamp = self.tsa.response(&signature).unwrap();
        let mut bundle = json!({
            "mediaType": BUNDLE_TYPE,
            "verificationMaterial": {
                "publicKey": {"hint": "test-key"},
                "tlogEntries": [self.log.entry("dsse", "0.0.2", &body)],
                "timestampVerificationData": {
                    "rfc3161Timestamps": [{"signedTimestamp": STANDARD.encode(stamp)}],
                },
            },
            "dsseEnvelope": {
                "payload": STANDARD.encode(&statement),
                "payloadType": PAYLOAD_TYPE,
                "signatures": [{"sig": STANDARD.encode(&signature), "keyid": ""}],
            },
        });
        tamper_bundle(&mut bundle);
        bundle.to_string().into_bytes()
    }

    fn attestor(&self) -> Attestor {
        Attestor {
            name: "key".into(),
            cosign: Some(Cosign {
                key: Some(CosignKey {
                    data: Some(self.signer.public_pem.clone()),
                    ..CosignKey::default()
                }),
                trusted_root: Some(StringSource {
                    value: Some(self.trusted_root()),
                    expression: None,
                }),
                ..Cosign::default()
            }),
            notary: None,
        }
    }
}

/// DSSE pre-authentication encoding (the bytes the envelope's signature covers).
fn sigstore_pae(payload: &[u8]) -> Vec<u8> {
    let mut pae = format!(
        "DSSEv1 {} {PAYLOAD_TYPE} {} ",
        PAYLOAD_TYPE.len(),
        payload.len()
    )
    .into_bytes();
    pae.extend_from_slice(payload);
    pae
}

/// Pushes `bundle` as cosign v3 does on a registry without the referrers API: a manifest
/// whose subject is the image, listed by the index under the fallback tag.
async fn push_bundle(h: &Harness, repo: &str, digest: &str, bundle: &[u8]) {
    let config = h.push_blob(repo, b"{}").await.unwrap();
    let layer = h.push_blob(repo, bundle).await.unwrap();
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "artifactType": BUNDLE_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": config, "size": 2},
        "layers": [{"mediaType": BUNDLE_TYPE, "digest": layer, "size": bundle.len()}],
        "subject": {"mediaType": MANIFEST, "digest": digest, "size": 0},
    })
    .to_string();
    let manifest_digest = h
        .push_manifest(repo, "bundle", MANIFEST, manifest.as_bytes())
        .await
        .unwrap();
    let index = json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [{"mediaType": MANIFEST, "digest": manifest_digest,
                       "size": manifest.len(), "artifactType": BUNDLE_TYPE}],
    })
    .to_string();
    h.push_manifest(repo, &digest.replace(':', "-"), INDEX, index.as_bytes())
        .await
        .unwrap();
}

fn verifier(h: &Harness) -> CosignVerifier {
    let config = Config {
        ca_bundle_pem: Some(h.ca_pem().as_bytes().to_vec()),
        ..Config::default()
    };
    CosignVerifier::new(
        Registry::new(config).unwrap(),
        VerifierConfig::default(),
        CosignVerifier::anonymous_credentials(),
    )
}

async fn verify(h: &Harness, world: &World, repo: &str) -> Verification {
    let request = VerifyRequest {
        image: ImageReference::parse(&format!("{}/{repo}:v1", h.host())).unwrap(),
        attestor: world.attestor(),
        attestation: Some(Attestation {
            name: "provenance".into(),
            intoto: Some(TypeRef {
                type_: PREDICATE.into(),
            }),
            referrer: None,
        }),
        credentials: None,
        platforms: Default::default(),
    };
    let deadline = ivory_clock::now() + Duration::from_secs(20);
    verifier(h).verify(&request, deadline).await.unwrap()
}

/// Makes the bundle pushed for an image digest.
type BundleFor<'a> = Box<dyn Fn(&str) -> Vec<u8> + 'a>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_attested_in_rekor_v2_as_dsse_v002_is_admitted_and_tampered_bundles_denied() {
    let h = RegistryHarness::start_default().await.unwrap();
    let unsigned = ivory_testkit::fixtures_dir().join("oci/ivory/unsigned");
    let world = World::new();
    let other_digest = format!("sha256:{}", "ee".repeat(32));
    let cases: Vec<(&str, BundleFor<'_>, Option<&str>)> = vec![
        (
            "ivory/dsse-v002-good",
            Box::new(|d: &str| world.bundle(d, |b| b, |_| {})),
            None,
        ),
        (
            "ivory/dsse-v002-other-payload",
            Box::new(|d: &str| {
                // The entry logs the same signature over another statement's hash.
                world.bundle(
                    d,
                    |b| {
                        let other = world.bundle(&other_digest, |b| b, |_| {});
                        let other: Value = serde_json::from_slice(&other).unwrap();
                        let other_payload = STANDARD
                            .decode(other["dsseEnvelope"]["payload"].as_str().unwrap())
                            .unwrap();
                        let mut body: Value = serde_json::from_slice(&b).unwrap();
                        body["spec"]["dsseV002"]["payloadHash"]["digest"] = json!(
                            STANDARD.encode(<sha2::Sha256 as sha2::Digest>::digest(&other_payload))
                        );
                        body.to_string().into_bytes()
                    },
                    |_| {},
                )
            }),
            Some("logs another payload than the envelope's"),
        ),
        (
            "ivory/dsse-v002-bad-proof",
            Box::new(|d: &str| {
                world.bundle(
                    d,
                    |b| b,
                    |bundle| {
                        let hashes =
                            &mut bundle["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]
                                ["hashes"];
                        hashes[0] = hashes[1].clone();
                    },
                )
            }),
            Some("inclusion proof does not verify"),
        ),
        (
            "ivory/dsse-v002-no-timestamp",
            Box::new(|d: &str| {
                world.bundle(
                    d,
                    |b| b,
                    |bundle| {
                        bundle["verificationMaterial"]
                            .as_object_mut()
                            .unwrap()
                            .remove("timestampVerificationData");
                    },
                )
            }),
            Some("needs an RFC 3161 timestamp"),
        ),
    ];
    for (repo, make, denial) in cases {
        let tags = h.push_oci_layout(&unsigned, repo).await.unwrap();
        let digest = tags["v1"].clone();
        push_bundle(&h, repo, &digest, &make(&digest)).await;
        let got = verify(&h, &world, repo).await;
        match (denial, &got) {
            (None, Verification::Verified { payload, .. }) => {
                assert_eq!(
                    payload.as_ref().unwrap()["predicate"]["builder"]["id"],
                    "ivory-test"
                );
            }
            (Some(needle), Verification::NotVerified { reason, .. }) => {
                assert!(reason.to_string().contains(needle), "{repo}: {reason}");
            }
            _ => panic!("{repo}: {got:?}"),
        }
    }
}
