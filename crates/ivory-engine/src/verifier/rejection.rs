//! Why an image is not verified by an attestor: the typed reason of a definite negative
//! verdict ([`Verification::NotVerified`](super::Verification::NotVerified)). Decided once where
//! the verdict is reached (`ivory-verify`), kept as it is through the caches (the shared one
//! included), and rendered as text only for people: each variant renders exactly the text ivory
//! (and, where it has one, Kyverno) gives.

use serde::{Deserialize, Serialize};

/// `a; b; c (and 2 more)`.
fn joined(reasons: &[Rejection], left_out: usize) -> String {
    let shown: Vec<String> = reasons.iter().map(ToString::to_string).collect();
    let tail = if left_out > 0 {
        format!(" (and {left_out} more)")
    } else {
        String::new()
    };
    format!("{}{tail}", shown.join("; "))
}

/// What was looked for when candidates existed and none verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sought {
    /// Signatures (`no matching signatures`, Kyverno's text).
    Signatures,
    /// Attestations (`no matching attestations`, Kyverno's text).
    Attestations,
}

impl std::fmt::Display for Sought {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Signatures => "no matching signatures",
            Self::Attestations => "no matching attestations",
        })
    }
}

/// A definite "not verified", classified once where it is decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Rejection {
    /// No signature of the wanted kind exists for the image (Kyverno's text).
    #[error("signatures not found")]
    NoSignatures,
    /// No attestation exists for the image (Kyverno's text).
    #[error("no matching attestations: signatures not found")]
    NoAttestations,
    /// Candidates existed and none verified: what was sought and the first distinct reasons.
    #[error("{sought}: {}", joined(reasons, *left_out))]
    NoneMatched {
        /// Signatures or attestations.
        sought: Sought,
        /// Why each candidate failed (distinct reasons, the first few).
        reasons: Vec<Rejection>,
        /// How many more distinct reasons were left out.
        left_out: usize,
    },
    /// Attestations verified, none of the wanted predicate type (cosign's text).
    #[error("required predicate type {wanted} not found, found [{found}]")]
    PredicateNotFound {
        /// The attestation's `intoto.type`.
        wanted: String,
        /// The predicate types that did verify, `, `-joined.
        found: String,
    },
    /// The transparency log or the timestamps do not establish the signature (Kyverno's
    /// prefix, then the detail).
    #[error("transparency log or timestamp verification failed: {0}")]
    Tlog(String),
    /// A log entry or SCT from a log the trust root does not list (a new shard, a rotated key
    /// the root has not caught up with): named with the root's source and age, so that an
    /// operator sees a stale root rather than a bad signature.
    #[error("transparency log or timestamp verification failed: {log} {id} unknown to {root}")]
    UnknownLog {
        /// `transparency log` or `CT log`.
        log: String,
        /// The log's key id, hex.
        id: String,
        /// Which root, from where, and when (`the trust root (TUF https://…, updated …)`).
        root: String,
    },
    /// The signature bytes do not verify with the signer's key.
    #[error("invalid signature: {0}")]
    InvalidSignature(String),
    /// The signing certificate names no accepted identity (cosign's text).
    #[error(
        "none of the expected identities matched what was in the certificate, got subjects [{subject}] with issuer {issuer}"
    )]
    Identity {
        /// The certificate's SAN.
        subject: String,
        /// The certificate's OIDC issuer (empty when it has none).
        issuer: String,
    },
    /// The signing certificate does not chain, is out of its validity, lacks a required
    /// extension value or a verifiable SCT.
    #[error("{0}")]
    Certificate(String),
    /// A transparency log entry contradicts the signature it should record, or its promise
    /// does not verify.
    #[error("{0}")]
    LogEntry(String),
    /// The signed content is about something else: another digest, a statement not naming the
    /// image, a missing annotation, a non-in-toto payload.
    #[error("{0}")]
    Content(String),
    /// The signature material cannot be read (malformed or refused as hostile JSON, bad
    /// base64, a bundle the verifier cannot parse).
    #[error("{0}")]
    Malformed(String),
    /// The revocation status of a certificate of the chain cannot be told from the data held
    /// yet (none fetched, stale, unverifiable): a verdict never cached, so an admission after
    /// the background fetch is judged on the data.
    #[error("{0}")]
    RevocationUnknown(String),
    /// The trust root the attestor's own TUF repository (`cosign.tuf`) serves is not fetched
    /// yet, or every fetch so far failed: a verdict never cached, so a verification after the
    /// background fetch is judged on the root.
    #[error("{0}")]
    TrustPending(String),
    /// The attestor itself cannot verify anything: unsupported kind, unusable key,
    /// certificate or trust root (whatever the image), or an attestation of a kind it cannot
    /// verify.
    #[error("{0}")]
    Attestor(String),
    /// An image index lists more platform manifests than ivory verifies
    /// (`ivory.dev/verify-platforms`).
    #[error(
        "the image index lists more than {limit} platform manifests; ivory verifies at most {limit}"
    )]
    TooManyPlatforms {
        /// The most platform manifests verified.
        limit: usize,
    },
    /// An image index has no manifest for the platforms a policy asks to verify.
    #[error("the image index has no manifest for the platforms to verify ({platforms})")]
    NoPlatformManifest {
        /// The platforms asked for, `os/arch` (`*` for any).
        platforms: String,
    },
    /// A verdict reached after reading the registry, with where signatures were looked for
    /// and what each place held (`referrers API: unsupported; fallback tag sha256-…: 3
    /// manifests, 2 Sigstore bundles, 1 other; .sig tag: absent`), so that "not found" is
    /// never the whole answer.
    #[error("{reason} (looked at: {})", looked.join("; "))]
    Searched {
        /// The verdict's reason.
        reason: Box<Rejection>,
        /// Each layout read and what it held, in the order read.
        looked: Vec<String>,
    },
    /// One platform manifest of an index is not verified.
    #[error("platform {platform} ({digest}): {reason}")]
    Platform {
        /// `os/arch[/variant]`.
        platform: String,
        /// The platform manifest's digest.
        digest: String,
        /// Why it is not verified.
        reason: Box<Rejection>,
    },
}

