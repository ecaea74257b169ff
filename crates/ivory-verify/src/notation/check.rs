//! One Notation signature checked against a [`NotaryPlan`], as the Notary Project trust policy
//! validates it: integrity (the envelope, the signature with the signing certificate's key,
//! the algorithm that key allows, the payload's `targetArtifact` = the image's descriptor),
//! authenticity (the certificate chain to the attestor's trust store with the code-signing
//! usage, and `trustedIdentities`), authentic timestamp (the chain valid at a trusted time: an
//! RFC 3161 countersignature verified to `tsaCerts`, the signing authority's time, or now),
//! expiry (the signature's own), revocation (the chain against CRLs already held, see
//! [`super::revocation`]). A check the trust policy only logs is reported as a warning and does
//! not fail. No IO.

use std::time::Duration;

use aws_lc_rs::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use ivory_engine::verifier::Signer;
use ivory_policy::notation::{
    Action, Check, TrustStore, TrustedIdentity, VerifyTimestamp, parse_dn,
};
use jiff::Timestamp;
use rustls_pki_types::{CertificateDer, UnixTime};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use sigstore_verify::types::{DerCertificate, SignatureBytes, TimestampToken, TsaAuthority};
use webpki::{EndEntityCert, KeyUsage};
use x509_cert::Certificate;
use x509_cert::der::{Decode as _, Encode as _};

use super::NotaryPlan;
use super::algorithms::CHAIN_ALGORITHMS;
use super::envelope::{Algorithm, SignedEnvelope, SigningScheme};
use super::revocation::{RevocationSource, Status, check_chain};
use super::timestamp_rsa::RsaTokenError;
use crate::rejection::Rejection;

/// `id-kp-codeSigning` (1.3.6.1.5.5.7.3.3), DER value bytes.
const ID_KP_CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];
const RSA_ENCRYPTION: &str = "1.2.840.113549.1.1.1";
const EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const P256: &str = "1.2.840.10045.3.1.7";
const P384: &str = "1.3.132.0.34";
const P521: &str = "1.3.132.0.35";

/// The image a signature must be about: its manifest's descriptor.
#[derive(Clone, Debug)]
pub(crate) struct Target<'a> {
    pub(crate) digest: &'a str,
    pub(crate) media_type: &'a str,
    pub(crate) size: u64,
}

/// A signature that verified, with the checks the trust policy only logs that failed.
#[derive(Debug)]
pub(crate) struct Verified {
    pub(crate) signer: Signer,
    pub(crate) warnings: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Payload {
    target_artifact: Descriptor,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    size: u64,
}

/// Verifies `env` for `target` at `now`, revocation against what `revocation` holds.
pub(crate) fn verify(
    plan: &NotaryPlan,
    env: &SignedEnvelope,
    target: &Target<'_>,
    revocation: &dyn RevocationSource,
    now: Timestamp,
) -> Result<Verified, Rejection> {
    let leaf = integrity(env, target)?;
    let mut warnings = Vec::new();
    let mut outcome =
        |check: Check, result: Result<(), Rejection>| match (plan.policy.action(check), result) {
            (_, Ok(())) | (Action::Skip, _) => Ok(()),
            (Action::Log, Err(e)) => {
                warnings.push(format!("{} (logged, not enforced): {e}", check_name(check)));
                Ok(())
            }
            (Action::Enforce, Err(e)) => Err(e),
        };
    let authentic = authenticity(plan, env, &leaf);
    let trusted_chain = authentic.is_ok();
    outcome(Check::Authenticity, authentic)?;
    outcome(
        Check::AuthenticTimestamp,
        authentic_timestamp(plan, env, now),
    )?;
    outcome(Check::Expiry, expiry(env, now))?;
    if plan.policy.action(Check::Revocation) != Action::Skip {
        // URLs are read from certificates only once their chain is trusted: an untrusted
        // signer (under `audit`) never makes ivory fetch anything.
        let status = if trusted_chain {
            check_chain(&env.chain, &plan.certs, revocation, CHAIN_ALGORITHMS, now)
        } else {
            Status::Unknown("revocation not checked: the certificate chain is not trusted".into())
        };
        outcome(
            Check::Revocation,
            match status {
                Status::Good => Ok(()),
                Status::Revoked(why) => Err(Rejection::Certificate(why)),
                Status::Unknown(why) => Err(Rejection::RevocationUnknown(why)),
            },
        )?;
    }
    Ok(Verified {
        signer: signer(&leaf.certificate),
        warnings,
    })
}

fn check_name(check: Check) -> &'static str {
    match check {
        Check::Integrity => "integrity",
        Check::Authenticity => "authenticity",
        Check::AuthenticTimestamp => "authentic timestamp",
        Check::Expiry => "expiry",
        Check::Revocation => "revocation",
    }
}

