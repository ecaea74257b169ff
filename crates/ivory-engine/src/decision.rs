//! What the engine concluded, independent of the wire format. The server turns a [`Decision`]
//! into an AdmissionResponse; the CLI and audits print it.

use std::collections::BTreeMap;

/// The result of one policy on one request (Kyverno's rule-response statuses).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Status {
    /// The policy could not be evaluated (CEL error, registry failure, budget exhausted).
    Error,
    /// A validation or a required check failed.
    Fail,
    /// Every validation held.
    Pass,
    /// The policy could not decide and its failurePolicy `Ignore` let the request through.
    Skip,
}

impl Status {
    /// Lowercase name as PolicyReports spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Fail => "fail",
            Self::Pass => "pass",
            Self::Skip => "skip",
        }
    }

    /// True for `fail` and `error`: the results a `Deny` action turns into a denial.
    pub fn is_problem(self) -> bool {
        matches!(self, Self::Fail | Self::Error)
    }
}

/// One policy's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyResult {
    /// Policy name (autogen variants report their parent's name).
    pub policy: String,
    /// Namespace of a NamespacedImageValidatingPolicy.
    pub namespace: Option<String>,
    /// What the policy concluded.
    pub status: Status,
    /// Failure or error message without the `Policy <name> …` prefix.
    pub message: String,
    /// Evaluated `auditAnnotations` (non-empty strings only).
    pub properties: BTreeMap<String, String>,
    /// Images this policy matched (after matchImageReferences).
    pub images: Vec<String>,
    /// The policy's actions, so the response can apply Deny/Warn/Audit.
    pub deny: bool,
    /// `Warn` is among the policy's validationActions.
    pub warn: bool,
    /// `Audit` is among the policy's validationActions.
    pub audit: bool,
}

/// One RFC 6902 operation the mutating stage emits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchOp {
    /// JSON pointer, e.g. `/spec/containers/0/image`.
    pub path: String,
    /// The pinned image, e.g. `docker.io/nginx:latest@sha256:…`.
    pub value: String,
}

/// The engine's answer to one AdmissionRequest.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// Denial text: `Policy <name> failed: <msg>` / `Policy <name> error: <msg>` joined by `; `.
    pub message: Option<String>,
    /// HTTP warnings (Warn actions, failurePolicy Ignore on budget exhaustion).
    pub warnings: Vec<String>,
    /// Admission audit annotations (e.g. why a request was let through unverified).
    pub audit_annotations: BTreeMap<String, String>,
    /// `replace` operations, de-duplicated by path (first wins); empty for validation.
    pub patch: Vec<PatchOp>,
    /// Every evaluated policy's outcome, for reports, metrics and the CLI.
    pub results: Vec<PolicyResult>,
    /// True when a failurePolicy was applied because the time budget ran out: decided from
    /// the error's type ([`crate::verifier::ErrorKind::Deadline`]), never from message text.
    pub budget_exhausted: bool,
}
