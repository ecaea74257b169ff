//! Rekor v1 entry kinds sigstore-verify does not read: `rekord/0.0.1` (keyless cosign `.sig`
//! signatures of 2021–2022) and `intoto/0.0.1` (cosign `.att` attestations until 2023, e.g.
//! slsa-github-generator container provenance v1.4–v1.9). They get the checks the newer kinds
//! get from sigstore-verify, as cosign applies them:
//!
//! * the Signed Entry Timestamp verifies with a log key of the trust root valid at the entry's
//!   integrated time (Rekor's canonical JSON of body, integrated time, log index and log id);
//! * the entry body names this signature: `rekord` the payload's SHA-256, the signature and the
//!   signer's certificate or key; `intoto` the SHA-256 of the DSSE envelope as stored, of its
//!   payload, and the signer's certificate or key;
//! * keyless: the certificate chains to a certificate authority of the trust root valid at the
//!   integrated time, the integrated time lies inside the certificate's validity, its embedded
//!   SCT verifies with a CT log key of the trust root (unless `insecureIgnoreSCT`), and it names
//!   an accepted identity.
//!
//! The signature itself is then checked by the caller with the returned key.

use base64::Engine as _;
use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use sigstore_verify::crypto::{SigningScheme, parse_certificate_info};
use sigstore_verify::trust_root::TrustedRoot;
use sigstore_verify::types::{DerCertificate, DerPublicKey, Sha256Hash, SignatureBytes};
use x509_cert::Certificate;
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{Decode as _, Encode as _};
use x509_cert::ext::pkix::SignedCertificateTimestampList;
use x509_cert::ext::pkix::sct::{HashAlgorithm, SignatureAlgorithm, SignedCertificateTimestamp};

use crate::attestor_plan::{Authority, Plan};
use crate::envelope::{
    ANNOTATION_CERTIFICATE, ANNOTATION_CHAIN, Envelope, Legacy, RawDsse, RekorBundle,
};
use crate::keys::{PublicKey, parse_certificates};
use crate::rejection::Rejection;
use crate::signed_json::parse_signed_json;
use ivory_engine::verifier::Signer;

/// `1.3.6.1.4.1.11129.2.4.2`, the embedded SCT list (RFC 6962 §3.3).
const CT_PRECERT_SCTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.11129.2.4.2");

/// The legacy entry kinds this module verifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    RekordV001,
    IntotoV001,
}

/// A legacy layer's Rekor entry, decoded.
struct Entry {
    /// The body as Rekor stores it (base64), which the SET signs.
    body_b64: String,
    body: Value,
    kind: Kind,
    integrated_time: i64,
    log_index: i64,
    log_id_hex: String,
    set: Vec<u8>,
}

/// Whether a legacy layer's Rekor entry is of a kind only this module reads.
pub(crate) fn is_legacy_entry(layer: &Legacy) -> bool {
    layer
        .rekor_bundle
        .as_deref()
        .is_some_and(|a| matches!(read_entry(a), Ok(Some(_))))
}