/// The parsed signing certificate.
struct Leaf {
    der: Vec<u8>,
    certificate: Certificate,
}

/// The signature verifies with the signing certificate's key, with the algorithm that key
/// allows, over a payload naming the image's descriptor.
fn integrity(env: &SignedEnvelope, target: &Target<'_>) -> Result<Leaf, Rejection> {
    let der = env
        .chain
        .first()
        .ok_or_else(|| Rejection::Malformed("the signature carries no certificate".into()))?
        .clone();
    let certificate = Certificate::from_der(&der).map_err(|e| {
        Rejection::Malformed(format!("the signing certificate cannot be parsed: {e}"))
    })?;
    let spki = &certificate.tbs_certificate.subject_public_key_info;
    let allowed = algorithm_for_key(&der, spki)?;
    if allowed != env.algorithm {
        return Err(Rejection::InvalidSignature(format!(
            "alg {} does not fit the signing certificate's key (which signs with {})",
            env.algorithm.name(),
            allowed.name()
        )));
    }
    let key = spki.subject_public_key.raw_bytes();
    UnparsedPublicKey::new(verification_algorithm(env.algorithm), key)
        .verify(&env.signed_bytes, &env.signature)
        .map_err(|_| {
            Rejection::InvalidSignature(
                "the signature does not verify with the signing certificate's key".into(),
            )
        })?;
    let payload: Payload = crate::signed_json::parse_signed_json(&env.payload, "Notary payload")?;
    let got = &payload.target_artifact;
    if got.digest != target.digest {
        return Err(Rejection::Content(format!(
            "the signature is for {}, not {}",
            got.digest, target.digest
        )));
    }
    if got.media_type != target.media_type || got.size != target.size {
        return Err(Rejection::Content(format!(
            "the signed descriptor ({}, {} bytes) is not the image's ({}, {} bytes)",
            got.media_type, got.size, target.media_type, target.size
        )));
    }
    Ok(Leaf { der, certificate })
}

/// The algorithm the Notary Project assigns to a key: RSA by size, ECDSA by curve.
fn algorithm_for_key(
    der: &[u8],
    spki: &x509_cert::spki::SubjectPublicKeyInfoOwned,
) -> Result<Algorithm, Rejection> {
    let unsupported = |what: String| {
        Rejection::InvalidSignature(format!("the signing certificate's key is {what}"))
    };
    match spki.algorithm.oid.to_string().as_str() {
        RSA_ENCRYPTION => {
            let bits = rsa_bits(der)?;
            match bits {
                2048 => Ok(Algorithm::Ps256),
                3072 => Ok(Algorithm::Ps384),
                4096 => Ok(Algorithm::Ps512),
                other => Err(unsupported(format!("RSA {other}, not 2048, 3072 or 4096"))),
            }
        }
        EC_PUBLIC_KEY => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.decode_as::<x509_cert::der::asn1::ObjectIdentifier>().ok())
                .map(|o| o.to_string());
            match curve.as_deref() {
                Some(P256) => Ok(Algorithm::Es256),
                Some(P384) => Ok(Algorithm::Es384),
                Some(P521) => Ok(Algorithm::Es512),
                other => Err(unsupported(format!("on curve {other:?}"))),
            }
        }
        other => Err(unsupported(format!("of type {other}"))),
    }
}

