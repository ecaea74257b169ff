//! The seam between the engine and the outside world: everything that needs a registry or
//! cryptography goes through [`ImageVerifier`]. `ivory-verify` implements it for real;
//! unit tests use in-memory fakes. The engine never talks to a registry itself.

use std::collections::BTreeSet;
use std::fmt;

use futures::future::BoxFuture;
use ivory_policy::types::{Attestation, Attestor, Credentials};
pub use ivory_reference::{ImageRefError, ImageReference};
use tokio::time::Instant;

mod rejection;

pub use rejection::{Rejection, Sought};

/// One verification question: does `attestor` vouch for `image` (a signature when
/// `attestation` is `None`, else that attestation)?
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyRequest {
    /// The image as the workload names it, parsed once where it left the request or the
    /// policy ([`ImageReference::original`] is the text, for messages). Implementations
    /// resolve it to a digest first and verify (and cache) by digest only, never by tag.
    pub image: ImageReference,
    /// The attestor with every CEL-sourced field (`key.expression`, `certificate.*.expression`,
    /// `trustedRoot.expression`, notary certs) already evaluated into its `data`/`value` field.
    pub attestor: Attestor,
    /// `None` for `verifyImageSignatures`; the named attestation for
    /// `verifyAttestationSignatures`.
    pub attestation: Option<Attestation>,
    /// The policy's `spec.credentials`; `None` means the global registry options.
    pub credentials: Option<Credentials>,
    /// Which manifests of an image index must verify (the policy's
    /// `ivory.dev/verify-platforms`); the index itself by default, as Kyverno.
    pub platforms: PlatformScope,
}

/// Which manifests of an image index a verification covers. A single-manifest image is that
/// manifest under either.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub enum PlatformScope {
    /// The digest the image names or its tag resolves to (for an index, the index): Kyverno.
    #[default]
    Index,
    /// Every platform manifest of the index whose platform is in the set; each must verify.
    Platforms(PlatformSet),
}

impl PlatformScope {
    /// The scope `policy` asks for about the workload `object` (the Pod or pod template).
    pub fn of_policy(
        policy: ivory_policy::VerifyPlatforms,
        object: Option<&serde_json::Value>,
    ) -> Self {
        match policy {
            ivory_policy::VerifyPlatforms::Index => Self::Index,
            ivory_policy::VerifyPlatforms::AllPlatforms => Self::Platforms(PlatformSet::default()),
            ivory_policy::VerifyPlatforms::PodPlatform => {
                Self::Platforms(PlatformSet::of_workload(object))
            }
        }
    }
}

/// The platforms a workload can run on, from its pod spec: each part `None` when nothing
/// constrains it (any value).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct PlatformSet {
    /// Allowed `kubernetes.io/os` values.
    pub os: Option<BTreeSet<String>>,
    /// Allowed `kubernetes.io/arch` values.
    pub architecture: Option<BTreeSet<String>>,
}

impl PlatformSet {
    /// Whether a manifest for `os`/`architecture` can run under this set.
    pub fn contains(&self, os: &str, architecture: &str) -> bool {
        let allows = |set: &Option<BTreeSet<String>>, value: &str| {
            set.as_ref().is_none_or(|s| s.contains(value))
        };
        allows(&self.os, os) && allows(&self.architecture, architecture)
    }

    /// The set as `os/arch` for messages (`*` for an unconstrained part).
    pub fn describe(&self) -> String {
        let part = |set: &Option<BTreeSet<String>>| match set {
            None => "*".to_owned(),
            Some(s) => s.iter().cloned().collect::<Vec<_>>().join("|"),
        };
        format!("{}/{}", part(&self.os), part(&self.architecture))
    }

    /// Where the workload can be scheduled: its pod spec's `nodeSelector` and the required
    /// node affinity (`requiredDuringSchedulingIgnoredDuringExecution`: terms are alternatives,
    /// so their `In` values add up; a term that does not constrain a label leaves it free) on
    /// `kubernetes.io/os` and `kubernetes.io/arch`; both bind, so they intersect. Other
    /// operators only ever narrow what the scheduler allows, so they are left out: the set may
    /// be larger than the scheduler's, never smaller.
    pub fn of_workload(object: Option<&serde_json::Value>) -> Self {
        let spec = object.and_then(|o| {
            [
                "/spec/template/spec",
                "/spec/jobTemplate/spec/template/spec",
                "/spec",
            ]
            .iter()
            .find_map(|p| {
                o.pointer(p).filter(|s| {
                    ["containers", "nodeSelector", "affinity"]
                        .iter()
                        .any(|k| s.get(k).is_some())
                })
            })
        });
        let constrained = |key: &str| {
            let selected = spec
                .and_then(|s| s.pointer("/nodeSelector"))
                .and_then(|s| s.get(key))
                .and_then(serde_json::Value::as_str)
                .filter(|v| !v.is_empty())
                .map(|v| BTreeSet::from([v.to_owned()]));
            let affinity = spec.and_then(|s| required_affinity(s, key));
            match (selected, affinity) {
                (Some(a), Some(b)) => Some(a.intersection(&b).cloned().collect()),
                (a, b) => a.or(b),
            }
        };
        Self {
            os: constrained(NODE_OS),
            architecture: constrained(NODE_ARCH),
        }
    }
}