/// Checks the log entry and the signer of `env` (see the module comment) and returns the key
/// the signature must verify with.
pub(crate) fn signer(
    plan: &Plan,
    root: &TrustedRoot,
    env: &Envelope,
) -> Result<(PublicKey, Signer), Rejection> {
    let (layer, dsse) = match env {
        Envelope::SimpleSigning(l) => (l, false),
        Envelope::Dsse(l) => (l, true),
        Envelope::Bundle(_) => {
            return Err(Rejection::LogEntry(
                "a Sigstore bundle has no legacy Rekor entry".into(),
            ));
        }
    };
    let annotation = layer.rekor_bundle.as_deref().ok_or(Rejection::LogEntry(
        "signature has no transparency log entry".into(),
    ))?;
    let entry = read_entry(annotation)?.ok_or(Rejection::LogEntry(
        "transparency log entry is not of a legacy kind".into(),
    ))?;
    let time = Timestamp::from_second(entry.integrated_time)
        .map_err(|e| Rejection::LogEntry(format!("Rekor integrated time is out of range: {e}")))?;
    verify_set(&entry, root, time, &plan.trust_described)?;
    // The SET signs the index with the body: it is the checked entry's place in the log.
    let log_index = u64::try_from(entry.log_index).ok();
    let named_key = match (entry.kind, dsse) {
        (Kind::RekordV001, false) => check_rekord(&entry.body, layer)?,
        (Kind::IntotoV001, true) => check_intoto(&entry.body, layer)?,
        (Kind::RekordV001, true) => {
            return Err(Rejection::LogEntry(
                "a rekord entry cannot log a DSSE envelope".into(),
            ));
        }
        (Kind::IntotoV001, false) => {
            return Err(Rejection::LogEntry(
                "an intoto entry cannot log a simple-signing signature".into(),
            ));
        }
    };
    match &plan.authority {
        Authority::Keyless(rules) => {
            let (leaf, chain) = layer_certificates(layer)?;
            if !same_certificate(&named_key, &leaf) {
                return Err(Rejection::LogEntry(
                    "Rekor entry names another certificate than the signature's".into(),
                ));
            }
            let info = parse_certificate_info(&leaf).map_err(|e| {
                Rejection::Certificate(format!("signing certificate cannot be parsed: {e}"))
            })?;
            if time < info.not_before || time > info.not_after {
                return Err(Rejection::Certificate(format!(
                    "Rekor integrated time {time} is outside the signing certificate's validity ({} to {})",
                    info.not_before, info.not_after
                )));
            }
            let authorities = authorities_at(root, time);
            let at = u64::try_from(entry.integrated_time).unwrap_or(0);
            crate::chain::verify_to_anchors(&leaf, &chain, &authorities, at)?;
            if !plan.ignore_sct {
                let issuers: Vec<&DerCertificate> = chain.iter().chain(&authorities).collect();
                verify_embedded_sct(&leaf, &issuers, root, &plan.trust_described)?;
            }
            rules.check(&info)?;
            let signer = crate::signer::of_certificate(&info, log_index);
            Ok((
                PublicKey::with_default_scheme(info.public_key, info.key_algorithm),
                signer,
            ))
        }
        Authority::Key(key) | Authority::Certificate(key) => {
            if !names_key(&named_key, &key.der) {
                return Err(Rejection::LogEntry(
                    "Rekor entry names another key than the attestor's".into(),
                ));
            }
            Ok((key.clone(), crate::signer::of_key(key, log_index)))
        }
        Authority::Notary(_) => Err(Rejection::Attestor("not a cosign attestor".into())),
    }
}

/// Decodes the `dev.sigstore.cosign/bundle` annotation; `None` when its kind is not legacy.
fn read_entry(annotation: &str) -> Result<Option<Entry>, Rejection> {
    let rb: RekorBundle = parse_signed_json(annotation.as_bytes(), "Rekor bundle annotation")?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let body_bytes = b64
        .decode(rb.payload.body.as_bytes())
        .map_err(|e| Rejection::Malformed(format!("malformed Rekor body: {e}")))?;
    let body: Value = parse_signed_json(&body_bytes, "Rekor body")?;
    let field = |k: &str| body.get(k).and_then(Value::as_str).unwrap_or_default();
    let kind = match (field("kind"), field("apiVersion")) {
        ("rekord", "0.0.1") => Kind::RekordV001,
        ("intoto", "0.0.1") => Kind::IntotoV001,
        _ => return Ok(None),
    };
    let set = b64
        .decode(rb.signed_entry_timestamp.as_bytes())
        .map_err(|e| Rejection::Malformed(format!("malformed Rekor SignedEntryTimestamp: {e}")))?;
    Ok(Some(Entry {
        body_b64: rb.payload.body,
        body,
        kind,
        integrated_time: rb.payload.integrated_time,
        log_index: rb.payload.log_index,
        log_id_hex: rb.payload.log_id,
        set,
    }))
}

/// What Rekor v1 signs as the SET: RFC 8785 JSON of these four fields.
#[derive(Serialize)]
struct SetPayload<'a> {
    body: &'a str,
    #[serde(rename = "integratedTime")]
    integrated_time: i64,
    #[serde(rename = "logIndex")]
    log_index: i64,
    #[serde(rename = "logID")]
    log_id: &'a str,
}

