//! Checking one image against policies, shared by `verify` and `audit`.
//!
//! The policy verdict comes from the engine's validating stage on a synthetic Pod (namespace
//! `--namespace`, CREATE) whose only container runs the image, so CEL validations, `required`
//! and actions behave exactly as in the webhook. The tag is resolved to a digest first and the
//! Pod names `repo:tag@digest`: what the mutating webhook would have admitted, so `verifyDigest`
//! holds for tags. The attestor table comes from asking the verifier directly, per attestor
//! (signature, then each attestation of the policy); those answers share the verifier's cache
//! with the engine's, so they cost no extra registry requests for the same digest.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ivory_engine::admission::AdmissionRequest;
use ivory_engine::decision::{Decision, Status};
use ivory_engine::verifier::{
    ImageReference, ImageVerifier, Rejection, Verification, VerifyError, VerifyRequest,
};
use ivory_policy::CompiledPolicy;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::wiring::{self, Stage};

/// Overall verdict for one image (`--output json` spelling: `pass`, `fail`, `error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Verdict {
    Pass,
    Fail,
    Error,
}

impl Verdict {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::Error => "error",
        }
    }
}

/// What one attestor said about one image, decided from the verifier's answer's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttestorResult {
    /// A [`Verification::Verified`] verdict.
    Verified,
    /// A [`Verification::NotVerified`] verdict.
    Failed,
    /// No verdict: the registry failed or the budget ran out (a `VerifyError`).
    Error,
    /// Not asked: the attestor takes fields from CEL, which only the engine evaluates.
    NotChecked,
}

impl AttestorResult {
    /// `--output` spelling: `verified`, `failed`, `error`, `not-checked`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Verified => "verified",
            Self::Failed => "failed",
            Self::Error => "error",
            Self::NotChecked => "not-checked",
        }
    }
}

/// One attestor's answer about one image.
#[derive(Clone, Debug)]
pub(crate) struct AttestorOutcome {
    pub attestor: String,
    /// `None`: the image signature; else the attestation name.
    pub attestation: Option<String>,
    pub result: AttestorResult,
    /// Why it failed, as the denial says it (with where signatures were looked for).
    pub reason: String,
    /// The reason alone, without the account of where signatures were looked for.
    pub brief: String,
    /// Each signature layout read and what it held (`--explain`), in the order read.
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
#[derive(Clone, Debug)]
pub(crate) struct PolicyOutcome {
    pub policy: String,
    pub namespace: Option<String>,
    /// The engine's status for the policy (spelt `pass`, `fail`, `error` or `skip`).
    pub result: Status,
    pub message: String,
    pub attestors: Vec<AttestorOutcome>,
}

/// The full answer for one image.
#[derive(Clone, Debug)]
pub(crate) struct ImageReport {
    pub image: String,
    /// The namespace it was evaluated in, for cluster Pods' images.
    pub namespace: Option<String>,
    pub digest: Option<String>,
    pub verdict: Verdict,
    pub policies: Vec<PolicyOutcome>,
    pub message: String,
}

impl ImageReport {
    /// The entry of an image whose tag [`Checker::resolve`] did not resolve: one line, the
    /// image as given, then the registry and the root cause once.
    pub(crate) fn unresolved(image: &str, error: &VerifyError) -> Self {
        Self::error(image, format!("{image}: {}", error.reason()))
    }

    /// An image that could not be checked at all (registry or listing failure).
    pub(crate) fn error(image: &str, message: String) -> Self {
        Self {
            image: image.to_owned(),
            namespace: None,
            digest: None,
            verdict: Verdict::Error,
            policies: Vec::new(),
            message,
        }
    }

