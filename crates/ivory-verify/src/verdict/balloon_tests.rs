//! Blobs whose JSON would balloon once parsed are refused at every parse site with a named
//! reason; a real-size SBOM attestation still verifies.

use base64::Engine as _;
use ivory_policy::types::{Attestor, Cosign, CosignKey, Ctlog};
use ivory_registry::{JsonLimits, json_shape};
use ivory_testkit::CosignSigner;
use serde_json::{Value, json};

use super::*;
use crate::envelope::Legacy;

const DIGEST: &str = "sha256:2f3c2b1a9f0e8d7c6b5a493827161504f3e2d1c0b9a8f7e6d5c4b3a291807162";
const SPDX: &str = "https://spdx.dev/Document";
/// A key name no reason may echo: it would mean blob text reached the denial message.
const MARKER: &str = "balloon-marker";

/// Tiny objects, past the object limit: millions of map nodes for an 8 MiB blob.
fn ballooning() -> Vec<u8> {
    let item = format!(r#"{{"{MARKER}":0}}"#);
    let n = JsonLimits::SIGNATURE.max_objects + 1;
    format!("[{}]", vec![item.as_str(); n].join(",")).into_bytes()
}

fn key_plan(pem: &str, ignore_tlog: bool) -> Plan {
    let attestor = Attestor {
        name: "key".into(),
        cosign: Some(Cosign {
            key: Some(CosignKey {
                data: Some(pem.into()),
                ..CosignKey::default()
            }),
            ctlog: Some(Ctlog {
                insecure_ignore_tlog: Some(ignore_tlog),
                ..Ctlog::default()
            }),
            ..Cosign::default()
        }),
        notary: None,
    };
    Plan::new(&attestor, &crate::trust_source::RootState::embedded()).unwrap()
}

fn legacy(blob: Vec<u8>) -> Legacy {
    Legacy {
        blob,
        signature: None,
        certificate: None,
        chain: None,
        rekor_bundle: None,
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// An SPDX SBOM statement for `DIGEST` shaped like syft's: per package a checksum, a CPE
/// and a purl reference, and a relationship.
fn sbom_statement(packages: usize) -> Vec<u8> {
    let hex = DIGEST.trim_start_matches("sha256:");
    let pkgs: Vec<Value> = (0..packages)
        .map(|i| {
            let (name, version) = (format!("pkg-{i}"), format!("1.{i}.0"));
            json!({
                "SPDXID": format!("SPDXRef-Package-npm-{name}-{i:08x}"),
                "name": name, "versionInfo": version,
                "supplier": "Organization: ivory test", "originator": "Person: Test",
                "downloadLocation": "NOASSERTION", "filesAnalyzed": false,
                "licenseConcluded": "NOASSERTION", "licenseDeclared": "MIT",
                "copyrightText": "NOASSERTION",
                "sourceInfo": format!("acquired package info from installed node module manifest file: /usr/lib/node_modules/{name}/package.json"),
                "checksums": [{ "algorithm": "SHA256", "checksumValue": hex }],
                "externalRefs": [
                    { "referenceCategory": "SECURITY", "referenceType": "cpe23Type",
                      "referenceLocator": format!("cpe:2.3:a:{name}:{name}:{version}:*:*:*:*:*:*:*") },
                    { "referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                      "referenceLocator": format!("pkg:npm/{name}@{version}") },
                ],
            })
        })
        .collect();
    let rels: Vec<Value> = (0..packages)
        .map(|i| {
            json!({ "spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "CONTAINS",
                         "relatedSpdxElement": format!("SPDXRef-Package-npm-pkg-{i}-{i:08x}") })
        })
        .collect();
    json!({
        "_type": "https://in-toto.io/Statement/v0.1",
        "predicateType": SPDX,
        "subject": [{ "name": "registry.test/app", "digest": { "sha256": hex } }],
        "predicate": { "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0",
                       "SPDXID": "SPDXRef-DOCUMENT", "name": "registry.test/app",
                       "packages": pkgs, "relationships": rels },
    })
    .to_string()
    .into_bytes()
}

#[test]
fn ballooning_blobs_are_refused_at_every_parse_site() {
    let signer = CosignSigner::generate().unwrap();
    let (offline, online) = (
        key_plan(&signer.public_pem, true),
        key_plan(&signer.public_pem, false),
    );
    let mut bundle: Value = serde_json::from_str(&super::tests::workspace_fixture(
        "keyless/keyless-js-tsa.bundle.json",
    ))
    .unwrap();
    bundle["dsseEnvelope"]["payload"] = b64(&ballooning()).into();
    let rekor = |body: &[u8]| {
        json!({ "SignedEntryTimestamp": "", "Payload": {
            "body": b64(body), "integratedTime": 0, "logIndex": 0, "logID": "00" } })
        .to_string()
    };
    let signed_simple = |payload: Vec<u8>| {
        let signature = Some(b64(&signer.sign(&payload).unwrap()));
        Envelope::SimpleSigning(Legacy {
            signature,
            ..legacy(payload)
        })
    };
    let with_rekor = |annotation: String| {
        Envelope::SimpleSigning(Legacy {
            signature: Some(b64(b"sig")),
            rekor_bundle: Some(annotation),
            ..legacy(b"{}".to_vec())
        })
    };
    let signed_statement = signer.dsse(IN_TOTO_PAYLOAD_TYPE, &ballooning()).unwrap();
    let cases: Vec<(&str, &Plan, Envelope, Option<&str>, &str)> = vec![
        (
            "DSSE layer, offline key",
            &offline,
            Envelope::Dsse(legacy(ballooning())),
            Some(SPDX),
            "DSSE envelope",
        ),
        (
            "DSSE layer, Sigstore path",
            &online,
            Envelope::Dsse(legacy(ballooning())),
            Some(SPDX),
            "DSSE envelope",
        ),
        (
            "signed in-toto statement",
            &offline,
            Envelope::Dsse(legacy(signed_statement)),
            Some(SPDX),
            "in-toto statement",
        ),
        (
            "Sigstore bundle",
            &online,
            Envelope::Bundle(ballooning()),
            Some(SPDX),
            "Sigstore bundle",
        ),
        (
            "bundle DSSE payload",
            &offline,
            Envelope::Bundle(bundle.to_string().into_bytes()),
            Some(SPDX),
            "in-toto statement",
        ),
        (
            "signed simple-signing payload",
            &offline,
            signed_simple(ballooning()),
            None,
            "simple-signing payload",
        ),
        (
            "Rekor bundle annotation",
            &online,
            with_rekor(String::from_utf8(ballooning()).unwrap()),
            None,
            "dev.sigstore.cosign/bundle annotation",
        ),
        (
            "Rekor body",
            &online,
            with_rekor(rekor(&ballooning())),
            None,
            "Rekor body",
        ),
    ];
    for (name, plan, env, predicate, what) in cases {
        let err = evaluate(plan, DIGEST, &[env], predicate)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("{what} refused as hostile: it holds")),
            "{name}: {err}"
        );
        assert!(!err.contains(MARKER), "{name} echoes the blob: {err}");
    }
}

#[test]
fn real_size_sbom_attestation_verifies() {
    let statement = sbom_statement(3000);
    let shape = json_shape(&statement);
    assert!(
        shape.values > 100_000 && shape.fits(&JsonLimits::SIGNATURE),
        "{shape:?}"
    );
    let signer = CosignSigner::generate().unwrap();
    let envelope = signer.dsse(IN_TOTO_PAYLOAD_TYPE, &statement).unwrap();
    let plan = key_plan(&signer.public_pem, true);
    let accepted = evaluate(
        &plan,
        DIGEST,
        &[Envelope::Dsse(legacy(envelope))],
        Some(SPDX),
    )
    .unwrap();
    let packages = accepted
        .statement
        .as_ref()
        .and_then(|st| st.pointer("/predicate/packages"))
        .and_then(Value::as_array)
        .map(Vec::len);
    assert_eq!(packages, Some(3000));
}
