//! Content digests from registries: strict form, and checked against the bytes they name.

use sha2::{Digest as _, Sha256, Sha512};

/// Supported algorithms and their lower-case hex length.
const ALGORITHMS: [(&str, usize); 2] = [("sha256", 64), ("sha512", 128)];

/// Why a digest string was refused. The digest itself is not repeated: it came from a
/// registry and may be arbitrary text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigestProblem {
    /// Not `algorithm:hex`, or an algorithm other than sha256/sha512.
    UnknownAlgorithm,
    /// The hex part has the wrong length for its algorithm.
    WrongLength,
    /// The hex part has characters other than `0-9a-f`.
    NotLowerHex,
}

impl std::fmt::Display for DigestProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DigestProblem::UnknownAlgorithm => "algorithm is not sha256 or sha512",
            DigestProblem::WrongLength => "hex part has the wrong length for its algorithm",
            DigestProblem::NotLowerHex => "hex part is not lower-case hexadecimal",
        })
    }
}

/// Checks `sha256:` + 64 or `sha512:` + 128 lower-case hex characters.
pub(crate) fn validate(digest: &str) -> Result<(), DigestProblem> {
    let (algorithm, hex) = digest
        .split_once(':')
        .ok_or(DigestProblem::UnknownAlgorithm)?;
    let (_, len) = ALGORITHMS
        .iter()
        .find(|(a, _)| *a == algorithm)
        .ok_or(DigestProblem::UnknownAlgorithm)?;
    if !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(DigestProblem::NotLowerHex);
    }
    if hex.len() != *len {
        return Err(DigestProblem::WrongLength);
    }
    Ok(())
}

/// The digest of `bytes` with the algorithm of `like` (a [`validate`]d digest).
pub(crate) fn of(like: &str, bytes: &[u8]) -> String {
    if like.starts_with("sha512:") {
        format!("sha512:{}", hex::encode(Sha512::digest(bytes)))
    } else {
        sha256(bytes)
    }
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_strict_sha256_and_sha512_pass() {
        let ok256 = format!("sha256:{}", "a1".repeat(32));
        let ok512 = format!("sha512:{}", "0f".repeat(64));
        assert_eq!(validate(&ok256), Ok(()));
        assert_eq!(validate(&ok512), Ok(()));
        for (bad, why) in [
            (
                format!("sha256:{}", "A".repeat(64)),
                DigestProblem::NotLowerHex,
            ),
            (
                format!("sha256:{}", "a".repeat(63)),
                DigestProblem::WrongLength,
            ),
            (
                format!("sha256:{}", "a".repeat(128)),
                DigestProblem::WrongLength,
            ),
            (
                format!("sha512:{}", "a".repeat(64)),
                DigestProblem::WrongLength,
            ),
            (
                format!("md5:{}", "a".repeat(32)),
                DigestProblem::UnknownAlgorithm,
            ),
            ("a".repeat(64), DigestProblem::UnknownAlgorithm),
            (
                format!("sha256:{} ", "a".repeat(64)),
                DigestProblem::NotLowerHex,
            ),
            (
                format!("sha256:{}g", "a".repeat(63)),
                DigestProblem::NotLowerHex,
            ),
            ("sha256:".to_string(), DigestProblem::WrongLength),
        ] {
            assert_eq!(validate(&bad), Err(why), "{bad}");
        }
    }

    #[test]
    fn hashes_with_the_named_algorithm() {
        let d = of(&format!("sha512:{}", "0".repeat(128)), b"x");
        assert!(d.starts_with("sha512:") && d.len() == 7 + 128, "{d}");
        assert_eq!(validate(&d), Ok(()));
        assert_eq!(
            of(&format!("sha256:{}", "0".repeat(64)), b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