fn verify_set(
    entry: &Entry,
    root: &TrustedRoot,
    time: Timestamp,
    described: &str,
) -> Result<(), Rejection> {
    let key_id = Sha256Hash::from_hex(&entry.log_id_hex)
        .map_err(|e| Rejection::Malformed(format!("malformed Rekor logID: {e}")))?;
    if !crate::trust::knows_tlog(root, key_id.as_bytes()) {
        return Err(crate::trust::unknown_log(
            "transparency log",
            key_id.as_bytes(),
            described,
        ));
    }
    let keyring = root
        .rekor_keys()
        .map_err(|e| Rejection::Attestor(format!("trust root has unusable log keys: {e}")))?;
    let key = keyring.key_at(&key_id, time).ok_or_else(|| {
        Rejection::Tlog(format!(
            "no transparency log key of the trust root was valid at {time} for log {}",
            entry.log_id_hex
        ))
    })?;
    let payload = SetPayload {
        body: &entry.body_b64,
        integrated_time: entry.integrated_time,
        log_index: entry.log_index,
        log_id: &entry.log_id_hex,
    };
    let canonical = serde_json_canonicalizer::to_vec(&payload)
        .map_err(|e| Rejection::LogEntry(format!("cannot canonicalize the Rekor entry: {e}")))?;
    key.verify(&canonical, &SignatureBytes::new(entry.set.clone()))
        .map_err(|e| Rejection::Tlog(format!("Rekor SignedEntryTimestamp does not verify: {e}")))
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn str_at<'a>(body: &'a Value, pointer: &str) -> Result<&'a str, Rejection> {
    body.pointer(pointer)
        .and_then(Value::as_str)
        .ok_or_else(|| Rejection::LogEntry(format!("Rekor body has no {pointer}")))
}

fn sha256_at<'a>(body: &'a Value, pointer: &str) -> Result<&'a str, Rejection> {
    let algorithm = str_at(body, &format!("{pointer}/algorithm"))?;
    if algorithm != "sha256" {
        return Err(Rejection::LogEntry(format!(
            "Rekor body {pointer} uses {algorithm}, not sha256"
        )));
    }
    str_at(body, &format!("{pointer}/value"))
}

fn decode_b64(text: &str, what: &str) -> Result<Vec<u8>, Rejection> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| Rejection::Malformed(format!("malformed {what}: {e}")))
}

/// `rekord/0.0.1`: payload hash and signature as logged; returns the logged signer (PEM).
fn check_rekord(body: &Value, layer: &Legacy) -> Result<Vec<u8>, Rejection> {
    if !sha256_at(body, "/spec/data/hash")?.eq_ignore_ascii_case(&hex_sha256(&layer.blob)) {
        return Err(Rejection::LogEntry(
            "Rekor entry logs another payload than the signature's".into(),
        ));
    }
    let logged = decode_b64(str_at(body, "/spec/signature/content")?, "Rekor signature")?;
    let signature = layer.signature.as_deref().ok_or(Rejection::Malformed(
        "signature layer has no signature annotation".into(),
    ))?;
    if logged != decode_b64(signature, "signature annotation")? {
        return Err(Rejection::LogEntry(
            "Rekor entry logs another signature than the layer's".into(),
        ));
    }
    decode_b64(
        str_at(body, "/spec/signature/publicKey/content")?,
        "Rekor public key",
    )
}

/// `intoto/0.0.1`: envelope and payload hashes as logged; returns the logged signer (PEM).
fn check_intoto(body: &Value, layer: &Legacy) -> Result<Vec<u8>, Rejection> {
    if !sha256_at(body, "/spec/content/hash")?.eq_ignore_ascii_case(&hex_sha256(&layer.blob)) {
        return Err(Rejection::LogEntry(
            "Rekor entry logs another DSSE envelope than the layer's".into(),
        ));
    }
    if body.pointer("/spec/content/payloadHash").is_some() {
        let envelope: RawDsse = parse_signed_json(&layer.blob, "DSSE envelope")?;
        let payload = decode_b64(&envelope.payload, "DSSE payload")?;
        if !sha256_at(body, "/spec/content/payloadHash")?
            .eq_ignore_ascii_case(&hex_sha256(&payload))
        {
            return Err(Rejection::LogEntry(
                "Rekor entry logs another in-toto payload than the layer's".into(),
            ));
        }
    }
    decode_b64(str_at(body, "/spec/publicKey")?, "Rekor public key")
}