/// The values of `key` the required node affinity allows, `None` when some term leaves it free.
fn required_affinity(spec: &serde_json::Value, key: &str) -> Option<BTreeSet<String>> {
    let terms = spec
        .pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")?
        .as_array()?;
    let mut allowed = BTreeSet::new();
    for term in terms {
        let mut in_term: Option<BTreeSet<String>> = None;
        for expression in term
            .get("matchExpressions")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
        {
            let about_key = expression.get("key").and_then(serde_json::Value::as_str) == Some(key);
            let is_in = expression
                .get("operator")
                .and_then(serde_json::Value::as_str)
                == Some("In");
            if !(about_key && is_in) {
                continue;
            }
            let values: BTreeSet<String> = expression
                .get("values")
                .and_then(serde_json::Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            in_term = Some(match in_term {
                Some(before) => before.intersection(&values).cloned().collect(),
                None => values,
            });
        }
        // A term that does not constrain the label allows any value.
        allowed.extend(in_term?);
    }
    (!terms.is_empty()).then_some(allowed)
}

/// The platform whose manifest [`ImageVerifier::image_data`] takes from an image index.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ImagePlatform {
    /// e.g. `linux`.
    pub os: String,
    /// e.g. `amd64`.
    pub architecture: String,
    /// Where the workload can run: when the index has no manifest for `os`/`architecture` and
    /// exactly one manifest in this set, that one is described (an arm64-only or Windows-only
    /// image on a Pod that does not say its platform runs that platform, or nowhere).
    pub allowed: PlatformSet,
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
            allowed: PlatformSet::default(),
        }
    }
}