    /// The stable `--output json` form: `{image, digest, verdict, policies, message}`.
    pub(crate) fn to_json(&self) -> Value {
        let policies: Vec<Value> = self
            .policies
            .iter()
            .map(|p| {
                let attestors: Vec<Value> = p
                    .attestors
                    .iter()
                    .map(|a| {
                        json!({
                            "attestor": a.attestor,
                            "attestation": a.attestation,
                            "result": a.result.as_str(),
                            "reason": a.reason,
                            "looked": a.looked,
                        })
                    })
                    .collect();
                json!({
                    "policy": p.policy,
                    "namespace": p.namespace,
                    "result": p.result.as_str(),
                    "message": p.message,
                    "attestors": attestors,
                })
            })
            .collect();
        let mut doc = json!({
            "image": self.image,
            "digest": self.digest,
            "verdict": self.verdict.as_str(),
            "policies": policies,
            "message": self.message,
        });
        if let Some(ns) = &self.namespace {
            doc["namespace"] = json!(ns);
        }
        doc
    }
}

/// Verifies images against loaded policies.
pub(crate) struct Checker {
    pub verifier: Arc<dyn ImageVerifier>,
    pub policies: Vec<Arc<CompiledPolicy>>,
    /// Time budget per image (digest resolution, then verification).
    pub timeout: Duration,
    /// Namespace of the synthetic Pod.
    pub namespace: String,
    /// `--exception` files, if any.
    pub exceptions: Option<ivory_engine::exceptions::Exceptions>,
    /// What the policies' `resource.*` / `globalContext.*` calls read (`--cluster-resources`).
    pub resources: Arc<dyn ivory_engine::resources::ResourceSource>,
    /// That namespace as the cluster holds it (labels for namespaceSelector), when known.
    pub namespace_object: Option<Value>,
}

impl Checker {
    /// Tag → digest with the credentials of the first policy that matches the image (its
    /// `allowInsecureRegistry` included), as the webhook's mutating stage resolves it; an
    /// image that is no reference is the verifier's invalid-reference error
    /// ([`ImageReport::unresolved`] words either).
    pub(crate) async fn resolve(&self, image: &str) -> Result<String, VerifyError> {
        let deadline = ivory_clock::now() + self.timeout;
        // Parsed once, where the image enters from the command line.
        let reference =
            ImageReference::parse(image).map_err(|e| VerifyError::invalid_reference(image, &e))?;
        let credentials = self
            .policies
            .iter()
            .find(|p| ivory_engine::images::matches_image(p, image).unwrap_or(false))
            .and_then(|p| p.credentials());
        self.verifier
            .resolve_digest(&reference, credentials, deadline)
            .await
    }

    /// Resolves and checks `image`.
    pub(crate) async fn check(&self, image: &str) -> ImageReport {
        match self.resolve(image).await {
            Ok(digest) => self.check_digest(image, &digest).await,
            Err(e) => ImageReport::unresolved(image, &e),
        }
    }

    /// Checks `image` whose manifest digest is `digest`.
    pub(crate) async fn check_digest(&self, image: &str, digest: &str) -> ImageReport {
        let pinned = pinned(image, digest);
        let deadline = ivory_clock::now() + self.timeout;
        let mut req = pod_request(&pinned, &self.namespace);
        let routes = wiring::Routes {
            verifier: self.verifier.as_ref(),
            resources: self.resources.as_ref(),
            policies: &self.policies,
            exceptions: self.exceptions.as_ref(),
        };
        let judged = wiring::run_routes(
            &routes,
            Stage::Validate,
            &mut req,
            self.namespace_object.as_ref(),
            deadline,
        )
        .await;
        let decision = match judged {
            Ok(decision) => decision,
            Err(e) => return ImageReport::error(image, e.to_string()),
        };
        let mut policies = Vec::new();
        for result in &decision.results {
            let attestors = match self.policy(&result.policy, result.namespace.as_deref()) {
                Some(policy) if result.status != Status::Skip => {
                    self.attestors(policy, &pinned, deadline).await
                }
                _ => Vec::new(),
            };
            policies.push(PolicyOutcome {
                policy: result.policy.clone(),
                namespace: result.namespace.clone(),
                result: result.status,
                message: result.message.clone(),
                attestors,
            });
        }
        let (verdict, message) = verdict(&decision, &policies);
        ImageReport {
            image: image.to_owned(),
            namespace: None,
            digest: Some(digest.to_owned()),
            verdict,
            policies,
            message,
        }
    }

    fn policy(&self, name: &str, namespace: Option<&str>) -> Option<&CompiledPolicy> {
        self.policies
            .iter()
            .map(Arc::as_ref)
            .find(|p| p.name == name && p.namespace.as_deref() == namespace)
    }

