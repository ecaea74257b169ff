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
use sigstore_verify::trust_root::TrustedRoot;
use sigstore_verify::types::{DerCertificate, DerPublicKey};

use crate::keys::parse_certificates;
use crate::rejection::Rejection;
use crate::trust_source::RootState;

pub use crate::trust_source::PUBLIC_GOOD_TRUSTED_ROOT;

const TRUSTED_ROOT_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.trustedroot+json;version=0.1";
/// A validity start far enough back for any signature; custom keys carry no window.
const EPOCH: &str = "1970-01-01T00:00:00Z";

/// Trust for one attestor: the sigstore-verify `Verifier` and the certificate authorities'
/// certificates (for keyless signatures that carry no log entry or timestamp).
pub(crate) struct Trust {
    pub(crate) verifier: Arc<Verifier>,
    pub(crate) ca_certs: Vec<DerCertificate>,
    /// The parsed root, for the log entry kinds sigstore-verify does not read.
    pub(crate) root: Arc<TrustedRoot>,
    /// Where the root came from, for a denial naming a log it does not know.
    pub(crate) described: Arc<str>,
}

/// Builds the trust for one cosign attestor. `default_root` is the process-wide root (the
/// embedded public-good one unless configured otherwise).
pub(crate) fn verifier_for(cosign: &Cosign, default_root: &RootState) -> Result<Trust, Rejection> {
    let own_root = cosign
        .trusted_root
        .as_ref()
        .and_then(|s| s.value.as_deref())
        .filter(|t| !t.trim().is_empty());
    // Only the public-good root (embedded or from its TUF repository) is known to list every
    // log its users name; a root the policy or the operator gives is authoritative about its
    // own logs.
    let public_good = own_root.is_none() && default_root.public_good;
    let mut described = match own_root {
        Some(_) => "the attestor's trustedRoot".to_owned(),
        None => format!("the trust root ({})", default_root.describe()),
    };
    let mut root: Value = match cosign
        .trusted_root
        .as_ref()
        .and_then(|s| s.value.as_deref())
    {
        Some(text) if !text.trim().is_empty() => serde_json::from_str(text).map_err(|e| {
            Rejection::Attestor(format!(
                "trustedRoot is not a trusted_root.json document: {e}"
            ))
        })?,
        _ => serde_json::from_str(&default_root.json).map_err(|e| {
            Rejection::Attestor(format!("the default trusted root is not valid JSON: {e}"))
        })?,
    };
    let roots = cosign.keyless.as_ref().and_then(|k| k.roots.as_deref());
    if let Some(roots) = roots.filter(|r| !r.trim().is_empty()) {
        root["certificateAuthorities"] = json!([authority(roots, "keyless.roots")?]);
        described.push_str(", its certificate authorities from keyless.roots");
    }
    if let Some(ctlog) = &cosign.ctlog {
        if let Some(pem) = ctlog
            .rekor_pub_key
            .as_deref()
            .filter(|s| !s.trim().is_empty())
        {
            root["tlogs"] = json!([log_entry(pem, "ctlog.rekorPubKey")?]);
            described.push_str(", its transparency log from ctlog.rekorPubKey");
        }
        if let Some(pem) = ctlog
            .ct_log_pub_key
            .as_deref()
            .filter(|s| !s.trim().is_empty())
        {
            root["ctlogs"] = json!([log_entry(pem, "ctlog.ctLogPubKey")?]);
            described.push_str(", its CT log from ctlog.ctLogPubKey");
        }
        if let Some(pem) = ctlog
            .tsa_cert_chain
            .as_deref()
            .filter(|s| !s.trim().is_empty())
        {
            root["timestampAuthorities"] = json!([authority(pem, "ctlog.tsaCertChain")?]);
            described.push_str(", its timestamp authority from ctlog.tsaCertChain");
        }
    }
    if let Some(url) = cosign
        .ctlog
        .as_ref()
        .and_then(|c| c.url.as_deref())
        .filter(|u| !u.trim().is_empty() && public_good)
    {
        check_log_url(&root, url)?;
    }
    if root.get("mediaType").is_none() {
        root["mediaType"] = json!(TRUSTED_ROOT_MEDIA_TYPE);
    }
    let parsed = TrustedRoot::from_json(&root.to_string())
        .map_err(|e| Rejection::Attestor(format!("trusted root cannot be used: {e}")))?;
    let verifier = Verifier::new(&parsed)
        .map_err(|e| Rejection::Attestor(format!("trusted root cannot be used: {e}")))?;
    Ok(Trust {
        verifier: Arc::new(verifier),
        ca_certs: parsed.fulcio_certs(),
        root: Arc::new(parsed),
        described: Arc::from(described),
    })
}

/// The denial of a log entry (or SCT, or timestamp) from a log the trust root does not know:
/// `described` says which root, from where and when, so that an operator sees a rotation or a
/// new shard the root has not caught up with, not a bare "verification failed".
pub(crate) fn unknown_log(kind: &str, key_id: &[u8], described: &str) -> Rejection {
    Rejection::UnknownLog {
        log: kind.to_owned(),
        id: hex::encode(key_id),
        root: described.to_owned(),
    }
}

