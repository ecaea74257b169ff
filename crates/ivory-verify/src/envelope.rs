//! Signature material as found in a registry, and its conversion to a Sigstore bundle.
//!
//! cosign's legacy formats (`.sig` simple-signing layers, `.att` DSSE layers, certificate, chain
//! and Rekor "bundle" in layer annotations) are rewritten as a v0.1 Sigstore bundle so that
//! sigstore-verify performs every check (chain, SCT, SET, inclusion proof, TSA, tlog-body
//! consistency) on all formats alike.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use sigstore_verify::types::{Bundle, SignatureContent};

use crate::keys::parse_certificates;
use crate::rejection::Rejection;
use crate::signed_json::{check_signed_shape, parse_signed_json};

/// cosign layer annotation holding the base64 signature of a simple-signing payload.
pub const ANNOTATION_SIGNATURE: &str = "dev.cosignproject.cosign/signature";
/// cosign layer annotation holding the signing certificate (PEM).
pub const ANNOTATION_CERTIFICATE: &str = "dev.sigstore.cosign/certificate";
/// cosign layer annotation holding the certificate chain (PEM).
pub const ANNOTATION_CHAIN: &str = "dev.sigstore.cosign/chain";
/// cosign layer annotation holding the Rekor SET "bundle" (JSON).
pub const ANNOTATION_REKOR_BUNDLE: &str = "dev.sigstore.cosign/bundle";
/// Media type of cosign's simple-signing payload layers.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// Media type of DSSE layers (cosign `.att`).
pub const DSSE_MEDIA_TYPE: &str = "application/vnd.dsse.envelope.v1+json";
/// Prefix of every Sigstore bundle media type (v0.1 to v0.3).
pub const BUNDLE_MEDIA_TYPE_PREFIX: &str = "application/vnd.dev.sigstore.bundle";

const BUNDLE_V01: &str = "application/vnd.dev.sigstore.bundle+json;version=0.1";

/// One signature candidate fetched for an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Envelope {
    /// A cosign `.sig` layer: the simple-signing payload and its annotations.
    SimpleSigning(Legacy),
    /// A cosign `.att` layer: a DSSE envelope and its annotations.
    Dsse(Legacy),
    /// A Sigstore bundle document (OCI referrer layer).
    Bundle(Vec<u8>),
}

/// A legacy cosign layer: the blob and the annotations that matter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Legacy {
    /// The layer's bytes: a simple-signing payload (`.sig`) or a DSSE envelope (`.att`).
    pub blob: Vec<u8>,
    /// Base64 signature over the simple-signing payload ([`ANNOTATION_SIGNATURE`]); DSSE
    /// layers carry theirs inside the envelope.
    pub signature: Option<String>,
    /// PEM signing certificate of a keyless or certificate signature
    /// ([`ANNOTATION_CERTIFICATE`]).
    pub certificate: Option<String>,
    /// PEM chain from the signing certificate up to its root ([`ANNOTATION_CHAIN`]).
    pub chain: Option<String>,
    /// Rekor's signed entry timestamp and entry body as JSON
    /// ([`ANNOTATION_REKOR_BUNDLE`]): the transparency-log evidence.
    pub rekor_bundle: Option<String>,
}

