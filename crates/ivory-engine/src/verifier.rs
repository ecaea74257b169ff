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

/// The platform whose manifest [`ImageVerifier::image_data`] takes from an image index.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ImagePlatform {
    /// e.g. `linux`.
    pub os: String,
    /// e.g. `amd64`.
    pub architecture: String,
}

/// The nodeSelector keys that pin a workload's platform (well-known Kubernetes labels).
const NODE_OS: &str = "kubernetes.io/os";
const NODE_ARCH: &str = "kubernetes.io/arch";

impl Default for ImagePlatform {
    /// `linux/amd64`, what go-containerregistry (so Kyverno) picks from an index.
    fn default() -> Self {
        Self {
            os: "linux".into(),
            architecture: "amd64".into(),
        }
    }
}

impl ImagePlatform {
    /// The platform the workload's pod spec pins through its `nodeSelector`
    /// (`kubernetes.io/os`, `kubernetes.io/arch`; Pods, pod templates of controllers and
    /// CronJobs), each part defaulting to `linux`/`amd64` when it is not pinned.
    pub fn of_workload(object: Option<&serde_json::Value>) -> Self {
        let selector = object.and_then(|o| {
            [
                "/spec/nodeSelector",
                "/spec/template/spec/nodeSelector",
                "/spec/jobTemplate/spec/template/spec/nodeSelector",
            ]
            .iter()
            .find_map(|p| o.pointer(p))
        });
        let label = |key: &str| {
            selector
                .and_then(|s| s.get(key))
                .and_then(serde_json::Value::as_str)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let default = Self::default();
        Self {
            os: label(NODE_OS).unwrap_or(default.os),
            architecture: label(NODE_ARCH).unwrap_or(default.architecture),
        }
    }
}

/// Who vouched for a verified signature or attestation: taken from the signature and the trust
/// material that verified it, never from the request. Recorded in the admission's audit
/// annotations so the API server's audit log says what was verified and by whom.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Signer {
    /// `sha256:<hex>` of the public key (DER SubjectPublicKeyInfo) that verified the signature:
    /// a key attestor's key, or a certificate attestor's certificate key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The signing certificate's identity (email or URI SAN), for keyless signatures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The OIDC issuer the signing certificate names, for keyless signatures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// The index of the transparency-log entry that was checked with the signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_index: Option<u64>,
}

/// A definite answer about one (image, attestor, attestation) triple.
#[derive(Clone, Debug, PartialEq)]
pub enum Verification {
    /// Cryptographically verified. For attestations, `payload` is the verified in-toto
    /// Statement (`_type`, `subject`, `predicateType`, `predicate`) that `extractPayload`
    /// returns; it is never an unverified payload.
    Verified {
        /// The digest the signature covers.
        digest: String,
        /// The verified statement, for attestations; `None` for signatures.
        payload: Option<serde_json::Value>,
        /// Who signed it (`None` from verifiers that do not say, e.g. test fakes).
        signer: Option<Signer>,
    },
    /// A definite negative verdict: no signature, bad signature, wrong identity, missing
    /// annotation, unsupported attestor kind. Safe to cache briefly.
    NotVerified {
        /// The image's digest, when it was resolved before the verdict.
        digest: Option<String>,
        /// Why the image is not verified.
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
///
/// Registry failures are classified into these variants once, where the registry error is
/// mapped (`ivory-verify`); failurePolicy, metrics and messages are decided from
/// [`VerifyError::kind`], never from the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VerifyError {
    /// The request's budget ran out before the registry answered.
    DeadlineExceeded {
        /// The image being looked at.
        image: String,
        /// Its registry host.
        registry: String,
        /// What was in progress (`resolving the digest`, `verifying signatures`).
        operation: String,
        /// The budget the request had, in milliseconds.
        budget_ms: u64,
    },
    /// The registry could not be reached or failed (network, TLS, 5xx, throttling, refused
    /// credentials) or an internal failure kept ivory from asking it.
    Unavailable {
        /// The image being looked at.
        image: String,
        /// Its registry host.
        registry: String,
        /// What went wrong, in ivory's words (never the registry's).
        message: String,
    },
    /// The image (manifest, tag or repository) does not exist on the registry.
    NotFound {
        /// The image being looked at.
        image: String,
        /// Its registry host.
        registry: String,
        /// What went wrong, in ivory's words (never the registry's).
        message: String,
    },
    /// The registry answered with something ivory refuses to use: over a size or count limit,
    /// malformed, or not matching the digest that addressed it.
    Hostile {
        /// The image being looked at.
        image: String,
        /// Its registry host.
        registry: String,
        /// What went wrong, in ivory's words (never the registry's).
        message: String,
    },
}

/// The class of a [`VerifyError`], for decisions and metrics labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The time budget ran out: the policy's failurePolicy decides.
    Deadline,
    /// The registry could not be reached or failed.
    Unavailable,
    /// The image does not exist.
    NotFound,
    /// The registry's answer was refused (limit, malformed, digest mismatch).
    Hostile,
}

