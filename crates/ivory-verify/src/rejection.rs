//! Why an image is not verified by an attestor: the typed reason of a definite negative
//! verdict. Its text is what `Verification::NotVerified` carries and policies' messages quote,
//! so each variant renders exactly the text ivory (and, where it has one, Kyverno) gives.

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

impl Rejection {
    /// True when this verdict may change as soon as background data arrives (unknown
    /// revocation status, alone or among the reasons): it must not be cached.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::RevocationUnknown(_) => true,
            Self::NoneMatched { reasons, .. } => reasons.iter().any(Self::is_transient),
            _ => false,
        }
    }
}

/// A definite "not verified", classified once where it is decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// No signature of the wanted kind exists for the image (Kyverno's text).
    #[error("signatures not found")]
    NoSignatures,
    /// No attestation exists for the image (Kyverno's text).
    #[error("no matching attestations: signatures not found")]
    NoAttestations,
    /// Candidates existed and none verified: `prefix` and the first distinct reasons.
    #[error("{prefix}: {}", joined(reasons, *left_out))]
    NoneMatched {
        /// `no matching signatures` or `no matching attestations`.
        prefix: &'static str,
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
    /// The attestor itself cannot verify anything: unsupported kind, unusable key,
    /// certificate or trust root (whatever the image).
    #[error("{0}")]
    Attestor(String),
}