/// Whether `root` lists a transparency log with this key id (at any time).
pub(crate) fn knows_tlog(root: &TrustedRoot, key_id: &[u8]) -> bool {
    root.tlogs
        .iter()
        .any(|l| l.log_id.key_id.as_bytes() == key_id)
}

/// Whether `root` lists a CT log with this key id (at any time).
pub(crate) fn knows_ctlog(root: &TrustedRoot, key_id: &[u8]) -> bool {
    root.ctlogs
        .iter()
        .any(|l| l.log_id.key_id.as_bytes() == key_id)
}

/// A verifier of the embedded public-good root alone.
pub(crate) fn public_good_verifier() -> Result<Verifier, Rejection> {
    let root = TrustedRoot::from_json(PUBLIC_GOOD_TRUSTED_ROOT)
        .map_err(|e| Rejection::Attestor(format!("trusted root cannot be used: {e}")))?;
    Verifier::new(&root)
        .map_err(|e| Rejection::Attestor(format!("trusted root cannot be used: {e}")))
}

/// `ctlog.url` names the Rekor instance Kyverno would query. ivory never queries it: log
/// entries are verified offline against the trust root's log keys. With the public-good root,
/// the URL must name one of its logs (or the policy gives the log's key as
/// `ctlog.rekorPubKey`, which replaces them): a private or mistyped Rekor would otherwise be
/// silently replaced by the public logs.
fn check_log_url(root: &Value, url: &str) -> Result<(), Rejection> {
    let wanted = url.trim().trim_end_matches('/');
    let logs = root.get("tlogs").and_then(Value::as_array);
    let known = logs.is_some_and(|logs| {
        logs.iter().any(|l| {
            let base = l.get("baseUrl").and_then(Value::as_str).unwrap_or_default();
            base.is_empty() || base.trim_end_matches('/') == wanted
        })
    });
    if known {
        return Ok(());
    }
    Err(Rejection::Attestor(format!(
        "ctlog.url {url} is not a transparency log of the trust root (ivory verifies log entries offline against the trust root's log keys); name that log's key in ctlog.rekorPubKey or trustedRoot"
    )))
}

/// A `certificateAuthorities`/`timestampAuthorities` entry from a PEM chain (leaf first).
fn authority(pem: &str, field: &str) -> Result<Value, Rejection> {
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
fn log_entry(pem: &str, field: &str) -> Result<Value, Rejection> {
    let der = DerPublicKey::from_pem(pem.trim())
        .map_err(|e| Rejection::Attestor(format!("{field} is not a PEM public key: {e}")))?;
    let details = match KeyAlgorithm::from_spki(&der) {
        Ok(KeyAlgorithm::EcdsaP256) => "PKIX_ECDSA_P256_SHA_256",
        Ok(KeyAlgorithm::EcdsaP384) => "PKIX_ECDSA_P384_SHA_384",
        Ok(KeyAlgorithm::Ed25519) => "PKIX_ED25519",
        Ok(KeyAlgorithm::Rsa) => "PKIX_RSA_PKCS1V15_2048_SHA256",
        _ => {
            return Err(Rejection::Attestor(format!(
                "{field} has an unsupported key type"
            )));
        }
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
        assert!(verifier_for(&Cosign::default(), &RootState::embedded()).is_ok());
    }

    #[test]
    fn ctlog_url_must_name_a_log_of_the_trust_root() {
        let with_url = |url: &str, key: Option<&str>| Cosign {
            ctlog: Some(Ctlog {
                url: Some(url.into()),
                rekor_pub_key: key.map(str::to_owned),
                ..Ctlog::default()
            }),
            ..Cosign::default()
        };
        let root = &RootState::embedded();
        assert!(verifier_for(&with_url("https://rekor.sigstore.dev", None), root).is_ok());
        assert!(verifier_for(&with_url("https://rekor.sigstore.dev/", None), root).is_ok());
        let Err(err) = verifier_for(&with_url("https://rekor.example.com", None), root) else {
            panic!("an unknown log was accepted")
        };
        assert!(
            err.to_string()
                .contains("ctlog.url https://rekor.example.com"),
            "{err}"
        );
        let key = include_str!("../../../fixtures/captured/connaisseur/cosign/keys/alice.key");
        assert!(verifier_for(&with_url("https://rekor.example.com", Some(key)), root).is_ok());
        // A root of the policy's own speaks for its logs.
        let mut own = with_url("https://rekor.example.com", None);
        own.trusted_root = Some(StringSource {
            value: Some(PUBLIC_GOOD_TRUSTED_ROOT.into()),
            expression: None,
        });
        assert!(verifier_for(&own, root).is_ok());
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
        assert!(verifier_for(&cosign, &RootState::embedded()).is_ok());
        let bad = Cosign {
            trusted_root: Some(StringSource {
                value: Some("{".into()),
                expression: None,
            }),
            ..Cosign::default()
        };
        let Err(err) = verifier_for(&bad, &RootState::embedded()) else {
            panic!("bad root accepted")
        };
        assert!(err.to_string().contains("trustedRoot"), "{err}");
    }
}
