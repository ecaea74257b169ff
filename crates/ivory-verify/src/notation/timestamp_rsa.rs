//! RFC 3161 timestamp tokens signed by an RSA timestamp authority, which sigstore-tsa (used for
//! every other token) does not read. The same checks, on the same crates: `cms` and `x509-cert`
//! for the structures (DER, strict, once `timestamp_token` has dropped repeated certificates),
//! aws-lc-rs for the RSA PKCS#1 v1.5 signature, rustls-webpki
//! for the TSA chain to a `tsaCerts` root with the timestamping usage, at the token's time.
//!
//! Checked: a SignedData whose content is a TSTInfo; its message imprint is the hash of the
//! Notation signature; one signer, among the token's certificates (issuer and serial), whose
//! signed attributes name the TSTInfo content type and hold its digest; the signature over
//! those attributes with the signer's RSA key; the signer's chain. Not read: the ESS
//! signing-certificate attribute (the signer is the certificate whose key verified and whose
//! chain leads to `tsaCerts` with the timestamping usage).

use std::time::Duration;

use aws_lc_rs::signature::{self, UnparsedPublicKey};
use cms::cert::CertificateChoices;
use cms::content_info::ContentInfo;
use cms::signed_data::{SignedData, SignerIdentifier};
use jiff::Timestamp;
use rustls_pki_types::{CertificateDer, UnixTime};
use sha2::{Digest as _, Sha256, Sha384, Sha512};
use sigstore_verify::types::DerCertificate;
use webpki::{EndEntityCert, KeyUsage};
use x509_cert::Certificate;
use x509_cert::der::asn1::{AnyRef, GeneralizedTime, ObjectIdentifier, OctetString, SetOfVec};
use x509_cert::der::{Decode as _, Encode as _, Reader as _, SliceReader};
use x509_cert::spki::AlgorithmIdentifierOwned;

use super::algorithms::CHAIN_ALGORITHMS;

const ID_SIGNED_DATA: &str = "1.2.840.113549.1.7.2";
const ID_CT_TST_INFO: &str = "1.2.840.113549.1.9.16.1.4";
const ID_CONTENT_TYPE: &str = "1.2.840.113549.1.9.3";
const ID_MESSAGE_DIGEST: &str = "1.2.840.113549.1.9.4";
const RSA_ENCRYPTION: &str = "1.2.840.113549.1.1.1";
const SHA256_WITH_RSA: &str = "1.2.840.113549.1.1.11";
const SHA384_WITH_RSA: &str = "1.2.840.113549.1.1.12";
const SHA512_WITH_RSA: &str = "1.2.840.113549.1.1.13";
const SHA256: &str = "2.16.840.1.101.3.4.2.1";
const SHA384: &str = "2.16.840.1.101.3.4.2.2";
const SHA512: &str = "2.16.840.1.101.3.4.2.3";
/// `id-kp-timeStamping` (1.3.6.1.5.5.7.3.8), DER value bytes.
const ID_KP_TIME_STAMPING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x08];

/// Why an RSA token did not verify; but for [`RsaTokenError::NotRsa`], the text follows "does
/// not verify to tsaCerts: " in the rejection.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RsaTokenError {
    /// The token's signer has no RSA key: not a token for this verifier.
    #[error("the token's signer has no RSA key")]
    NotRsa,
    /// It is an RSA token and it does not verify: why.
    #[error("{0}")]
    Invalid(String),
    /// Its TSTInfo cannot be read.
    #[error(transparent)]
    TstInfo(#[from] TstInfoError),
    /// Its signer does not chain to `tsaCerts`.
    #[error(transparent)]
    Chain(#[from] TsaChainError),
}

/// Why a TSTInfo's imprint and time cannot be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TstInfoError {
    /// Not the DER of a TSTInfo.
    #[error("TSTInfo: {0}")]
    Der(#[from] x509_cert::der::Error),
    /// A `genTime` outside the times ivory represents.
    #[error("TSTInfo genTime: {0}")]
    GenTime(jiff::Error),
}

/// Why the token's signer does not chain to `tsaCerts`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TsaChainError {
    /// The signer's certificate does not encode back to DER.
    #[error(transparent)]
    Encoding(x509_cert::der::Error),
    /// rustls-webpki does not read the signer's certificate.
    #[error(transparent)]
    Leaf(webpki::Error),
    /// No path to a `tsaCerts` root valid at the token's time with the timestamping usage.
    #[error("the TSA certificate does not chain to tsaCerts: {0}")]
    NoPath(webpki::Error),
}