impl Rejection {
    /// True when this verdict may change as soon as background data arrives (unknown
    /// revocation status, alone or among the reasons): it must not be cached.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::RevocationUnknown(_) | Self::TrustPending(_) => true,
            Self::NoneMatched { reasons, .. } => reasons.iter().any(Self::is_transient),
            Self::Platform { reason, .. } | Self::Searched { reason, .. } => reason.is_transient(),
            _ => false,
        }
    }

    /// The reason naming a log the trust root does not know, alone or among the reasons.
    pub fn unknown_log(&self) -> Option<&Rejection> {
        match self {
            Self::UnknownLog { .. } => Some(self),
            Self::NoneMatched { reasons, .. } => reasons.iter().find_map(Self::unknown_log),
            Self::Platform { reason, .. } | Self::Searched { reason, .. } => reason.unknown_log(),
            _ => None,
        }
    }

    /// The reason without the account of where signatures were looked for.
    pub fn unsearched(&self) -> &Rejection {
        match self {
            Self::Searched { reason, .. } => reason.unsearched(),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_read_as_before_and_survive_a_round_trip() {
        let none = Rejection::NoneMatched {
            sought: Sought::Signatures,
            reasons: vec![
                Rejection::InvalidSignature("bad".into()),
                Rejection::Tlog("no entry".into()),
            ],
            left_out: 2,
        };
        assert_eq!(
            none.to_string(),
            "no matching signatures: invalid signature: bad; transparency log or timestamp verification failed: no entry (and 2 more)"
        );
        let platform = Rejection::Platform {
            platform: "linux/arm64".into(),
            digest: "sha256:ab".into(),
            reason: Box::new(none.clone()),
        };
        assert!(
            platform
                .to_string()
                .starts_with("platform linux/arm64 (sha256:ab): no matching signatures: "),
            "{platform}"
        );
        let searched = Rejection::Searched {
            reason: Box::new(Rejection::NoSignatures),
            looked: vec![
                ".sig tag sha256-ab.sig: absent".into(),
                "fallback tag sha256-ab: 3 manifests, 2 Sigstore bundles, 1 other".into(),
            ],
        };
        assert_eq!(
            searched.to_string(),
            "signatures not found (looked at: .sig tag sha256-ab.sig: absent; fallback tag sha256-ab: 3 manifests, 2 Sigstore bundles, 1 other)"
        );
        assert_eq!(searched.unsearched(), &Rejection::NoSignatures);
        for rejection in [none, platform, searched, Rejection::NoAttestations] {
            let bytes = serde_json::to_vec(&rejection).unwrap();
            let back: Rejection = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(back, rejection);
        }
        // A reason stored as plain text (the old shared-cache shape) is not a rejection.
        assert!(serde_json::from_str::<Rejection>("\"signatures not found\"").is_err());
    }
}