fn layer_certificates(layer: &Legacy) -> Result<(DerCertificate, Vec<DerCertificate>), Rejection> {
    let text = layer.certificate.as_deref().ok_or(Rejection::Malformed(
        "keyless signature has no certificate".into(),
    ))?;
    let leaf = parse_certificates(text, ANNOTATION_CERTIFICATE)?
        .into_iter()
        .next()
        .ok_or(Rejection::Malformed(
            "keyless signature has no certificate".into(),
        ))?;
    let chain = match &layer.chain {
        Some(c) => parse_certificates(c, ANNOTATION_CHAIN)?,
        None => Vec::new(),
    };
    Ok((leaf, chain))
}

/// The logged PEM is this certificate.
fn same_certificate(pem: &[u8], cert: &DerCertificate) -> bool {
    std::str::from_utf8(pem)
        .ok()
        .and_then(|t| parse_certificates(t, "Rekor public key").ok())
        .is_some_and(|certs| {
            certs
                .first()
                .is_some_and(|c| c.as_bytes() == cert.as_bytes())
        })
}

/// The logged PEM is this public key, or a certificate for it.
fn names_key(pem: &[u8], key: &DerPublicKey) -> bool {
    let Ok(text) = std::str::from_utf8(pem) else {
        return false;
    };
    if let Ok(logged) = DerPublicKey::from_pem(text.trim()) {
        return logged.as_bytes() == key.as_bytes();
    }
    parse_certificates(text, "Rekor public key")
        .ok()
        .and_then(|certs| certs.into_iter().next())
        .and_then(|c| parse_certificate_info(&c).ok())
        .is_some_and(|info| info.public_key.as_bytes() == key.as_bytes())
}

/// Certificates of the trust root's authorities whose validity window holds `time`.
fn authorities_at(root: &TrustedRoot, time: Timestamp) -> Vec<DerCertificate> {
    root.certificate_authorities
        .iter()
        .filter(|ca| ca.valid_for.is_none_or(|v| v.contains(time)))
        .flat_map(|ca| {
            ca.cert_chain
                .certificates
                .iter()
                .map(|c| c.raw_bytes.clone())
        })
        .collect()
}

/// The certificate's embedded SCT verifies with a CT log key of the trust root valid when it
/// was issued. `issuers` are the candidates for the leaf's issuer (whose key the SCT binds).
fn verify_embedded_sct(
    leaf: &DerCertificate,
    issuers: &[&DerCertificate],
    root: &TrustedRoot,
    described: &str,
) -> Result<(), Rejection> {
    let cert = Certificate::from_der(leaf.as_bytes()).map_err(|e| {
        Rejection::Certificate(format!("signing certificate cannot be parsed: {e}"))
    })?;
    let list: SignedCertificateTimestampList = match cert.tbs_certificate.get() {
        Ok(Some((_, list))) => list,
        Ok(None) => {
            return Err(Rejection::Certificate(
                "certificate does not include required embedded SCT (set insecureIgnoreSCT to accept it)"
                    .into(),
            ));
        }
        Err(e) => return Err(Rejection::Malformed(format!("malformed SCT list: {e}"))),
    };
    let scts = list
        .parse_timestamps()
        .map_err(|e| Rejection::Malformed(format!("malformed SCT list: {e:?}")))?;
    let [sct] = scts.as_slice() else {
        return Err(Rejection::Certificate(format!(
            "certificate carries {} SCTs, expected one",
            scts.len()
        )));
    };
    let sct = sct
        .parse_timestamp()
        .map_err(|e| Rejection::Malformed(format!("malformed SCT: {e:?}")))?;
    let scheme = sct_scheme(&sct)?;
    let keyring = root
        .ctfe_keys(scheme)
        .map_err(|e| Rejection::Attestor(format!("trust root has unusable CT log keys: {e}")))?;
    let issued = i64::try_from(sct.timestamp)
        .ok()
        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
        .ok_or(Rejection::Certificate(
            "SCT timestamp is out of range".into(),
        ))?;
    let tbs = precertificate_tbs(&cert)?;
    let signature = SignatureBytes::new(sct.signature.signature.as_slice().to_vec());
    let log_id = Sha256Hash::new(sct.log_id.key_id);
    if !crate::trust::knows_ctlog(root, log_id.as_bytes()) {
        return Err(crate::trust::unknown_log(
            "CT log",
            log_id.as_bytes(),
            described,
        ));
    }
    for issuer in issuers {
        let Ok(info) = parse_certificate_info(issuer) else {
            continue;
        };
        let data = signed_sct_data(
            &sct,
            &Sha256::digest(info.public_key.as_bytes()).into(),
            &tbs,
        )?;
        if keyring
            .verify_with_key_id_at(&log_id, issued, &data, &signature)
            .is_ok()
        {
            return Ok(());
        }
    }
    Err(Rejection::Certificate(
        "embedded SCT does not verify with a CT log key of the trust root".into(),
    ))
}

