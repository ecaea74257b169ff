//! The report of one image against the loaded policies, as `ivory verify` and `ivory audit`
//! give it: the verdict, each policy's result and what each attestor said.
//!
//! [`ImageChecker`] resolves a tag with the credentials of the first policy that selects the
//! image, as the mutating stage would, then judges a synthetic Pod (namespace and
//! `namespaceObject` of the checker, CREATE) whose only container runs `repo:tag@digest`
//! through [`crate::pipeline::run_routes`], so CEL validations, `required`, exceptions and
//! actions behave exactly as in the webhook and `verifyDigest` holds for tags. The attestor
//! table is evidence beside that verdict: every attestor of a policy that was not skipped is
//! asked about the image signature and each of the policy's attestations, whichever of them
//! the policy's CEL reads, so the report says what each attestor would answer. Those questions
//! go to the same [`ImageVerifier`](crate::verifier::ImageVerifier) as the engine's, whose
//! cache answers the ones the engine already asked without more registry requests.
//!
//! The verdict comes from the policies' [`Status`]es (never from their texts); rendering
//! (tables, JSON, SARIF, PolicyReports) is the caller's.

mod check;

#[cfg(test)]
mod tests;

use serde_json::json;

pub use self::check::ImageChecker;
use crate::admission::{
    AdmissionRequest, GroupVersionKind, GroupVersionResource, Operation, UserInfo,
};
use crate::decision::{Decision, Status};
use crate::verifier::VerifyError;

/// Overall verdict for one image.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Verdict {
    /// Every policy that applies passed (or an exception exempted the image).
    Pass,
    /// Not verified, denied by a validation, or no policy applies.
    Fail,
    /// Could not be checked: a registry failure, a spent budget under `failurePolicy: Fail`,
    /// a CEL error.
    Error,
}

impl Verdict {
    /// Lowercase spelling (`pass`, `fail`, `error`), as the CLI's JSON has it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::Error => "error",
        }
    }
}

/// What one attestor said about one image, decided from the verifier's answer's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AttestorResult {
    /// A [`Verification::Verified`](crate::verifier::Verification::Verified) verdict.
    Verified,
    /// A [`Verification::NotVerified`](crate::verifier::Verification::NotVerified) verdict.
    Failed,
    /// No verdict: the registry failed or the budget ran out (a [`VerifyError`]).
    Error,
    /// Not asked: the attestor takes fields from CEL, which only the engine evaluates.
    NotChecked,
}

impl AttestorResult {
    /// Spelling: `verified`, `failed`, `error`, `not-checked`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Verified => "verified",
            Self::Failed => "failed",
            Self::Error => "error",
            Self::NotChecked => "not-checked",
        }
    }
}

/// One attestor's answer about one image.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct AttestorOutcome {
    /// The attestor's name in the policy.
    pub attestor: String,
    /// `None`: the image signature; else the attestation name.
    pub attestation: Option<String>,
    /// What it said.
    pub result: AttestorResult,
    /// Why it failed, as the denial says it (with where signatures were looked for).
    pub reason: String,
    /// The reason alone, without the account of where signatures were looked for.
    pub brief: String,
    /// Each signature layout read and what it held, in the order read.
    pub looked: Vec<String>,
}

impl AttestorOutcome {
    /// An outcome whose reason has no account of the layouts read.
    fn plain(
        attestor: String,
        attestation: Option<String>,
        result: AttestorResult,
        reason: String,
    ) -> Self {
        Self {
            attestor,
            attestation,
            result,
            brief: reason.clone(),
            reason,
            looked: Vec::new(),
        }
    }
}

/// One policy's result for one image.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PolicyOutcome {
    /// The policy's name.
    pub policy: String,
    /// Namespace of a NamespacedImageValidatingPolicy.
    pub namespace: Option<String>,
    /// The engine's status for the policy.
    pub result: Status,
    /// The engine's message for it (empty when it passed).
    pub message: String,
    /// Each attestor's answer (none for a skipped policy).
    pub attestors: Vec<AttestorOutcome>,
}