impl Legacy {
    /// Picks the annotations cosign writes from a layer descriptor's annotation map.
    pub fn from_annotations(
        blob: Vec<u8>,
        annotations: Option<&serde_json::Map<String, Value>>,
    ) -> Self {
        let get = |k: &str| {
            annotations
                .and_then(|a| a.get(k))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Self {
            blob,
            signature: get(ANNOTATION_SIGNATURE),
            certificate: get(ANNOTATION_CERTIFICATE),
            chain: get(ANNOTATION_CHAIN),
            rekor_bundle: get(ANNOTATION_REKOR_BUNDLE),
        }
    }
}

/// cosign's `dev.sigstore.cosign/bundle` annotation.
#[derive(Deserialize)]
pub(crate) struct RekorBundle {
    #[serde(rename = "SignedEntryTimestamp")]
    pub(crate) signed_entry_timestamp: String,
    #[serde(rename = "Payload")]
    pub(crate) payload: RekorPayload,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RekorPayload {
    pub(crate) body: String,
    pub(crate) integrated_time: i64,
    pub(crate) log_index: i64,
    #[serde(rename = "logID")]
    pub(crate) log_id: String,
}

/// The Rekor entry of a legacy layer as a bundle `tlogEntries[]` item.
fn tlog_entry(annotation: &str) -> Result<Value, Rejection> {
    let rb: RekorBundle = parse_signed_json(
        annotation.as_bytes(),
        &format!("{ANNOTATION_REKOR_BUNDLE} annotation"),
    )?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = b64
        .decode(rb.payload.body.as_bytes())
        .map_err(|e| Rejection::Malformed(format!("malformed Rekor body: {e}")))?;
    let body_json: Value = parse_signed_json(&body, "Rekor body")?;
    let kind = body_json
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let version = body_json
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let log_id = hex::decode(&rb.payload.log_id)
        .map_err(|e| Rejection::Malformed(format!("malformed Rekor logID: {e}")))?;
    Ok(json!({
        "logIndex": rb.payload.log_index.to_string(),
        "logId": { "keyId": b64.encode(log_id) },
        "kindVersion": { "kind": kind, "version": version },
        "integratedTime": rb.payload.integrated_time.to_string(),
        "inclusionPromise": { "signedEntryTimestamp": rb.signed_entry_timestamp },
        "canonicalizedBody": rb.payload.body,
    }))
}

/// The verification material of a legacy layer: certificate (+ chain) or a key hint.
fn material(legacy: &Legacy, use_key: bool) -> Result<Value, Rejection> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let cert = legacy.certificate.as_ref().filter(|_| !use_key);
    let Some(cert) = cert else {
        return Ok(json!({ "publicKey": { "hint": "" } }));
    };
    let mut certs = parse_certificates(cert, ANNOTATION_CERTIFICATE)?;
    if let Some(chain) = &legacy.chain {
        certs.extend(parse_certificates(chain, ANNOTATION_CHAIN)?);
    }
    let certificates: Vec<Value> = certs
        .iter()
        .map(|c| json!({ "rawBytes": b64.encode(c.as_bytes()) }))
        .collect();
    Ok(json!({ "x509CertificateChain": { "certificates": certificates } }))
}

impl Envelope {
    /// Rewrites a legacy layer as a v0.1 bundle; a Sigstore bundle is parsed as is.
    /// `None` when a legacy layer has no Rekor entry (only key-based verification without the
    /// transparency log can use it). `use_key` marks the material as a public key (key and
    /// certificate attestors) rather than the layer's certificate. A DSSE payload is
    /// shape-checked here, before sigstore-verify or ivory parses it. A Sigstore bundle whose
    /// log entry is of the Rekor v2 kind `dsse/0.0.2` (which sigstore-verify does not read)
    /// comes back without that entry, returned beside it for [`crate::rekor_v2_dsse`] to check.
    pub(crate) fn to_bundle(
        &self,
        use_key: bool,
    ) -> Result<Option<(Bundle, Option<crate::rekor_v2_dsse::Entry>)>, Rejection> {
        let parts = self.read_bundle(use_key)?;
        if let Some(SignatureContent::DsseEnvelope(d)) = parts.as_ref().map(|(b, _)| &b.content) {
            check_signed_shape(d.payload.as_bytes(), "in-toto statement")?;
        }
        Ok(parts)
    }