/// The time of `token` (a TimeStampToken, DER) over `signature`, if it verifies to one of
/// `roots`.
pub(crate) fn verify(
    token: &[u8],
    signature: &[u8],
    roots: &[DerCertificate],
) -> Result<Timestamp, RsaTokenError> {
    let invalid = |why: String| RsaTokenError::Invalid(why);
    let info = ContentInfo::from_der(token).map_err(|e| invalid(format!("token: {e}")))?;
    if info.content_type.to_string() != ID_SIGNED_DATA {
        return Err(invalid("the token is not CMS SignedData".into()));
    }
    let signed: SignedData = info
        .content
        .decode_as()
        .map_err(|e| invalid(format!("SignedData: {e}")))?;
    let certificates = embedded(&signed);
    let [signer] = signed.signer_infos.0.as_slice() else {
        return Err(invalid("the token has not exactly one signer".into()));
    };
    let SignerIdentifier::IssuerAndSerialNumber(sid) = &signer.sid else {
        return Err(invalid(
            "the signer is not named by issuer and serial".into(),
        ));
    };
    let Some(signer_cert) = certificates.iter().find(|c| {
        c.tbs_certificate.issuer == sid.issuer
            && c.tbs_certificate.serial_number == sid.serial_number
    }) else {
        return Err(invalid(
            "the signer's certificate is not in the token".into(),
        ));
    };
    let spki = &signer_cert.tbs_certificate.subject_public_key_info;
    if spki.algorithm.oid.to_string() != RSA_ENCRYPTION {
        return Err(RsaTokenError::NotRsa);
    }
    if signed.encap_content_info.econtent_type.to_string() != ID_CT_TST_INFO {
        return Err(invalid("the token's content is not a TSTInfo".into()));
    }
    let tst_info = signed
        .encap_content_info
        .econtent
        .as_ref()
        .ok_or_else(|| invalid("the token holds no TSTInfo".into()))?
        .value();
    let (imprint_algorithm, imprint, time) = parse_tst_info(tst_info)?;
    if digest(&imprint_algorithm, signature).as_deref() != Some(imprint.as_slice()) {
        return Err(invalid(
            "the message imprint is not the hash of the signature".into(),
        ));
    }
    let digest_oid = signer.digest_alg.oid.to_string();
    let attributes = signer
        .signed_attrs
        .as_ref()
        .ok_or_else(|| invalid("the signer has no signed attributes".into()))?;
    let attribute = |oid: &str| {
        attributes
            .iter()
            .find(|a| a.oid.to_string() == oid)
            .and_then(|a| a.values.get(0))
    };
    let content_type = attribute(ID_CONTENT_TYPE)
        .and_then(|v| v.decode_as::<ObjectIdentifier>().ok())
        .map(|o| o.to_string());
    if content_type.as_deref() != Some(ID_CT_TST_INFO) {
        return Err(invalid("the signed content type is not TSTInfo".into()));
    }
    let message_digest = attribute(ID_MESSAGE_DIGEST)
        .and_then(|v| v.decode_as::<OctetString>().ok())
        .ok_or_else(|| invalid("the signed attributes hold no message digest".into()))?;
    if digest(&digest_oid, tst_info).as_deref() != Some(message_digest.as_bytes()) {
        return Err(invalid(
            "the signed message digest is not the TSTInfo's".into(),
        ));
    }
    // Signed as a SET OF (RFC 5652 §5.4), not with the [0] tag they are stored under.
    let signed_bytes = SetOfVec::try_from(attributes.iter().cloned().collect::<Vec<_>>())
        .and_then(|set| set.to_der())
        .map_err(|e| invalid(format!("signed attributes: {e}")))?;
    let algorithm = rsa_algorithm(&signer.signature_algorithm, &digest_oid).ok_or_else(|| {
        invalid(format!(
            "the signature algorithm {} is not supported",
            signer.signature_algorithm.oid
        ))
    })?;
    UnparsedPublicKey::new(algorithm, spki.subject_public_key.raw_bytes())
        .verify(&signed_bytes, signer.signature.as_bytes())
        .map_err(|_| {
            invalid("the token's signature does not verify with its signer's key".into())
        })?;
    chain(signer_cert, &certificates, roots, time)?;
    Ok(time)
}

