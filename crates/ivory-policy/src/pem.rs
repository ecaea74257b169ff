//! PEM armour for key and certificate material: the checks policy validation makes, and the
//! blocks the verifier reads its certificates from, so that what validation accepts is what
//! verification parses. Only the armour and the base64 body are read here; the crypto is parsed
//! by the verifier. The parsing itself is rustls-pki-types', the same parser the registry client
//! uses for CA bundles.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustls_pki_types::pem::{self, PemObject as _};

pub use rustls_pki_types::pem::SectionKind;

const NO_BLOCK: &str = "no PEM block found (expected -----BEGIN ...-----)";

/// Why PEM text is refused; in a policy, the text follows `not valid PEM: ` in the field error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PemError {
    /// No BEGIN line at all.
    #[error("{NO_BLOCK}")]
    NoBlock,
    /// A block with nothing between its BEGIN and END lines.
    #[error("PEM block \"{0}\" is empty")]
    Empty(&'static str),
    /// A block that does not parse (missing END line, malformed BEGIN line, bad base64).
    #[error("{0}")]
    Malformed(String),
}

/// The PEM blocks of `text`, in order, each as its kind and DER body; at least one.
/// Text outside the blocks (e.g. `openssl x509 -text` output) is tolerated, as Go's `pem.Decode`
/// does; blocks of a kind no trust field can hold (not a key, certificate or CRL) are skipped.
pub fn sections(text: &str) -> Result<Vec<(SectionKind, Vec<u8>)>, PemError> {
    let mut sections = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(text.as_bytes()) {
        let (kind, der) = section.map_err(describe)?;
        if der.is_empty() {
            return Err(PemError::Empty(label(kind)));
        }
        sections.push((kind, der));
    }
    if sections.is_empty() {
        return Err(PemError::NoBlock);
    }
    Ok(sections)
}

/// Like [`sections`], but also accepts base64-wrapped PEM (Kyverno accepts that for
/// certificates).
pub fn sections_maybe_base64(text: &str) -> Result<Vec<(SectionKind, Vec<u8>)>, PemError> {
    match sections(text) {
        Ok(found) => Ok(found),
        Err(err) => {
            let compact: String = text.split_whitespace().collect();
            let decoded = STANDARD
                .decode(compact.as_bytes())
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok());
            match decoded {
                Some(inner) => sections(&inner),
                None => Err(err),
            }
        }
    }
}

/// Checks that `text` holds one or more well-formed PEM blocks (see [`sections`]) and returns
/// their kinds.
pub(crate) fn check(text: &str) -> Result<Vec<SectionKind>, PemError> {
    sections(text).map(kinds)
}

/// Like [`check`], but also accepts base64-wrapped PEM (see [`sections_maybe_base64`]).
pub(crate) fn check_maybe_base64(text: &str) -> Result<Vec<SectionKind>, PemError> {
    sections_maybe_base64(text).map(kinds)
}

fn kinds(sections: Vec<(SectionKind, Vec<u8>)>) -> Vec<SectionKind> {
    sections.into_iter().map(|(kind, _)| kind).collect()
}

fn describe(err: pem::Error) -> PemError {
    PemError::Malformed(match err {
        pem::Error::MissingSectionEnd { end_marker } => format!(
            "PEM block \"{}\" has no END line",
            String::from_utf8_lossy(&end_marker)
        ),
        pem::Error::IllegalSectionStart { line } => format!(
            "malformed BEGIN line \"{}\"",
            String::from_utf8_lossy(&line).trim()
        ),
        pem::Error::Base64Decode(e) => format!("PEM block is not valid base64: {e}"),
        other => other.to_string(),
    })
}

/// The label a block of this kind is written with (`CERTIFICATE`, `PUBLIC KEY`, `X509 CRL`), or
/// `key` for the private-key kinds.
pub fn label(kind: SectionKind) -> &'static str {
    match kind {
        SectionKind::Certificate => "CERTIFICATE",
        SectionKind::PublicKey => "PUBLIC KEY",
        SectionKind::Crl => "X509 CRL",
        _ => "key",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE6QsNef3SKYhJVYSVj+ZfbPwJd0pv\nDLYNHXITZkhIzfE+apcxDjCCkDPcJ3A3zvhPATYOIsCxYPch7Q2JdJLsDQ==\n-----END PUBLIC KEY-----\n";

    #[test]
    fn accepts_blocks_and_chains() {
        assert_eq!(check(KEY).unwrap(), vec![SectionKind::PublicKey]);
        let chain = format!("subject=CN=x\n{KEY}\n{KEY}");
        assert_eq!(check(&chain).unwrap().len(), 2);
    }

    #[test]
    fn accepts_base64_wrapped_pem() {
        let wrapped = STANDARD.encode(KEY);
        assert!(check(&wrapped).is_err());
        assert_eq!(
            check_maybe_base64(&wrapped).unwrap(),
            vec![SectionKind::PublicKey]
        );
    }

    #[test]
    fn rejects_broken_armour() {
        assert_eq!(check("hello").unwrap_err().to_string(), NO_BLOCK);
        assert_eq!(
            check("-----BEGIN PUBLIC KEY-----\nAAAA\n")
                .unwrap_err()
                .to_string(),
            "PEM block \"PUBLIC KEY\" has no END line"
        );
        // An END line of another kind does not close the block.
        assert_eq!(
            check("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END CERTIFICATE-----")
                .unwrap_err()
                .to_string(),
            "PEM block \"PUBLIC KEY\" has no END line"
        );
        assert!(
            check("-----BEGIN PUBLIC KEY-----\n!!!!\n-----END PUBLIC KEY-----")
                .unwrap_err()
                .to_string()
                .contains("not valid base64")
        );
        assert_eq!(
            check("-----BEGIN PUBLIC KEY-----\n-----END PUBLIC KEY-----").unwrap_err(),
            PemError::Empty("PUBLIC KEY")
        );
    }
}
