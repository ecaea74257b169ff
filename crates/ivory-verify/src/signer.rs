//! Who vouched for a verified signature ([`Signer`]), taken from the key or certificate that
//! verified it and the log entry that was checked with it: the audit trail of an admission.

use ivory_engine::verifier::Signer;
use sha2::{Digest as _, Sha256};
use sigstore_verify::crypto::CertificateInfo;

use crate::keys::PublicKey;

/// A signature verified with `key` (a key or certificate attestor, or a legacy entry's key).
pub(crate) fn of_key(key: &PublicKey, log_index: Option<u64>) -> Signer {
    Signer {
        key: Some(format!(
            "sha256:{}",
            hex::encode(Sha256::digest(key.der.as_bytes()))
        )),
        log_index,
        ..Signer::default()
    }
}

/// A keyless signature whose certificate `info` was verified.
pub(crate) fn of_certificate(info: &CertificateInfo, log_index: Option<u64>) -> Signer {
    Signer {
        subject: info.identity.as_ref().map(|i| i.as_str().to_owned()),
        issuer: info.issuer.clone(),
        log_index,
        ..Signer::default()
    }
}