/// Modulus size of the RSA key of the certificate `der`.
fn rsa_bits(der: &[u8]) -> Result<usize, Rejection> {
    let certificate = Certificate::from_der(der)
        .map_err(|e| Rejection::Malformed(format!("certificate: {e}")))?;
    let spki = certificate
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| Rejection::Malformed(format!("certificate key: {e}")))?;
    aws_lc_rs::rsa::PublicEncryptingKey::from_der(&spki)
        .map(|k| k.key_size_bits())
        .map_err(|_| Rejection::InvalidSignature("the RSA key cannot be read".into()))
}

fn verification_algorithm(algorithm: Algorithm) -> &'static dyn VerificationAlgorithm {
    match algorithm {
        Algorithm::Ps256 => &signature::RSA_PSS_2048_8192_SHA256,
        Algorithm::Ps384 => &signature::RSA_PSS_2048_8192_SHA384,
        Algorithm::Ps512 => &signature::RSA_PSS_2048_8192_SHA512,
        Algorithm::Es256 => &signature::ECDSA_P256_SHA256_FIXED,
        Algorithm::Es384 => &signature::ECDSA_P384_SHA384_FIXED,
        Algorithm::Es512 => &signature::ECDSA_P521_SHA512_FIXED,
    }
}

/// The chain leads to the trust store of the signature's scheme, for code signing, at the
/// time the signature claims (signing time, or the signing authority's); the signing
/// certificate shows a trusted identity.
fn authenticity(plan: &NotaryPlan, env: &SignedEnvelope, leaf: &Leaf) -> Result<(), Rejection> {
    let wanted = match env.scheme {
        SigningScheme::X509 => TrustStore::Ca,
        SigningScheme::SigningAuthority => TrustStore::SigningAuthority,
    };
    if plan.store != wanted {
        return Err(Rejection::Certificate(format!(
            "the signature's signing scheme needs a {} trust store; the attestor's certs are a {} one",
            store_name(wanted),
            store_name(plan.store)
        )));
    }
    key_usage(&leaf.certificate)?;
    let claimed = env
        .authentic_signing_time
        .or(env.signing_time)
        .unwrap_or_else(Timestamp::now);
    let trusted_leaf = plan
        .certs
        .iter()
        .any(|c| c.as_bytes() == leaf.der.as_slice());
    if !trusted_leaf {
        chain_to(&plan.certs, env, claimed).map_err(|e| {
            Rejection::Certificate(format!(
                "the signing certificate does not chain to the attestor's certs: {e}"
            ))
        })?;
    }
    identity(plan, &leaf.certificate)
}

fn store_name(store: TrustStore) -> &'static str {
    match store {
        TrustStore::Ca => "ca",
        TrustStore::SigningAuthority => "signingAuthority",
    }
}

/// The signing certificate may sign: `keyUsage` present with `digitalSignature`, not a CA.
fn key_usage(certificate: &Certificate) -> Result<(), Rejection> {
    let usage = certificate
        .tbs_certificate
        .get::<x509_cert::ext::pkix::KeyUsage>()
        .map_err(|e| Rejection::Certificate(format!("keyUsage cannot be read: {e}")))?;
    match usage {
        Some((_, usage)) if usage.digital_signature() => Ok(()),
        _ => Err(Rejection::Certificate(
            "the signing certificate's keyUsage lacks digitalSignature".into(),
        )),
    }
}

/// Why the signing certificate does not chain to the trust store; the text follows "does not
/// chain to the attestor's certs: " in the rejection.
#[derive(Debug, thiserror::Error)]
enum ChainError {
    /// The envelope carries no certificate.
    #[error("no certificate")]
    NoCertificate,
    /// rustls-webpki does not read the signing certificate.
    #[error(transparent)]
    Leaf(webpki::Error),
    /// No path to an anchor that is valid at the time, with the usage.
    #[error(transparent)]
    Path(webpki::Error),
}