    fn read_bundle(
        &self,
        use_key: bool,
    ) -> Result<Option<(Bundle, Option<crate::rekor_v2_dsse::Entry>)>, Rejection> {
        let (legacy, content) = match self {
            Self::Bundle(json) => return read_sigstore_bundle(json).map(Some),
            Self::SimpleSigning(l) => {
                let sig = l.signature.as_deref().ok_or(Rejection::Malformed(
                    "signature layer has no signature annotation".into(),
                ))?;
                let b64 = base64::engine::general_purpose::STANDARD;
                let digest = b64.encode(Sha256::digest(&l.blob));
                (
                    l,
                    json!({ "messageSignature": {
                        "messageDigest": { "algorithm": "SHA2_256", "digest": digest },
                        "signature": sig.trim(),
                    }}),
                )
            }
            Self::Dsse(l) => {
                let env: Value = parse_signed_json(&l.blob, "DSSE envelope")?;
                (l, json!({ "dsseEnvelope": env }))
            }
        };
        let Some(rekor) = &legacy.rekor_bundle else {
            return Ok(None);
        };
        let mut material = material(legacy, use_key)?;
        material["tlogEntries"] = json!([tlog_entry(rekor)?]);
        let mut doc = json!({ "mediaType": BUNDLE_V01, "verificationMaterial": material });
        if let (Some(doc), Some(content)) = (doc.as_object_mut(), content.as_object()) {
            doc.extend(content.clone());
        }
        Bundle::from_json(&doc.to_string())
            .map(|b| Some((b, None)))
            .map_err(|e| {
                Rejection::Malformed(format!("cannot read cosign signature as a bundle: {e}"))
            })
    }
}

/// A Sigstore bundle document; one sigstore-verify cannot read only for its `dsse/0.0.2` log
/// entry is read without it (the entry returned beside it). Any other bundle is read once, as
/// before.
fn read_sigstore_bundle(
    json: &[u8],
) -> Result<(Bundle, Option<crate::rekor_v2_dsse::Entry>), Rejection> {
    check_signed_shape(json, "Sigstore bundle")?;
    let text = std::str::from_utf8(json)
        .map_err(|e| Rejection::Malformed(format!("bundle is not UTF-8: {e}")))?;
    let unreadable = match Bundle::from_json(text) {
        Ok(bundle) => return Ok((bundle, None)),
        Err(e) => Rejection::Malformed(format!("malformed Sigstore bundle: {e}")),
    };
    let Ok(mut doc) = parse_signed_json::<Value>(json, "Sigstore bundle") else {
        return Err(unreadable);
    };
    let Some(entry) = crate::rekor_v2_dsse::take_entry(&mut doc)? else {
        return Err(unreadable);
    };
    let bundle = serde_json::from_value::<Bundle>(doc)
        .map_err(|e| Rejection::Malformed(format!("malformed Sigstore bundle: {e}")))?;
    Ok((bundle, Some(entry)))
}

/// The simple-signing payload cosign signs for `.sig` signatures.
#[derive(Debug, Deserialize)]
pub(crate) struct SimpleSigning {
    pub(crate) critical: Critical,
    #[serde(default)]
    pub(crate) optional: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Critical {
    pub(crate) image: CriticalImage,
}

#[derive(Debug, Deserialize)]
pub(crate) struct CriticalImage {
    #[serde(rename = "docker-manifest-digest")]
    pub(crate) docker_manifest_digest: String,
}

/// A DSSE envelope as written in `.att` layers and bundles (several signatures allowed).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawDsse {
    pub(crate) payload_type: String,
    pub(crate) payload: String,
    #[serde(default)]
    pub(crate) signatures: Vec<RawDsseSignature>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RawDsseSignature {
    #[serde(default)]
    pub(crate) sig: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratify_keyless() -> Legacy {
        Legacy {
            blob: include_bytes!("../../../fixtures/captured/ratify/legacy-keyless-wabbitnetworks-cosign-image/payload.json").to_vec(),
            signature: Some(
                include_str!("../../../fixtures/captured/ratify/legacy-keyless-wabbitnetworks-cosign-image/signature.b64")
                    .trim()
                    .into(),
            ),
            certificate: Some(include_str!("../../../fixtures/captured/ratify/legacy-keyless-wabbitnetworks-cosign-image/cert.pem").into()),
            chain: Some(include_str!("../../../fixtures/captured/ratify/legacy-keyless-wabbitnetworks-cosign-image/chain.pem").into()),
            rekor_bundle: Some(
                include_str!("../../../fixtures/captured/ratify/legacy-keyless-wabbitnetworks-cosign-image/rekor-bundle.json").into(),
            ),
        }
    }

    #[test]
    fn legacy_keyless_becomes_v01_bundle_with_set() {
        let bundle = Envelope::SimpleSigning(ratify_keyless())
            .to_bundle(false)
            .unwrap()
            .unwrap()
            .0;
        assert!(bundle.has_inclusion_promise());
        assert_eq!(bundle.verification_material.tlog_entries.len(), 1);
        assert!(bundle.signing_certificate().is_some());
    }

    #[test]
    fn legacy_without_rekor_has_no_bundle_and_bad_rekor_is_named() {
        let mut l = ratify_keyless();
        l.rekor_bundle = None;
        assert!(
            Envelope::SimpleSigning(l.clone())
                .to_bundle(false)
                .unwrap()
                .is_none()
        );
        l.rekor_bundle = Some("{}".into());
        let err = Envelope::SimpleSigning(l)
            .to_bundle(false)
            .unwrap_err()
            .to_string();
        assert!(err.to_string().contains(ANNOTATION_REKOR_BUNDLE), "{err}");
    }
}