    async fn attestors(
        &self,
        policy: &CompiledPolicy,
        image: &str,
        deadline: Instant,
    ) -> Vec<AttestorOutcome> {
        let mut out = Vec::new();
        let reference =
            ImageReference::parse(image).map_err(|e| VerifyError::invalid_reference(image, &e));
        let questions = std::iter::once(None).chain(policy.attestations.iter().map(Some));
        let questions: Vec<_> = questions.collect();
        for compiled in &policy.attestors {
            for attestation in &questions {
                let name = compiled.attestor.name.clone();
                let attestation_name = attestation.map(|a| a.name.clone());
                if !compiled.fields.is_empty() {
                    // CEL-sourced fields depend on the request; only the engine evaluates them.
                    out.push(AttestorOutcome::plain(
                        name,
                        attestation_name,
                        AttestorResult::NotChecked,
                        "the attestor takes fields from CEL expressions; see the policy result"
                            .to_owned(),
                    ));
                    continue;
                }
                let reference = match &reference {
                    Ok(reference) => reference.clone(),
                    Err(e) => {
                        out.push(AttestorOutcome::plain(
                            name,
                            attestation_name,
                            AttestorResult::Error,
                            e.reason(),
                        ));
                        continue;
                    }
                };
                let request = VerifyRequest {
                    image: reference,
                    attestor: compiled.attestor.clone(),
                    attestation: attestation.cloned(),
                    credentials: policy.credentials().cloned(),
                    platforms: ivory_engine::verifier::PlatformScope::of_policy(
                        policy.verify_platforms,
                        None,
                    ),
                };
                let outcome = |result, reason| {
                    AttestorOutcome::plain(name.clone(), attestation_name.clone(), result, reason)
                };
                out.push(match self.verifier.verify(&request, deadline).await {
                    Ok(Verification::Verified { .. }) => {
                        outcome(AttestorResult::Verified, String::new())
                    }
                    Ok(Verification::NotVerified { reason, .. }) => AttestorOutcome {
                        brief: reason.unsearched().to_string(),
                        looked: match &reason {
                            Rejection::Searched { looked, .. } => looked.clone(),
                            _ => Vec::new(),
                        },
                        ..outcome(AttestorResult::Failed, reason.to_string())
                    },
                    Err(e) => outcome(AttestorResult::Error, e.reason()),
                });
            }
        }
        out
    }
}

/// `repo:tag` + digest → `repo:tag@digest` (unchanged when it already has a digest).
pub(crate) fn pinned(image: &str, digest: &str) -> String {
    if image.contains('@') {
        image.to_owned()
    } else {
        format!("{image}@{digest}")
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
        // Admitted as the webhook would: a PolicyException (--exception) exempts the image.
        (Verdict::Pass, skipped.message.clone())
    } else {
        (
            Verdict::Fail,
            "no policy applies to this image (matchImageReferences / matchConstraints)".to_owned(),
        )
    }
}

/// A Pod CREATE request with one container running `image`.
pub(crate) fn pod_request(image: &str, namespace: &str) -> AdmissionRequest {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ivory-verify", "namespace": namespace},
        "spec": {"containers": [{"name": "image", "image": image}]},
    });
    AdmissionRequest {
        uid: "ivory-verify".to_owned(),
        kind: ivory_engine::admission::GroupVersionKind {
            group: String::new(),
            version: "v1".to_owned(),
            kind: "Pod".to_owned(),
        },
        resource: ivory_engine::admission::GroupVersionResource::new("", "v1", "pods"),
        name: "ivory-verify".to_owned(),
        namespace: namespace.to_owned(),
        operation: ivory_engine::admission::Operation::Create,
        user_info: ivory_engine::admission::UserInfo {
            username: "ivory-cli".to_owned(),
            ..Default::default()
        },
        object: Some(pod.into()),
        ..Default::default()
    }
}

