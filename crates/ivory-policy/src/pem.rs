//! PEM armour checks for key and certificate material written into policies. Only the armour and
//! the base64 body are checked here; the crypto is parsed by the verifier. The parsing itself is
//! rustls-pki-types', the same parser the registry client uses for CA bundles.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rustls_pki_types::pem::{self, PemObject as _, SectionKind};

const NO_BLOCK: &str = "no PEM block found (expected -----BEGIN ...-----)";

/// Why a policy's PEM text is refused; the text follows `not valid PEM: ` in the field error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PemError {
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

/// Checks that `text` holds one or more well-formed PEM blocks and returns their kinds.
/// Text outside the blocks (e.g. `openssl x509 -text` output) is tolerated, as Go's `pem.Decode`
/// does; blocks of a kind no trust field can hold (not a key, certificate or CRL) are skipped.
pub(crate) fn check(text: &str) -> Result<Vec<SectionKind>, PemError> {
    let mut kinds = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(text.as_bytes()) {
        let (kind, der) = section.map_err(describe)?;
        if der.is_empty() {
            return Err(PemError::Empty(label(kind)));
        }
        kinds.push(kind);
    }
    if kinds.is_empty() {
        return Err(PemError::NoBlock);
    }
    Ok(kinds)
}

/// Like [`check`], but also accepts base64-wrapped PEM (Kyverno accepts that for certificates).
pub(crate) fn check_maybe_base64(text: &str) -> Result<Vec<SectionKind>, PemError> {
    match check(text) {
        Ok(kinds) => Ok(kinds),
        Err(err) => {
            let compact: String = text.split_whitespace().collect();
            let decoded = STANDARD
                .decode(compact.as_bytes())
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok());
            match decoded {
                Some(inner) => check(&inner),
                None => Err(err),
            }
        }
    }
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

fn label(kind: SectionKind) -> &'static str {
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
