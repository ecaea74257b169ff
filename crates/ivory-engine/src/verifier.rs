//! The seam between the engine and the outside world: everything that needs a registry or
//! cryptography goes through [`ImageVerifier`]. `ivory-verify` implements it for real;
//! unit tests use in-memory fakes. The engine never talks to a registry itself.

use std::fmt;

use futures::future::BoxFuture;
use ivory_policy::types::{Attestation, Attestor, Credentials};
use tokio::time::Instant;

/// One verification question: does `attestor` vouch for `image` (a signature when
/// `attestation` is `None`, else that attestation)?
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyRequest {
    /// The image as the workload names it. Implementations resolve it to a digest first and
    /// verify (and cache) by digest only, never by tag.
    pub image: String,
    /// The attestor with every CEL-sourced field (`key.expression`, `certificate.*.expression`,
    /// `trustedRoot.expression`, notary certs) already evaluated into its `data`/`value` field.
    pub attestor: Attestor,
    /// `None` for `verifyImageSignatures`; the named attestation for
    /// `verifyAttestationSignatures`.
    pub attestation: Option<Attestation>,
    /// The policy's `spec.credentials`; `None` means the global registry options.
    pub credentials: Option<Credentials>,
}

/// A definite answer about one (image, attestor, attestation) triple.
#[derive(Clone, Debug, PartialEq)]
pub enum Verification {
    /// Cryptographically verified. For attestations, `payload` is the verified in-toto
    /// Statement (`_type`, `subject`, `predicateType`, `predicate`) that `extractPayload`
    /// returns; it is never an unverified payload.
    Verified {
        digest: String,
        payload: Option<serde_json::Value>,
    },
    /// A definite negative verdict: no signature, bad signature, wrong identity, missing
    /// annotation, unsupported attestor kind. Safe to cache briefly.
    NotVerified {
        digest: Option<String>,
        reason: String,
    },
}

impl Verification {
    /// True for a positive verdict.
    pub fn is_verified(&self) -> bool {
        matches!(self, Self::Verified { .. })
    }
}

/// Why no verdict could be reached. Never cached as a verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VerifyError {
    /// The request's budget ran out before the registry answered.
    DeadlineExceeded {
        image: String,
        registry: String,
        operation: String,
        budget_ms: u64,
    },
    /// Any other failure to get an answer (network, 5xx, auth, malformed data from the registry).
    Unavailable {
        image: String,
        registry: String,
        message: String,
    },
}

impl VerifyError {
    /// True when the budget ran out: the engine then applies the policy's failurePolicy.
    pub fn is_deadline(&self) -> bool {
        matches!(self, Self::DeadlineExceeded { .. })
    }
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DeadlineExceeded {
                image,
                registry,
                operation,
                budget_ms,
            } => write!(
                f,
                "time budget of {budget_ms}ms exhausted while {operation} for image {image} at registry {registry}"
            ),
            Self::Unavailable {
                image,
                registry,
                message,
            } => write!(f, "registry {registry} failed for image {image}: {message}"),
        }
    }
}

impl std::error::Error for VerifyError {}

/// Everything the engine needs from registries and signature verification.
///
/// Each call receives the request's absolute `deadline`; implementations must return by then
/// (with [`VerifyError::DeadlineExceeded`] when they could not finish).
pub trait ImageVerifier: Send + Sync {
    /// Resolves a tag reference to its manifest digest (`sha256:…`). Digest references return
    /// their own digest without network access.
    fn resolve_digest<'a>(
        &'a self,
        image: &'a str,
        credentials: Option<&'a Credentials>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>>;

    /// Answers one verification question.
    fn verify<'a>(
        &'a self,
        request: &'a VerifyRequest,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>>;

    /// Image metadata for `getImageData` / `image.GetMetadata`: `{image, resolvedImage,
    /// registry, repository, identifier, tag, digest, imageIndex, manifest, config}`.
    fn image_data<'a>(
        &'a self,
        image: &'a str,
        credentials: Option<&'a Credentials>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<serde_json::Value, VerifyError>>;
}