/// The certificates the token carries.
fn embedded(signed: &SignedData) -> Vec<Certificate> {
    signed
        .certificates
        .as_ref()
        .map(|set| {
            set.0
                .iter()
                .filter_map(|c| match c {
                    CertificateChoices::Certificate(c) => Some(c.clone()),
                    _ => None,
                })
                .take(super::envelope::MAX_CHAIN)
                .collect()
        })
        .unwrap_or_default()
}

/// `messageImprint` (hash algorithm, hash) and `genTime` of a TSTInfo.
fn parse_tst_info(der: &[u8]) -> Result<(String, Vec<u8>, Timestamp), TstInfoError> {
    let mut reader = SliceReader::new(der)?;
    let (algorithm, imprint, time) = reader.sequence(|r| {
        let _version: AnyRef<'_> = r.decode()?;
        let _policy: ObjectIdentifier = r.decode()?;
        let (algorithm, imprint) = r.sequence(|m| {
            let algorithm: AlgorithmIdentifierOwned = m.decode()?;
            let imprint: OctetString = m.decode()?;
            Ok((algorithm, imprint))
        })?;
        let _serial: AnyRef<'_> = r.decode()?;
        let time: GeneralizedTime = r.decode()?;
        // accuracy, ordering, nonce, tsa, extensions: not needed.
        let rest = r.remaining_len();
        r.read_slice(rest)?;
        Ok((algorithm, imprint, time))
    })?;
    let seconds = i64::try_from(time.to_unix_duration().as_secs()).unwrap_or(i64::MAX);
    let time = Timestamp::from_second(seconds).map_err(TstInfoError::GenTime)?;
    Ok((algorithm.oid.to_string(), imprint.as_bytes().to_vec(), time))
}

fn digest(oid: &str, data: &[u8]) -> Option<Vec<u8>> {
    Some(match oid {
        SHA256 => Sha256::digest(data).to_vec(),
        SHA384 => Sha384::digest(data).to_vec(),
        SHA512 => Sha512::digest(data).to_vec(),
        _ => return None,
    })
}

/// RSA PKCS#1 v1.5 with the digest the signer names (`rsaEncryption`) or the one its
/// signature algorithm names (which must agree).
fn rsa_algorithm(
    algorithm: &AlgorithmIdentifierOwned,
    digest_oid: &str,
) -> Option<&'static signature::RsaParameters> {
    let named = match algorithm.oid.to_string().as_str() {
        RSA_ENCRYPTION => digest_oid.to_owned(),
        SHA256_WITH_RSA => SHA256.to_owned(),
        SHA384_WITH_RSA => SHA384.to_owned(),
        SHA512_WITH_RSA => SHA512.to_owned(),
        _ => return None,
    };
    if named != digest_oid {
        return None;
    }
    Some(match named.as_str() {
        SHA256 => &signature::RSA_PKCS1_2048_8192_SHA256,
        SHA384 => &signature::RSA_PKCS1_2048_8192_SHA384,
        SHA512 => &signature::RSA_PKCS1_2048_8192_SHA512,
        _ => return None,
    })
}

/// The signer's chain, through the token's other certificates, to one of `roots`, with the
/// timestamping usage, at `at`.
fn chain(
    signer: &Certificate,
    certificates: &[Certificate],
    roots: &[DerCertificate],
    at: Timestamp,
) -> Result<(), TsaChainError> {
    let signer_der = signer.to_der().map_err(TsaChainError::Encoding)?;
    let others: Vec<Vec<u8>> = certificates
        .iter()
        .filter(|c| *c != signer)
        .filter_map(|c| c.to_der().ok())
        .collect();
    let root_ders: Vec<CertificateDer<'_>> = roots
        .iter()
        .map(|r| CertificateDer::from(r.as_bytes()))
        .collect();
    let anchors: Vec<_> = root_ders
        .iter()
        .filter_map(|d| webpki::anchor_from_trusted_cert(d).ok())
        .collect();
    let intermediates: Vec<CertificateDer<'_>> = others
        .iter()
        .map(|d| CertificateDer::from(d.as_slice()))
        .collect();
    let leaf = CertificateDer::from(signer_der.as_slice());
    let ee = EndEntityCert::try_from(&leaf).map_err(TsaChainError::Leaf)?;
    let seconds = u64::try_from(at.as_second()).unwrap_or(0);
    ee.verify_for_usage(
        CHAIN_ALGORITHMS,
        &anchors,
        &intermediates,
        UnixTime::since_unix_epoch(Duration::from_secs(seconds)),
        KeyUsage::required(ID_KP_TIME_STAMPING),
        None,
        None,
    )
    .map(|_| ())
    .map_err(TsaChainError::NoPath)
}
