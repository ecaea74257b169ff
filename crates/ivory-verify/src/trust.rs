//! Trusted roots per attestor: the embedded Sigstore public-good `trusted_root.json` (so nothing
//! is fetched at start-up), replaced by `trustedRoot` when the policy gives one, with
//! `keyless.roots`, `ctlog.rekorPubKey`, `ctlog.ctLogPubKey` and `ctlog.tsaCertChain` overriding
//! the matching section.

use std::sync::Arc;

use base64::Engine as _;
use ivory_policy::types::Cosign;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use sigstore_verify::Verifier;
use sigstore_verify::crypto::KeyAlgorithm;
use sigstore_verify::trust_root::{SIGSTORE_PRODUCTION_TRUSTED_ROOT, TrustedRoot};
use sigstore_verify::types::{DerCertificate, DerPublicKey};

use crate::keys::parse_certificates;

/// The embedded public-good trusted root (byte-identical to sigstore/root-signing
/// `targets/trusted_root.json`, 2026 edition: Fulcio v1/v2, Rekor v1 + v2 `log2025-1`, CT, TSA).
pub const PUBLIC_GOOD_TRUSTED_ROOT: &str = SIGSTORE_PRODUCTION_TRUSTED_ROOT;

const TRUSTED_ROOT_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.trustedroot+json;version=0.1";
/// A validity start far enough back for any signature; custom keys carry no window.
const EPOCH: &str = "1970-01-01T00:00:00Z";

/// Trust for one attestor: the sigstore-verify `Verifier` and the certificate authorities'
/// certificates (for keyless signatures that carry no log entry or timestamp).
pub(crate) struct Trust {
    pub(crate) verifier: Arc<Verifier>,
    pub(crate) ca_certs: Vec<DerCertificate>,
}

/// Builds the trust for one cosign attestor. `default_root` is the process-wide root (the
/// embedded public-good one unless configured otherwise).
pub(crate) fn verifier_for(cosign: &Cosign, default_root: &str) -> Result<Trust, String> {
    let mut root: Value = match cosign
        .trusted_root
        .as_ref()
        .and_then(|s| s.value.as_deref())
    {
        Some(text) if !text.trim().is_empty() => serde_json::from_str(text)
            .map_err(|e| format!("trustedRoot is not a trusted_root.json document: {e}"))?,
        _ => serde_json::from_str(default_root)
            .map_err(|e| format!("the default trusted root is not valid JSON: {e}"))?,
    };
    let roots = cosign.keyless.as_ref().and_then(|k| k.roots.as_deref());
    if let Some(roots) = roots.filter(|r| !r.trim().is_empty()) {
        root["certificateAuthorities"] = json!([authority(roots, "keyless.roots")?]);
    }
    if let Some(ctlog) = &cosign.ctlog {
        if let Some(pem) = ctlog
            .rekor_pub_key
            .as_deref()
            .filter(|s| !s.trim().is_empty())
        {
            root["tlogs"] = json!([log_entry(pem, "ctlog.rekorPubKey")?]);
        }
        if let Some(pem) = ctlog
            .ct_log_pub_key
            .as_deref()
            .filter(|s| !s.trim().is_empty())
        {
            root["ctlogs"] = json!([log_entry(pem, "ctlog.ctLogPubKey")?]);
        }
        if let Some(pem) = ctlog
            .tsa_cert_chain
            .as_deref()
            .filter(|s| !s.trim().is_empty())
        {
            root["timestampAuthorities"] = json!([authority(pem, "ctlog.tsaCertChain")?]);
        }
    }
    if root.get("mediaType").is_none() {
        root["mediaType"] = json!(TRUSTED_ROOT_MEDIA_TYPE);
    }
    let parsed = TrustedRoot::from_json(&root.to_string())
        .map_err(|e| format!("trusted root cannot be used: {e}"))?;
    let verifier =
        Verifier::new(&parsed).map_err(|e| format!("trusted root cannot be used: {e}"))?;
    Ok(Trust {
        verifier: Arc::new(verifier),
        ca_certs: parsed.fulcio_certs(),
    })
}

/// A `certificateAuthorities`/`timestampAuthorities` entry from a PEM chain (leaf first).
fn authority(pem: &str, field: &str) -> Result<Value, String> {
    let certs = parse_certificates(pem, field)?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let certificates: Vec<Value> = certs
        .iter()
        .map(|c| json!({ "rawBytes": b64.encode(c.as_bytes()) }))
        .collect();
    Ok(json!({
        "subject": {},
        "uri": "",
        "certChain": { "certificates": certificates },
        "validFor": { "start": EPOCH },
    }))
}

/// A `tlogs`/`ctlogs` entry from a PEM public key; the log id is the key's SHA-256, as Rekor
/// and CT logs define it.
fn log_entry(pem: &str, field: &str) -> Result<Value, String> {
    let der = DerPublicKey::from_pem(pem.trim())
        .map_err(|e| format!("{field} is not a PEM public key: {e}"))?;
    let details = match KeyAlgorithm::from_spki(&der) {
        Ok(KeyAlgorithm::EcdsaP256) => "PKIX_ECDSA_P256_SHA_256",
        Ok(KeyAlgorithm::EcdsaP384) => "PKIX_ECDSA_P384_SHA_384",
        Ok(KeyAlgorithm::Ed25519) => "PKIX_ED25519",
        Ok(KeyAlgorithm::Rsa) => "PKIX_RSA_PKCS1V15_2048_SHA256",
        _ => return Err(format!("{field} has an unsupported key type")),
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(json!({
        "baseUrl": "",
        "hashAlgorithm": "SHA2_256",
        "publicKey": {
            "rawBytes": b64.encode(der.as_bytes()),
            "keyDetails": details,
            "validFor": { "start": EPOCH },
        },
        "logId": { "keyId": b64.encode(Sha256::digest(der.as_bytes())) },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_policy::types::{Ctlog, StringSource};

    #[test]
    fn embedded_root_builds_offline() {
        assert!(verifier_for(&Cosign::default(), PUBLIC_GOOD_TRUSTED_ROOT).is_ok());
    }

    #[test]
    fn overrides_rekor_key_and_rejects_bad_trusted_root() {
        let cosign = Cosign {
            ctlog: Some(Ctlog {
                rekor_pub_key: Some(
                    include_str!("../../../fixtures/captured/connaisseur/cosign/keys/alice.key")
                        .into(),
                ),
                ..Ctlog::default()
            }),
            ..Cosign::default()
        };
        assert!(verifier_for(&cosign, PUBLIC_GOOD_TRUSTED_ROOT).is_ok());
        let bad = Cosign {
            trusted_root: Some(StringSource {
                value: Some("{".into()),
                expression: None,
            }),
            ..Cosign::default()
        };
        let Err(err) = verifier_for(&bad, PUBLIC_GOOD_TRUSTED_ROOT) else {
            panic!("bad root accepted")
        };
        assert!(err.contains("trustedRoot"), "{err}");
    }
}