/// rustls-webpki path building from the signing certificate through the envelope's other
/// certificates to `anchors`, with the code-signing usage (when the certificate names usages).
fn chain_to(
    anchors: &[DerCertificate],
    env: &SignedEnvelope,
    at: Timestamp,
) -> Result<(), ChainError> {
    let anchor_ders: Vec<CertificateDer<'_>> = anchors
        .iter()
        .map(|c| CertificateDer::from(c.as_bytes()))
        .collect();
    let trust: Vec<_> = anchor_ders
        .iter()
        .filter_map(|d| webpki::anchor_from_trusted_cert(d).ok())
        .collect();
    let leaf = env.chain.first().ok_or(ChainError::NoCertificate)?;
    let leaf_der = CertificateDer::from(leaf.as_slice());
    let ee = EndEntityCert::try_from(&leaf_der).map_err(ChainError::Leaf)?;
    let intermediates: Vec<CertificateDer<'_>> = env
        .chain
        .get(1..)
        .unwrap_or_default()
        .iter()
        .map(|c| CertificateDer::from(c.as_slice()))
        .collect();
    let seconds = u64::try_from(at.as_second()).unwrap_or(0);
    ee.verify_for_usage(
        CHAIN_ALGORITHMS,
        &trust,
        &intermediates,
        UnixTime::since_unix_epoch(Duration::from_secs(seconds)),
        KeyUsage::required_if_present(ID_KP_CODE_SIGNING),
        None,
        None,
    )
    .map(|_| ())
    .map_err(ChainError::Path)
}

/// `trustedIdentities`: `*`, or a subject holding every attribute of one entry.
fn identity(plan: &NotaryPlan, certificate: &Certificate) -> Result<(), Rejection> {
    if plan.identities.is_empty() || plan.identities.contains(&TrustedIdentity::Any) {
        return Ok(());
    }
    let subject = certificate.tbs_certificate.subject.to_string();
    let held = parse_dn(&subject).unwrap_or_default();
    let matches = plan.identities.iter().any(|id| match id {
        TrustedIdentity::Any => true,
        TrustedIdentity::Subject(want) => want.iter().all(|(k, v)| held.get(k) == Some(v)),
    });
    if matches {
        Ok(())
    } else {
        Err(Rejection::Identity {
            subject,
            issuer: certificate.tbs_certificate.issuer.to_string(),
        })
    }
}

/// Every certificate of the chain was valid at a time ivory can trust: the timestamp's
/// (verified to `tsaCerts`; required when they are given, as notation requires), the signing
/// authority's, or now.
fn authentic_timestamp(
    plan: &NotaryPlan,
    env: &SignedEnvelope,
    now: Timestamp,
) -> Result<(), Rejection> {
    let at = match env.scheme {
        SigningScheme::SigningAuthority => env.authentic_signing_time.unwrap_or(now),
        SigningScheme::X509 if plan.tsa.is_empty() => now,
        // notation's `verifyTimestamp: afterCertExpiry`: the timestamp is looked at only once
        // a certificate of the chain has expired; until then the chain must be valid now.
        SigningScheme::X509
            if plan.policy.verify_timestamp == Some(VerifyTimestamp::AfterCertExpiry)
                && chain_valid_at(env, now).is_ok() =>
        {
            now
        }
        SigningScheme::X509 => timestamp_time(plan, env)?,
    };
    chain_valid_at(env, at)
}

