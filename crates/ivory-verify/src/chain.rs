//! Certificate paths, built by rustls-webpki with the code-signing EKU:
//! * `certificate.certChain`: the attestor's certificate must chain to the last certificate of
//!   the chain (the root), as cosign's `ValidateAndUnpackCertWithChain` requires;
//! * keyless signatures that carry neither a log entry nor a timestamp (`insecureIgnoreTlog`):
//!   the signing certificate must chain to the trust root's certificate authorities *now*, as
//!   cosign checks them (so an expired or not-yet-valid certificate fails).

use crate::rejection::Rejection;
use rustls_pki_types::{CertificateDer, UnixTime};
use sigstore_verify::crypto::WEBPKI_VERIFICATION_ALGS;
use sigstore_verify::types::DerCertificate;
use webpki::{EndEntityCert, KeyUsage};

/// cosign refuses longer chains (CVE-2026-32280 guard).
const MAX_CHAIN: usize = 11;
/// `id-kp-codeSigning` (1.3.6.1.5.5.7.3.3), DER value bytes.
const ID_KP_CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];

/// Checks `leaf` against `chain` (intermediates first, root last) at the leaf's `notBefore`,
/// which is when a short-lived signing certificate was used.
pub(crate) fn verify_chain(
    leaf: &DerCertificate,
    chain: &[DerCertificate],
) -> Result<(), Rejection> {
    let Some((root, intermediates)) = chain.split_last() else {
        return Err(Rejection::Certificate(
            "certificate.certChain holds no certificate".into(),
        ));
    };
    if chain.len() > MAX_CHAIN {
        return Err(Rejection::Certificate(format!(
            "certificate.certChain has more than {MAX_CHAIN} certificates"
        )));
    }
    let root_der = CertificateDer::from(root.as_bytes());
    let anchor = webpki::anchor_from_trusted_cert(&root_der).map_err(|e| {
        Rejection::Certificate(format!("certificate.certChain root cannot be used: {e}"))
    })?;
    let intermediates: Vec<CertificateDer<'_>> = intermediates
        .iter()
        .map(|c| CertificateDer::from(c.as_bytes()))
        .collect();
    let leaf_der = CertificateDer::from(leaf.as_bytes());
    let ee = EndEntityCert::try_from(&leaf_der)
        .map_err(|e| Rejection::Certificate(format!("certificate.cert cannot be parsed: {e}")))?;
    let info = sigstore_verify::crypto::parse_certificate_info(leaf)
        .map_err(|e| Rejection::Certificate(format!("certificate.cert cannot be parsed: {e}")))?;
    let at = u64::try_from(info.not_before.as_second())
        .unwrap_or(0)
        .saturating_add(1);
    ee.verify_for_usage(
        WEBPKI_VERIFICATION_ALGS,
        &[anchor],
        &intermediates,
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(at)),
        KeyUsage::required(ID_KP_CODE_SIGNING),
        None,
        None,
    )
    .map(|_| ())
    .map_err(|e| {
        Rejection::Certificate(format!(
            "certificate.cert does not chain to certificate.certChain: {e}"
        ))
    })
}

/// Checks `leaf` (with `intermediates`) against every certificate in `anchors` at `at`
/// (seconds since the epoch).
pub(crate) fn verify_to_anchors(
    leaf: &DerCertificate,
    intermediates: &[DerCertificate],
    anchors: &[DerCertificate],
    at: u64,
) -> Result<(), Rejection> {
    let anchor_ders: Vec<CertificateDer<'_>> = anchors
        .iter()
        .map(|c| CertificateDer::from(c.as_bytes()))
        .collect();
    let anchors: Vec<_> = anchor_ders
        .iter()
        .filter_map(|d| webpki::anchor_from_trusted_cert(d).ok())
        .collect();
    if anchors.is_empty() {
        return Err(Rejection::Certificate(
            "the trust root has no usable certificate authority".into(),
        ));
    }
    let mut chain: Vec<CertificateDer<'_>> = intermediates
        .iter()
        .map(|c| CertificateDer::from(c.as_bytes()))
        .collect();
    chain.extend(anchor_ders.iter().cloned());
    let leaf_der = CertificateDer::from(leaf.as_bytes());
    let ee = EndEntityCert::try_from(&leaf_der).map_err(|e| {
        Rejection::Certificate(format!("signing certificate cannot be parsed: {e}"))
    })?;
    ee.verify_for_usage(
        WEBPKI_VERIFICATION_ALGS,
        &anchors,
        &chain,
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(at)),
        KeyUsage::required(ID_KP_CODE_SIGNING),
        None,
        None,
    )
    .map(|_| ())
    .map_err(|e| Rejection::Certificate(format!("signing certificate is not trusted now: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::parse_certificates;

    #[test]
    fn fulcio_leaf_chains_to_its_chain_and_not_to_another() {
        let leaf =
            parse_certificates(include_str!("../../../fixtures/captured/ratify/legacy-keyless-wabbitnetworks-cosign-image/cert.pem"), "c").unwrap();
        let chain = parse_certificates(include_str!("../../../fixtures/captured/ratify/legacy-keyless-wabbitnetworks-cosign-image/chain.pem"), "c")
            .unwrap();
        verify_chain(&leaf[0], &chain).unwrap();
        // The root alone is not enough: the intermediate is missing.
        let err = verify_chain(&leaf[0], &chain[1..]).unwrap_err().to_string();
        assert!(err.to_string().contains("does not chain"), "{err}");
        assert!(verify_chain(&leaf[0], &[]).is_err());
    }
}