impl ImagePlatform {
    /// The platform the workload's pod spec pins ([`PlatformSet::of_workload`]: `nodeSelector`
    /// and required node affinity on `kubernetes.io/os` and `kubernetes.io/arch`), each part
    /// defaulting to `linux`/`amd64` when it is not pinned to one value.
    pub fn of_workload(object: Option<&serde_json::Value>) -> Self {
        let allowed = PlatformSet::of_workload(object);
        let one = |set: &Option<BTreeSet<String>>| {
            set.as_ref()
                .filter(|s| s.len() == 1)
                .and_then(|s| s.first().cloned())
        };
        let default = Self::default();
        Self {
            os: one(&allowed.os).unwrap_or(default.os),
            architecture: one(&allowed.architecture).unwrap_or(default.architecture),
            allowed,
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
        /// Why the image is not verified, as decided where the verdict was reached.
        reason: Rejection,
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

impl VerifyError {
    /// The budget ran out while `operation` was in progress for `image`: the one place a
    /// deadline error is made, so each names the image's registry and its budget alike.
    pub fn deadline_exceeded(
        image: &ImageReference,
        operation: &str,
        budget: std::time::Duration,
    ) -> Self {
        VerifyError::DeadlineExceeded {
            image: image.original().to_owned(),
            registry: image.registry().to_owned(),
            operation: operation.to_owned(),
            budget_ms: u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// `image` is not an image reference: no registry can be asked about it. Made where the
    /// image is parsed (the first seam it crosses), so the verifier is never asked; an
    /// availability failure, as when the verifier refused it before, with the same words.
    pub fn invalid_reference(image: &str, error: &ImageRefError) -> Self {
        VerifyError::Unavailable {
            image: image.to_owned(),
            registry: String::new(),
            message: format!("invalid image reference ({})", error.reason),
        }
    }
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

/// A kept verdict as [`ImageVerifier::hold_verdict`] handed it out: opaque to the engine, read
/// back only by the verifier that made it.
pub type HeldVerdict = Box<dyn std::any::Any + Send + Sync>;

/// Everything the engine needs from registries and signature verification.
///
/// Each call receives the request's absolute `deadline`; implementations must return by then
/// (with [`VerifyError::DeadlineExceeded`] when they could not finish).
pub trait ImageVerifier: Send + Sync {
    /// Resolves a tag reference to its manifest digest (`sha256:…`). Digest references return
    /// their own digest without network access.
    fn resolve_digest<'a>(
        &'a self,
        image: &'a ImageReference,
        credentials: Option<&'a Credentials>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<String, VerifyError>>;

    /// Answers one verification question.
    fn verify<'a>(
        &'a self,
        request: &'a VerifyRequest,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Verification, VerifyError>>;

    /// The answer to `request` when this verifier already holds it (a kept verdict, reused as
    /// [`ImageVerifier::verify`] would reuse it), without waiting; `None` otherwise, and
    /// `verify` answers. The warm path then needs no future, deadline or box per question.
    /// The default holds nothing.
    fn verify_known(&self, request: &VerifyRequest) -> Option<Verification> {
        let _ = request;
        None
    }

    /// A handle on the verdict this verifier keeps for `request` when it is `answer`, which
    /// [`ImageVerifier::still_holds`] checks later without building the verdict's key again,
    /// copying the verdict or waiting: what lets the validating stage reuse a route's prepared
    /// plans and their decision (`validate::reuse`). `None` (the default): nothing is held,
    /// and nothing is reused.
    fn hold_verdict(&self, request: &VerifyRequest, answer: &Verification) -> Option<HeldVerdict> {
        let _ = (request, answer);
        None
    }

    /// Whether this verifier still keeps the very verdict `held` was taken on: not expired,
    /// evicted, replaced or made under another trust root, and held by this verifier (a handle
    /// another verifier made is never held; the default holds none).
    fn still_holds(&self, held: &HeldVerdict) -> bool {
        let _ = held;
        false
    }

    /// Image metadata for `getImageData` / `image.GetMetadata`, in the shape of Kyverno's
    /// image data loader: `{image, resolvedImage, registry, repository, identifier, tag,
    /// digest, imageIndex, manifest, config}` with empty `tag` and absent `imageIndex`
    /// omitted. For an image index, `imageIndex` is the index and `manifest`/`config` are
    /// those of the `platform` entry (an error when the index has none).
    fn image_data<'a>(
        &'a self,
        image: &'a ImageReference,
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

    #[test]
    fn the_platforms_a_pod_can_run_on_come_from_node_selector_and_required_affinity() {
        let set = |spec: serde_json::Value| {
            PlatformSet::of_workload(Some(&json!({"spec": spec}))).describe()
        };
        assert_eq!(set(json!({"containers": []})), "*/*");
        let term = |key: &str, op: &str, values: serde_json::Value| json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]});
        let affinity = |terms: Vec<serde_json::Value>| {
            json!({"containers": [], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
        };
        assert_eq!(
            set(affinity(vec![term(
                "kubernetes.io/arch",
                "In",
                json!(["arm64"])
            )])),
            "*/arm64"
        );
        // Terms are alternatives: their values add up; a free term frees the label.
        assert_eq!(
            set(affinity(vec![
                term("kubernetes.io/arch", "In", json!(["arm64"])),
                term("kubernetes.io/arch", "In", json!(["amd64"])),
            ])),
            "*/amd64|arm64"
        );
        assert_eq!(
            set(affinity(vec![
                term("kubernetes.io/arch", "In", json!(["arm64"])),
                term("kubernetes.io/os", "In", json!(["linux"])),
            ])),
            "*/*"
        );
        // NotIn only narrows what the scheduler allows: left out, never a smaller set.
        assert_eq!(
            set(affinity(vec![term(
                "kubernetes.io/arch",
                "NotIn",
                json!(["arm64"])
            )])),
            "*/*"
        );
        // nodeSelector and affinity both bind.
        let mut both = affinity(vec![term(
            "kubernetes.io/arch",
            "In",
            json!(["arm64", "amd64"]),
        )]);
        both["nodeSelector"] =
            json!({"kubernetes.io/arch": "arm64", "kubernetes.io/os": "windows"});
        assert_eq!(set(both.clone()), "windows/arm64");
        let platform = ImagePlatform::of_workload(Some(&json!({"spec": both})));
        assert_eq!(
            (platform.os.as_str(), platform.architecture.as_str()),
            ("windows", "arm64")
        );
        // A pod template of a controller.
        let deployment = json!({"spec": {"template": {"spec": affinity(vec![term("kubernetes.io/os", "In", json!(["windows"]))])}}});
        assert_eq!(
            PlatformSet::of_workload(Some(&deployment)).describe(),
            "windows/*"
        );
        assert!(PlatformSet::default().contains("windows", "arm64"));
    }
}