/// The full answer for one image.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ImageReport {
    /// The image as given.
    pub image: String,
    /// The namespace it was evaluated in, for cluster Pods' images.
    pub namespace: Option<String>,
    /// The manifest digest it resolved to.
    pub digest: Option<String>,
    /// The overall verdict.
    pub verdict: Verdict,
    /// Every policy's result, in the engine's order.
    pub policies: Vec<PolicyOutcome>,
    /// Why it did not pass (or the exception that exempted it).
    pub message: String,
}

impl ImageReport {
    /// The entry of an image whose tag [`ImageChecker::resolve`] did not resolve: one line,
    /// the image as given, then the registry and the root cause once.
    pub fn unresolved(image: &str, error: &VerifyError) -> Self {
        Self::error(image, format!("{image}: {}", error.reason()))
    }

    /// An image that could not be checked at all (registry or listing failure).
    pub fn error(image: &str, message: String) -> Self {
        Self {
            image: image.to_owned(),
            namespace: None,
            digest: None,
            verdict: Verdict::Error,
            policies: Vec::new(),
            message,
        }
    }
}

/// `repo:tag` + digest → `repo:tag@digest` (unchanged when it already has a digest).
fn pinned(image: &str, digest: &str) -> String {
    if image.contains('@') {
        image.to_owned()
    } else {
        format!("{image}@{digest}")
    }
}

/// The key under which images share one check: the repository of `image` and the digest it
/// resolved to (`host/repo@sha256:…`). Signatures live beside an image in its repository, so
/// two tags of one digest share a verdict only within one repository.
pub fn verification_key(image: &str, digest: &str) -> String {
    format!("{}@{digest}", repository(image))
}

/// The repository part of a reference (`host/repo:tag@sha256:…` → `host/repo`).
fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    match no_digest.rfind(':') {
        Some(i) if !no_digest[i..].contains('/') => &no_digest[..i],
        _ => no_digest,
    }
}

/// The image's verdict from the policies' statuses (never from their texts): any error (a
/// registry failure, a spent budget under `failurePolicy: Fail`, a CEL error) is `Error`, else
/// any failure (not verified) or denial is `Fail`.
fn verdict(decision: &Decision, policies: &[PolicyOutcome]) -> (Verdict, String) {
    let problems: Vec<String> = policies
        .iter()
        .filter(|p| p.result.is_problem())
        .map(|p| format!("policy {}: {}", p.policy, p.message))
        .collect();
    if policies.iter().any(|p| p.result == Status::Error) {
        return (Verdict::Error, problems.join("; "));
    }
    if !problems.is_empty() {
        return (Verdict::Fail, problems.join("; "));
    }
    if !decision.allowed {
        let message = decision.message.clone().unwrap_or_default();
        return (Verdict::Fail, message);
    }
    if policies.iter().any(|p| p.result == Status::Pass) {
        (Verdict::Pass, String::new())
    } else if let Some(skipped) = policies.iter().find(|p| p.result == Status::Skip) {
        // Admitted as the webhook would: a PolicyException exempts the image.
        (Verdict::Pass, skipped.message.clone())
    } else {
        (
            Verdict::Fail,
            "no policy applies to this image (matchImageReferences / matchConstraints)".to_owned(),
        )
    }
}

/// A Pod CREATE request in `namespace` with one container running `image`.
fn pod_request(image: &str, namespace: &str) -> AdmissionRequest {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ivory-verify", "namespace": namespace},
        "spec": {"containers": [{"name": "image", "image": image}]},
    });
    AdmissionRequest {
        uid: "ivory-verify".to_owned(),
        kind: GroupVersionKind {
            group: String::new(),
            version: "v1".to_owned(),
            kind: "Pod".to_owned(),
        },
        resource: GroupVersionResource::new("", "v1", "pods"),
        name: "ivory-verify".to_owned(),
        namespace: namespace.to_owned(),
        operation: Operation::Create,
        user_info: UserInfo {
            username: "ivory-cli".to_owned(),
            ..Default::default()
        },
        object: Some(pod.into()),
        ..Default::default()
    }
}