impl ErrorKind {
    /// Lowercase label for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deadline => "deadline",
            Self::Unavailable => "unavailable",
            Self::NotFound => "not_found",
            Self::Hostile => "hostile",
        }
    }
}

impl VerifyError {
    /// The class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::DeadlineExceeded { .. } => ErrorKind::Deadline,
            Self::Unavailable { .. } => ErrorKind::Unavailable,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::Hostile { .. } => ErrorKind::Hostile,
        }
    }

    /// True when the budget ran out: the engine then applies the policy's failurePolicy.
    pub fn is_deadline(&self) -> bool {
        self.kind() == ErrorKind::Deadline
    }

    /// The registry host the error is about (empty when unknown).
    pub fn registry(&self) -> &str {
        match self {
            Self::DeadlineExceeded { registry, .. }
            | Self::Unavailable { registry, .. }
            | Self::NotFound { registry, .. }
            | Self::Hostile { registry, .. } => registry,
        }
    }
}

impl VerifyError {
    /// The failure without the image, for messages that name the image already: the
    /// registry and the root cause, once.
    pub fn reason(&self) -> String {
        match self {
            Self::DeadlineExceeded {
                registry,
                operation,
                budget_ms,
                ..
            } => format!(
                "time budget of {budget_ms}ms exhausted while {operation} at registry {registry}"
            ),
            Self::Unavailable { message, .. }
            | Self::NotFound { message, .. }
            | Self::Hostile { message, .. } => message.clone(),
        }
    }
}

/// `<image>: <reason>`, one line.
impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let image = match self {
            Self::DeadlineExceeded { image, .. }
            | Self::Unavailable { image, .. }
            | Self::NotFound { image, .. }
            | Self::Hostile { image, .. } => image,
        };
        write!(f, "{image}: {}", self.reason())
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

    /// Image metadata for `getImageData` / `image.GetMetadata`, in the shape of Kyverno's
    /// image data loader: `{image, resolvedImage, registry, repository, identifier, tag,
    /// digest, imageIndex, manifest, config}` with empty `tag` and absent `imageIndex`
    /// omitted. For an image index, `imageIndex` is the index and `manifest`/`config` are
    /// those of the `platform` entry (an error when the index has none).
    fn image_data<'a>(
        &'a self,
        image: &'a str,
        credentials: Option<&'a Credentials>,
        platform: &'a ImagePlatform,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<serde_json::Value, VerifyError>>;

    /// This verifier as a background scan that started at `since` uses it: a verdict reached
    /// before `since` is reached again rather than reused, so a signature removed from the
    /// registry or a key no longer trusted shows up at the next scan and not only when the
    /// cached verdict expires; verdicts reached since `since` are reused, so a digest that many
    /// Pods run is verified once per scan. `None` (the default): this verifier keeps no
    /// verdicts and is used as it is.
    fn revalidating(&self, since: Instant) -> Option<Box<dyn ImageVerifier + '_>> {
        let _ = since;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_platform_comes_from_the_pod_specs_node_selector() {
        let platform = |object: serde_json::Value| {
            let p = ImagePlatform::of_workload(Some(&object));
            format!("{}/{}", p.os, p.architecture)
        };
        assert_eq!(platform(json!({"spec": {}})), "linux/amd64");
        assert_eq!(
            platform(json!({"spec": {"nodeSelector": {"kubernetes.io/arch": "arm64"}}})),
            "linux/arm64"
        );
        let windows = json!({"kubernetes.io/os": "windows", "kubernetes.io/arch": "amd64"});
        assert_eq!(
            platform(json!({"spec": {"template": {"spec": {"nodeSelector": windows}}}})),
            "windows/amd64"
        );
        let arm = json!({"kubernetes.io/arch": "arm64"});
        assert_eq!(
            platform(
                json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"nodeSelector": arm}}}}}})
            ),
            "linux/arm64"
        );
        assert_eq!(ImagePlatform::of_workload(None), ImagePlatform::default());
    }
}
