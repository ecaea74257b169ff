//! Trust material from policy text: PEM public keys, certificates and chains, and the
//! `hashAlgorithm` names cosign accepts. Parsing only; every check is done by sigstore-verify.

use crate::rejection::Rejection;
use ivory_policy::pem::{self, PemError, SectionKind};
use sigstore_verify::crypto::{KeyAlgorithm, SigningScheme};
use sigstore_verify::types::{DerCertificate, DerPublicKey, HashAlgorithm};

/// A public key from `key.data`, with the schemes its signatures may use (tried in order).
#[derive(Clone, Debug)]
pub(crate) struct PublicKey {
    pub(crate) der: DerPublicKey,
    pub(crate) schemes: Vec<SigningScheme>,
}

impl PublicKey {
    /// A key whose signatures use the key type's default scheme only (certificates).
    pub(crate) fn with_default_scheme(der: DerPublicKey, algorithm: KeyAlgorithm) -> Self {
        Self {
            der,
            schemes: vec![algorithm.default_signing_scheme()],
        }
    }
}

/// Parses a PEM `PUBLIC KEY` (P-256, P-384, RSA, Ed25519). `hash_algorithm` is Kyverno's
/// `key.hashAlgorithm`: `sha256`, `sha384`, `sha512`; `sha224` has no implementation in the
/// crypto provider and is rejected by name.
///
/// Unset, the key's own default scheme and SHA-256 are both accepted: cosign before v2.6 signed
/// every key type with SHA-256, cosign v2.6+ signs with the key type's default (SHA-384 for
/// P-384), and images signed by both generations are in use. Set, only that hash verifies.
pub(crate) fn parse_public_key(
    pem: &str,
    hash_algorithm: Option<&str>,
) -> Result<PublicKey, Rejection> {
    let der = DerPublicKey::from_pem(pem.trim())
        .map_err(|e| Rejection::Attestor(format!("key.data is not a PEM public key: {e}")))?;
    let algorithm = KeyAlgorithm::from_spki(&der)
        .map_err(|e| Rejection::Attestor(format!("key.data has an unsupported key type: {e}")))?;
    let schemes = match hash_algorithm.filter(|h| !h.is_empty()) {
        None => {
            let default = algorithm.default_signing_scheme();
            let mut schemes = vec![default];
            if let Ok(sha256) = algorithm.resolve_signing_scheme(HashAlgorithm::Sha2256)
                && sha256 != default
            {
                schemes.push(sha256);
            }
            schemes
        }
        Some(name) => vec![
            algorithm
                .resolve_signing_scheme(parse_hash(Some(name))?)
                .map_err(|e| {
                    Rejection::Attestor(format!("key.hashAlgorithm does not fit the key: {e}"))
                })?,
        ],
    };
    Ok(PublicKey { der, schemes })
}

fn parse_hash(name: Option<&str>) -> Result<HashAlgorithm, Rejection> {
    match name.map(str::to_ascii_lowercase).as_deref() {
        None | Some("sha256") => Ok(HashAlgorithm::Sha2256),
        Some("sha384") => Ok(HashAlgorithm::Sha2384),
        Some("sha512") => Ok(HashAlgorithm::Sha2512),
        Some(other) => Err(Rejection::Attestor(format!(
            "key.hashAlgorithm {other} is not supported"
        ))),
    }
}

/// Parses every `CERTIFICATE` block of a PEM bundle. Kyverno also accepts the PEM wrapped
/// in base64, so that form is unwrapped first. The blocks are read by ivory-policy's PEM
/// parser, the one policy validation checks these fields with.
pub(crate) fn parse_certificates(
    text: &str,
    field: &str,
) -> Result<Vec<DerCertificate>, Rejection> {
    let sections = pem::sections_maybe_base64(text).map_err(|e| match e {
        PemError::NoBlock => Rejection::Attestor(format!("{field} holds no PEM certificate")),
        e => Rejection::Attestor(format!("{field} is not a PEM certificate: {e}")),
    })?;
    sections
        .into_iter()
        .map(|(kind, der)| match kind {
            SectionKind::Certificate => Ok(DerCertificate::new(der)),
            other => Err(Rejection::Attestor(format!(
                "{field} is not a PEM certificate: expected CERTIFICATE PEM block, got {}",
                pem::label(other)
            ))),
        })
        .collect()
}

/// Public key of a certificate, for the `certificate` attestor.
pub(crate) fn certificate_key(cert: &DerCertificate) -> Result<PublicKey, Rejection> {
    let info = sigstore_verify::crypto::parse_certificate_info(cert)
        .map_err(|e| Rejection::Attestor(format!("certificate.cert cannot be parsed: {e}")))?;
    Ok(PublicKey::with_default_scheme(
        info.public_key,
        info.key_algorithm,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    const P256: &str = include_str!("../../../fixtures/captured/connaisseur/cosign/keys/alice.key");

    const P384: &str = include_str!("../../../fixtures/keys/p384.pub");
    const RSA: &str = include_str!("../../../fixtures/keys/rsa2048.pub");

    #[test]
    fn parses_p256_with_default_and_sha384() {
        let k = parse_public_key(P256, None).unwrap();
        assert_eq!(k.schemes, [SigningScheme::EcdsaP256Sha256]);
        let k = parse_public_key(P256, Some("sha384")).unwrap();
        assert_eq!(k.schemes, [SigningScheme::EcdsaP256Sha384]);
    }

    #[test]
    fn unset_hash_accepts_both_cosign_generations_and_set_hash_only_itself() {
        let k = parse_public_key(P384, None).unwrap();
        assert_eq!(
            k.schemes,
            [
                SigningScheme::EcdsaP384Sha384,
                SigningScheme::EcdsaP384Sha256
            ]
        );
        let k = parse_public_key(P384, Some("sha256")).unwrap();
        assert_eq!(k.schemes, [SigningScheme::EcdsaP384Sha256]);
        let k = parse_public_key(P384, Some("sha384")).unwrap();
        assert_eq!(k.schemes, [SigningScheme::EcdsaP384Sha384]);
        // RSA: both cosign generations sign with SHA-256, the key type's default.
        let k = parse_public_key(RSA, None).unwrap();
        assert_eq!(k.schemes, [SigningScheme::RsaPkcs1Sha256]);
    }

    #[test]
    fn rejects_unknown_hash_and_garbage() {
        assert!(
            parse_public_key(P256, Some("sha224"))
                .unwrap_err()
                .to_string()
                .contains("sha224")
        );
        assert!(
            parse_public_key("not a key", None)
                .unwrap_err()
                .to_string()
                .contains("key.data")
        );
    }

    #[test]
    fn splits_pem_bundles_and_base64_wrapping() {
        let chain = include_str!(
            "../../../fixtures/captured/ratify/legacy-keyless-wabbitnetworks-cosign-image/chain.pem"
        );
        assert_eq!(parse_certificates(chain, "chain").unwrap().len(), 2);
        let wrapped = base64::engine::general_purpose::STANDARD.encode(chain);
        assert_eq!(parse_certificates(&wrapped, "chain").unwrap().len(), 2);
        assert!(parse_certificates("nothing", "certificate.cert").is_err());
    }
}
