//! A Sigstore bundle whose only time evidence is a timestamp from OpenSSL's own TSA (`openssl ts
//! -reply`, whose token repeats the TSA certificate), as sigstore-go accepts it: a keyless DSSE
//! bundle signed now by a short-lived certificate of a test CA, no log entry
//! (`insecureIgnoreTlog`), the TSA in the trusted root. Made with the real `openssl` CLI.

use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ivory_policy::types::{Attestor, Cosign, Ctlog, Identity, Keyless, StringSource};
use ivory_testkit::{OpensslTsa, TsaKey};
use serde_json::json;

use super::*;

pub(super) const ISSUER: &str = "https://issuer.ivory.test";
pub(super) const SUBJECT: &str = "signer@ivory.test";
pub(super) const PREDICATE: &str = "https://slsa.dev/provenance/v1";

pub(super) fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The DER of the PEM certificate `name` in `dir`, base64.
pub(super) fn der_b64(dir: &Path, name: &str) -> String {
    let pem = std::fs::read_to_string(dir.join(name)).unwrap();
    der_of_pem(&pem)
}

/// The base64 body of the first PEM block of `pem`: its DER, base64.
pub(super) fn der_of_pem(pem: &str) -> String {
    pem.lines()
        .skip_while(|l| !l.starts_with("-----BEGIN"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect()
}

/// A Fulcio-like CA and a 10-minute signing certificate for [`SUBJECT`] from [`ISSUER`].
pub(super) fn keyless_signer(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "30",
            "-subj",
            "/O=ivory/CN=ivory test fulcio",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "leaf.key",
            "-out",
            "leaf.csr",
            "-subj",
            "/O=sigstore.dev",
        ],
    );
    std::fs::write(
        dir.join("leaf.ext"),
        format!(
            "keyUsage=critical,digitalSignature\nextendedKeyUsage=codeSigning\n\
             subjectAltName=critical,email:{SUBJECT}\n\
             1.3.6.1.4.1.57264.1.1=ASN1:FORMAT:UTF8,UTF8String:{ISSUER}\n\
             1.3.6.1.4.1.57264.1.8=ASN1:UTF8String:{ISSUER}\n"
        ),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-sha256",
            "-extfile",
            "leaf.ext",
            "-out",
            "leaf.pem",
        ],
    );
}

/// A keyless DSSE bundle over `digest` with `tsa`'s timestamp (a TimeStampResp, as Sigstore's
/// TSA answers) over its signature, and the trusted root naming the CA and `tsa`.
fn stamped_bundle(dir: &Path, digest: &str, tsa: &OpensslTsa) -> (String, String) {
    let statement = json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "image", "digest": {"sha256": digest.trim_start_matches("sha256:")}}],
        "predicateType": PREDICATE,
        "predicate": {},
    })
    .to_string();
    let payload_type = "application/vnd.in-toto+json";
    let pae = sigstore_verify::types::dsse::pae(payload_type, statement.as_bytes());
    std::fs::write(dir.join("pae"), pae).unwrap();
    openssl(
        dir,
        &["dgst", "-sha256", "-sign", "leaf.key", "-out", "sig", "pae"],
    );
    let signature = std::fs::read(dir.join("sig")).unwrap();
    let stamp = tsa.response(&signature).unwrap();
    let bundle = json!({
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {
            "certificate": {"rawBytes": der_b64(dir, "leaf.pem")},
            "tlogEntries": [],
            "timestampVerificationData": {
                "rfc3161Timestamps": [{"signedTimestamp": STANDARD.encode(stamp)}],
            },
        },
        "dsseEnvelope": {
            "payload": STANDARD.encode(&statement),
            "payloadType": payload_type,
            "signatures": [{"sig": STANDARD.encode(&signature), "keyid": ""}],
        },
    });
    let authority = |subject: &str, chain: Vec<String>| {
        json!({
            "subject": {"organization": "ivory", "commonName": subject},
            "uri": "https://ivory.test",
            "certChain": {"certificates": chain.into_iter().map(|c| json!({"rawBytes": c})).collect::<Vec<_>>()},
            "validFor": {"start": "2020-01-01T00:00:00Z"},
        })
    };
    let root = json!({
        "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
        "tlogs": [],
        "certificateAuthorities": [authority("fulcio", vec![der_b64(dir, "ca.pem")])],
        "ctlogs": [],
        "timestampAuthorities": [authority("tsa", vec![der_of_pem(&tsa.tsa_pem), der_of_pem(&tsa.root_pem)])],
    });
    (bundle.to_string(), root.to_string())
}

fn keyless_plan(trusted_root: &str) -> Plan {
    let attestor = Attestor {
        name: "keyless".into(),
        cosign: Some(Cosign {
            keyless: Some(Keyless {
                identities: vec![Identity {
                    subject: Some(SUBJECT.into()),
                    issuer: Some(ISSUER.into()),
                    ..Identity::default()
                }],
                ..Keyless::default()
            }),
            ctlog: Some(Ctlog {
                insecure_ignore_tlog: Some(true),
                insecure_ignore_sct: Some(true),
                ..Ctlog::default()
            }),
            trusted_root: Some(StringSource {
                value: Some(trusted_root.into()),
                expression: None,
            }),
            ..Cosign::default()
        }),
        notary: None,
    };
    Plan::new(&attestor, &crate::trust_source::RootState::embedded()).unwrap()
}

#[test]
fn a_bundle_timestamped_by_openssls_ecdsa_tsa_verifies_to_that_tsa_only() {
    let dir = tempdir();
    keyless_signer(&dir);
    let digest = format!("sha256:{}", "ab".repeat(32));
    let tsa = OpensslTsa::new(TsaKey::EcP256).unwrap();
    let (bundle, root) = stamped_bundle(&dir, &digest, &tsa);
    let accepted = evaluate(
        &keyless_plan(&root),
        &digest,
        &[Envelope::Bundle(bundle.clone().into_bytes())],
        Some(PREDICATE),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(accepted.signer.subject.as_deref(), Some(SUBJECT));
    // Another TSA in the trusted root: the token's signer does not chain to it.
    let other = OpensslTsa::new(TsaKey::EcP256).unwrap();
    let (_, other_root) = stamped_bundle(&dir, &digest, &other);
    let refused = evaluate(
        &keyless_plan(&other_root),
        &digest,
        &[Envelope::Bundle(bundle.into_bytes())],
        Some(PREDICATE),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(refused.contains("TSA"), "{refused}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory of this test process (removed by the test).
pub(super) fn tempdir() -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ivory-keyless-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