/// The RFC 3161 countersignature's time, verified by sigstore-tsa against each `tsaCerts`
/// root (signer among the token's certificates, message imprint = hash of the signature), or
/// by [`super::timestamp_rsa`] when the TSA's key is RSA.
fn timestamp_time(plan: &NotaryPlan, env: &SignedEnvelope) -> Result<Timestamp, Rejection> {
    let token = env.timestamp_token.as_ref().ok_or_else(|| {
        Rejection::Tlog("the signature has no timestamp countersignature (tsaCerts are set)".into())
    })?;
    // OpenSSL's TSA repeats its certificate; notation-go reads such a token, and so does ivory.
    let distinct = crate::timestamp_token::without_repeated_certificates(token);
    let token = distinct.as_ref().unwrap_or(token);
    // An RSA TSA's token: read here (sigstore-tsa reads EC TSA keys only).
    match super::timestamp_rsa::verify(token, &env.signature, &plan.tsa) {
        Ok(time) => return Ok(time),
        Err(RsaTokenError::NotRsa) => {}
        Err(why) => {
            return Err(Rejection::Tlog(format!(
                "the timestamp countersignature does not verify to tsaCerts: {why}"
            )));
        }
    }
    let embedded = embedded_certificates(token);
    let signature = SignatureBytes::from_bytes(&env.signature);
    let token = TimestampToken::new(token.clone());
    let mut last = String::from("no TSA certificate in the token");
    for root in &plan.tsa {
        for (i, leaf) in embedded.iter().enumerate() {
            let intermediates = embedded
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, c)| c.clone())
                .collect();
            let authority = TsaAuthority::new(leaf.clone(), intermediates, root.clone(), None);
            match sigstore_verify::tsa::verify_timestamp_for_authority(
                &token, &signature, &authority,
            ) {
                Ok(time) => return Ok(time),
                Err(e) => last = e.to_string(),
            }
        }
    }
    Err(Rejection::Tlog(format!(
        "the timestamp countersignature does not verify to tsaCerts: {last}"
    )))
}

/// The certificates a timestamp token carries (candidates for its signer; trusted only
/// once a chain from them to `tsaCerts` verifies).
fn embedded_certificates(token: &[u8]) -> Vec<DerCertificate> {
    use cms::cert::CertificateChoices;
    use cms::content_info::ContentInfo;
    use cms::signed_data::SignedData;
    let Ok(info) = ContentInfo::from_der(token) else {
        return Vec::new();
    };
    let Ok(signed) = info.content.decode_as::<SignedData>() else {
        return Vec::new();
    };
    signed
        .certificates
        .map(|set| {
            set.0
                .iter()
                .filter_map(|c| match c {
                    CertificateChoices::Certificate(c) => c.to_der().ok(),
                    _ => None,
                })
                .take(super::envelope::MAX_CHAIN)
                .map(DerCertificate::new)
                .collect()
        })
        .unwrap_or_default()
}

/// Every certificate of the envelope's chain is within its validity at `at`.
fn chain_valid_at(env: &SignedEnvelope, at: Timestamp) -> Result<(), Rejection> {
    for der in &env.chain {
        let certificate = Certificate::from_der(der)
            .map_err(|e| Rejection::Malformed(format!("certificate: {e}")))?;
        let validity = &certificate.tbs_certificate.validity;
        let seconds = |t: x509_cert::time::Time| {
            i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
        };
        let (from, until) = (seconds(validity.not_before), seconds(validity.not_after));
        let when = at.as_second();
        if when < from || when > until {
            return Err(Rejection::Certificate(format!(
                "certificate {} is not valid at {at} (valid {} to {})",
                certificate.tbs_certificate.subject,
                Timestamp::from_second(from).map_or_else(|_| from.to_string(), |t| t.to_string()),
                Timestamp::from_second(until).map_or_else(|_| until.to_string(), |t| t.to_string()),
            )));
        }
    }
    Ok(())
}

/// The signature's own expiry has not passed.
fn expiry(env: &SignedEnvelope, now: Timestamp) -> Result<(), Rejection> {
    match env.expiry {
        Some(expiry) if expiry < now => Err(Rejection::Content(format!(
            "the signature expired at {expiry}"
        ))),
        _ => Ok(()),
    }
}

/// Who signed: the signing certificate's key and subject, its issuer.
fn signer(certificate: &Certificate) -> Signer {
    let key = certificate
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .ok()
        .map(|der| format!("sha256:{}", hex::encode(Sha256::digest(der))));
    Signer {
        key,
        subject: Some(certificate.tbs_certificate.subject.to_string()),
        issuer: Some(certificate.tbs_certificate.issuer.to_string()),
        log_index: None,
    }
}