/// Flags that build an in-memory policy for ad-hoc checks (no policy file needed).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct QuickPolicy {
    /// Cosign public key (PEM): images must carry a signature by it.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Keyless: the certificate identity (subject) the signature must carry.
    #[arg(long, value_name = "IDENTITY", requires = "certificate_oidc_issuer")]
    pub certificate_identity: Option<String>,
    /// Keyless: the OIDC issuer the signing certificate must name.
    #[arg(long, value_name = "URL", requires = "certificate_identity")]
    pub certificate_oidc_issuer: Option<String>,
    /// Sigstore trusted_root.json for keyless (default: the embedded public-good root).
    #[arg(long, value_name = "FILE", requires = "certificate_identity")]
    pub trusted_root: Option<PathBuf>,
    /// Accept signatures without a transparency-log entry or SCT (cosign's
    /// --insecure-ignore-tlog / --insecure-ignore-sct), e.g. `cosign sign --tlog-upload=false`.
    #[arg(long)]
    pub insecure_ignore_tlog: bool,
    /// Transparency log the signatures' inclusion proofs come from (checked offline against
    /// the trusted root; the log is not contacted).
    #[arg(long, value_name = "URL", default_value = "https://rekor.sigstore.dev")]
    pub rekor_url: String,
}

/// Name of the policy the quick flags build.
pub(crate) const QUICK_POLICY: &str = "ivory-cli-flags";

impl QuickPolicy {
    pub(crate) fn is_set(&self) -> bool {
        self.key.is_some() || self.certificate_identity.is_some()
    }

    /// The policy document the flags describe (JSON), or `None` when no flag is set.
    pub(crate) fn document(&self) -> anyhow::Result<Option<Value>> {
        if !self.is_set() {
            return Ok(None);
        }
        let ctlog = if self.insecure_ignore_tlog {
            json!({"insecureIgnoreTlog": true, "insecureIgnoreSCT": true})
        } else {
            json!({"url": self.rekor_url})
        };
        let mut attestors = Vec::new();
        if let Some(path) = &self.key {
            let pem = std::fs::read_to_string(path)
                .with_context(|| format!("reading --key {}", path.display()))?;
            attestors
                .push(json!({"name": "key", "cosign": {"key": {"data": pem}, "ctlog": ctlog}}));
        }
        if let (Some(subject), Some(issuer)) =
            (&self.certificate_identity, &self.certificate_oidc_issuer)
        {
            let mut cosign = json!({
                "keyless": {"identities": [{"subject": subject, "issuer": issuer}]},
                "ctlog": ctlog,
            });
            if let Some(path) = &self.trusted_root {
                let root = std::fs::read_to_string(path)
                    .with_context(|| format!("reading --trusted-root {}", path.display()))?;
                cosign["trustedRoot"] = json!({"value": root});
            }
            attestors.push(json!({"name": "keyless", "cosign": cosign}));
        }
        let validations: Vec<Value> = attestors
            .iter()
            .filter_map(|a| a["name"].as_str())
            .map(|name| {
                json!({
                    "expression": format!(
                        "images.containers.map(image, verifyImageSignatures(image, [attestors.{name}])).all(e, e > 0)"
                    ),
                    "message": format!("failed the image signature verification with the --{} flags", if name == "key" { "key" } else { "certificate-identity" }),
                })
            })
            .collect();
        Ok(Some(json!({
            "apiVersion": "policies.kyverno.io/v1",
            "kind": "ImageValidatingPolicy",
            "metadata": {"name": QUICK_POLICY},
            "spec": {
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["pods"],
                }]},
                "matchImageReferences": [{"glob": "*"}],
                "attestors": attestors,
                "validations": validations,
            },
        })))
    }
}

