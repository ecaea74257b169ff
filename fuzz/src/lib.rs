//! Shared fixtures of the fuzz targets: attestor plans and a signing key held by the harness.
//!
//! A coverage-guided fuzzer cannot forge a signature, so the code behind a signature check
//! (payload and statement parsing, digest binding, annotations) would stay unreached. The
//! harness therefore signs fuzzed payloads with its own key, which the key attestor trusts;
//! a signature check that passes on anything the harness did not sign is a bypass.

#![warn(missing_docs)]

use std::collections::BTreeMap;

use aws_lc_rs::encoding::AsDer as _;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair as _};
use base64::Engine as _;
use ivory_policy::types::{Attestor, Cosign, CosignKey, Ctlog, Identity, Keyless, StringSource};
use ivory_verify::{Plan, RootState};

/// The image digest every envelope is checked against.
pub const DIGEST: &str = "sha256:e2e16842c9b54d985bf1ef9242a313f36b856181f188de21313820e177002501";
/// The annotation the key attestor requires in simple-signing payloads.
pub const ANNOTATION: (&str, &str) = ("env", "prod");
/// The predicate type asked for in attestation mode.
pub const PREDICATE: &str = "https://slsa.dev/provenance/v1";
/// The trust root of the committed keyless fixtures (sigstore-js with @sigstore/mock).
pub const FIXTURE_TRUSTED_ROOT: &str = include_str!("../../fixtures/keyless/trusted_root.json");

/// A P-256 key only this process knows.
pub struct Signer {
    key: EcdsaKeyPair,
    rng: SystemRandom,
}

impl Signer {
    /// A fresh key.
    pub fn new() -> Self {
        let key = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_ASN1_SIGNING).expect("P-256 key");
        Self {
            key,
            rng: SystemRandom::new(),
        }
    }

    /// The public key as cosign's `key.data` PEM.
    pub fn public_pem(&self) -> String {
        let der = self.key.public_key().as_der().expect("SPKI");
        let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
        format!("-----BEGIN PUBLIC KEY-----\n{b64}\n-----END PUBLIC KEY-----\n")
    }

    /// ASN.1 ECDSA signature over `message`, base64.
    pub fn sign_b64(&self, message: &[u8]) -> String {
        let sig = self.key.sign(&self.rng, message).expect("signature");
        base64::engine::general_purpose::STANDARD.encode(sig.as_ref())
    }
}

impl Default for Signer {
    fn default() -> Self {
        Self::new()
    }
}

/// DSSE pre-authentication encoding (what a DSSE signature covers).
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// A key attestor for `pem`; `offline` sets `ctlog.insecureIgnoreTlog` (no Sigstore trust).
pub fn key_plan(pem: &str, offline: bool) -> Plan {
    let attestor = Attestor {
        name: "key".into(),
        cosign: Some(Cosign {
            key: Some(CosignKey {
                data: Some(pem.into()),
                ..CosignKey::default()
            }),
            ctlog: offline.then(|| Ctlog {
                insecure_ignore_tlog: Some(true),
                ..Ctlog::default()
            }),
            annotations: BTreeMap::from([(ANNOTATION.0.into(), ANNOTATION.1.into())]),
            ..Cosign::default()
        }),
        notary: None,
    };
    Plan::new(&attestor, &RootState::embedded()).expect("key plan")
}

/// A keyless attestor accepting any identity under the fixtures' trust root.
pub fn keyless_plan() -> Plan {
    let attestor = Attestor {
        name: "keyless".into(),
        cosign: Some(Cosign {
            keyless: Some(Keyless {
                identities: vec![Identity {
                    issuer_reg_exp: Some(".*".into()),
                    subject_reg_exp: Some(".*".into()),
                    ..Identity::default()
                }],
                ..Keyless::default()
            }),
            trusted_root: Some(StringSource {
                value: Some(FIXTURE_TRUSTED_ROOT.into()),
                expression: None,
            }),
            ..Cosign::default()
        }),
        notary: None,
    };
    Plan::new(&attestor, &RootState::embedded()).expect("keyless plan")
}

/// What every envelope the Notation parsers accept must hold.
pub fn notation_invariants(env: &ivory_verify::notation::envelope::SignedEnvelope) {
    use ivory_verify::notation::envelope::{MAX_CHAIN, SigningScheme};
    assert!(env.chain.len() <= MAX_CHAIN, "chain longer than the cap");
    match env.scheme {
        SigningScheme::X509 => assert!(env.signing_time.is_some(), "notary.x509 without signing time"),
        SigningScheme::SigningAuthority => assert!(
            env.authentic_signing_time.is_some(),
            "signingAuthority without authentic signing time"
        ),
    }
}