fn sct_scheme(sct: &SignedCertificateTimestamp) -> Result<SigningScheme, Rejection> {
    let alg = &sct.signature.algorithm;
    match (&alg.hash, &alg.signature) {
        (HashAlgorithm::Sha256, SignatureAlgorithm::Ecdsa) => Ok(SigningScheme::EcdsaP256Sha256),
        (HashAlgorithm::Sha384, SignatureAlgorithm::Ecdsa) => Ok(SigningScheme::EcdsaP384Sha384),
        (HashAlgorithm::Sha256, SignatureAlgorithm::Rsa) => Ok(SigningScheme::RsaPkcs1Sha256),
        (HashAlgorithm::Sha384, SignatureAlgorithm::Rsa) => Ok(SigningScheme::RsaPkcs1Sha384),
        (HashAlgorithm::Sha512, SignatureAlgorithm::Rsa) => Ok(SigningScheme::RsaPkcs1Sha512),
        (hash, sig) => Err(Rejection::Certificate(format!(
            "unsupported SCT algorithm {hash:?}/{sig:?}"
        ))),
    }
}

/// The certificate's TBS without its SCT list: what the CT log saw as the precertificate.
fn precertificate_tbs(cert: &Certificate) -> Result<Vec<u8>, Rejection> {
    let mut tbs = cert.tbs_certificate.clone();
    tbs.extensions = tbs.extensions.map(|exts| {
        exts.into_iter()
            .filter(|e| e.extn_id != CT_PRECERT_SCTS)
            .collect()
    });
    tbs.to_der()
        .map_err(|e| Rejection::LogEntry(format!("cannot encode the precertificate: {e}")))
}

/// RFC 6962 §3.2 `digitally-signed` struct of a precertificate SCT (TLS encoding).
fn signed_sct_data(
    sct: &SignedCertificateTimestamp,
    issuer_key_hash: &[u8; 32],
    tbs: &[u8],
) -> Result<Vec<u8>, Rejection> {
    let extensions = sct.extensions.as_slice();
    // opaque<1..2^24-1>: a longer precertificate cannot have been logged.
    let tbs_len = u32::try_from(tbs.len())
        .ok()
        .filter(|n| *n < 1 << 24)
        .ok_or_else(|| Rejection::Certificate("certificate too large for an SCT".into()))?;
    let ext_len = u16::try_from(extensions.len())
        .map_err(|_| Rejection::Malformed("SCT extensions too long".into()))?;
    let mut out = Vec::with_capacity(48 + tbs.len() + extensions.len());
    out.push(0); // sct_version v1
    out.push(0); // signature_type certificate_timestamp
    out.extend_from_slice(&sct.timestamp.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes()); // entry_type precert_entry
    out.extend_from_slice(issuer_key_hash);
    out.extend_from_slice(&tbs_len.to_be_bytes()[1..]);
    out.extend_from_slice(tbs);
    out.extend_from_slice(&ext_len.to_be_bytes());
    out.extend_from_slice(extensions);
    Ok(out)
}

#[cfg(test)]
mod tests;