/// `--policy` files plus the quick-flag policy; at least one is required.
pub(crate) fn policies(
    paths: &[PathBuf],
    quick: &QuickPolicy,
) -> anyhow::Result<Vec<Arc<CompiledPolicy>>> {
    let mut all = if paths.is_empty() {
        Vec::new()
    } else {
        wiring::load_policies(paths)?
    };
    if let Some(doc) = quick.document()? {
        let report = ivory_policy::load_str(&doc.to_string(), "<command-line flags>");
        all.extend(wiring::finish_load(report, "--key/--certificate-identity")?);
    }
    if all.is_empty() {
        bail!(
            "no policy: give --policy FILE, --key FILE or --certificate-identity/--certificate-oidc-issuer"
        );
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_keeps_the_tag() {
        assert_eq!(pinned("r/a:v1", "sha256:ab"), "r/a:v1@sha256:ab");
        assert_eq!(pinned("r/a@sha256:ab", "sha256:ab"), "r/a@sha256:ab");
    }

    #[test]
    fn quick_flags_compile_to_a_policy() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.pub");
        std::fs::write(
            &key,
            std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../fixtures/keys/cosign-p256.pub"
            ))
            .unwrap(),
        )
        .unwrap();
        let quick = QuickPolicy {
            key: Some(key),
            certificate_identity: Some("me@example.com".into()),
            certificate_oidc_issuer: Some("https://issuer.example".into()),
            trusted_root: None,
            insecure_ignore_tlog: false,
            rekor_url: "https://rekor.sigstore.dev".into(),
        };
        let all = policies(&[], &quick).unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].name, QUICK_POLICY);
        let names: Vec<&str> = all[0]
            .attestors
            .iter()
            .map(|a| a.attestor.name.as_str())
            .collect();
        assert_eq!(names, ["key", "keyless"]);
        assert_eq!(all[0].validations.len(), 2);
    }

    /// The `--key` policy with `failurePolicy`.
    fn key_policy(failure_policy: &str) -> Vec<Arc<CompiledPolicy>> {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.pub");
        std::fs::copy(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../fixtures/keys/cosign-p256.pub"
            ),
            &key,
        )
        .unwrap();
        let quick = QuickPolicy {
            key: Some(key),
            certificate_identity: None,
            certificate_oidc_issuer: None,
            trusted_root: None,
            insecure_ignore_tlog: false,
            rekor_url: "https://rekor.sigstore.dev".into(),
        };
        let mut doc = quick.document().unwrap().unwrap();
        doc["spec"]["failurePolicy"] = json!(failure_policy);
        let report = ivory_policy::load_str(&doc.to_string(), "test");
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        report.policies.into_iter().map(Arc::new).collect()
    }

    #[tokio::test]
    async fn the_verdict_follows_the_answers_type_not_its_text() {
        use ivory_engine::testing::{FakeVerifier, Mode};
        let image = "r.test/app:1";
        // A registry failure worded like a spent budget is still a registry failure.
        let lookalike =
            Mode::UnavailableSaying("time budget of 5ms exhausted while verifying signatures");
        let cases = [
            // (how verifications answer, failurePolicy, verdict, policy status, attestor result)
            (
                Mode::Answer,
                "Fail",
                Verdict::Fail,
                Status::Fail,
                AttestorResult::Failed,
            ),
            (
                Mode::Answer,
                "Ignore",
                Verdict::Fail,
                Status::Fail,
                AttestorResult::Failed,
            ),
            (
                Mode::Deadline,
                "Fail",
                Verdict::Error,
                Status::Error,
                AttestorResult::Error,
            ),
            // Only a spent budget goes through the failurePolicy: Ignore skips the policy.
            (
                Mode::Deadline,
                "Ignore",
                Verdict::Pass,
                Status::Skip,
                AttestorResult::Error,
            ),
            (
                lookalike,
                "Fail",
                Verdict::Error,
                Status::Error,
                AttestorResult::Error,
            ),
            (
                lookalike,
                "Ignore",
                Verdict::Error,
                Status::Error,
                AttestorResult::Error,
            ),
        ];
        for (answer, failure_policy, verdict, status, attestor) in cases {
            let case = format!("{answer:?} under {failure_policy}");
            let checker = Checker {
                verifier: Arc::new(FakeVerifier::new().verifying(answer)),
                policies: key_policy(failure_policy),
                timeout: Duration::from_secs(5),
                namespace: "default".into(),
                exceptions: None,
                resources: Arc::new(ivory_engine::resources::NoResources),
                namespace_object: None,
            };
            let report = checker.check(image).await;
            assert_eq!(report.verdict, verdict, "{case}: {report:?}");
            assert_eq!(report.policies.len(), 1, "{case}: {report:?}");
            assert_eq!(report.policies[0].result, status, "{case}: {report:?}");
            if status != Status::Skip {
                assert_eq!(
                    report.policies[0].attestors[0].result, attestor,
                    "{case}: {report:?}"
                );
            }
        }
    }

    #[test]
    fn no_policy_is_a_usage_error() {
        let none = QuickPolicy {
            key: None,
            certificate_identity: None,
            certificate_oidc_issuer: None,
            trusted_root: None,
            insecure_ignore_tlog: false,
            rekor_url: String::new(),
        };
        let err = policies(&[], &none).unwrap_err().to_string();
        assert!(err.contains("--policy"), "{err}");
    }
}
