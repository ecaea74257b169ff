//! [`ImageChecker`]: resolve, judge, and ask each attestor (see [`crate::report`]).

use std::sync::Arc;
use std::time::Duration;

use ivory_policy::CompiledPolicy;
use serde_json::Value;
use tokio::time::Instant;

use super::{
    AttestorOutcome, AttestorResult, ImageReport, PolicyOutcome, pinned, pod_request, verdict,
};
use crate::decision::Status;
use crate::exceptions::Exceptions;
use crate::images::matches_image;
use crate::pipeline::{Routes, Stage, run_routes};
use crate::resources::ResourceSource;
use crate::verifier::{
    ImageReference, ImageVerifier, PlatformScope, Rejection, Verification, VerifyError,
    VerifyRequest,
};

/// Checks images against loaded policies (one image at a time; share it behind an `Arc` to
/// check several at once).
pub struct ImageChecker {
    /// Digests and signatures.
    pub verifier: Arc<dyn ImageVerifier>,
    /// Every loaded policy.
    pub policies: Vec<Arc<CompiledPolicy>>,
    /// Time budget per image (digest resolution, then verification).
    pub timeout: Duration,
    /// Namespace of the synthetic Pod.
    pub namespace: String,
    /// PolicyExceptions acted on, if any.
    pub exceptions: Option<Exceptions>,
    /// What the policies' `resource.*` / `globalContext.*` calls read.
    pub resources: Arc<dyn ResourceSource>,
    /// That namespace as the cluster holds it (labels for namespaceSelector), when known.
    pub namespace_object: Option<Value>,
}

impl ImageChecker {
    /// Tag → digest with the credentials of the first policy that matches the image (its
    /// `allowInsecureRegistry` included), as the webhook's mutating stage resolves it; an
    /// image that is no reference is the verifier's invalid-reference error
    /// ([`ImageReport::unresolved`] words either).
    pub async fn resolve(&self, image: &str) -> Result<String, VerifyError> {
        let deadline = ivory_clock::now() + self.timeout;
        // Parsed once, where the image enters from the command line.
        let reference =
            ImageReference::parse(image).map_err(|e| VerifyError::invalid_reference(image, &e))?;
        let credentials = self
            .policies
            .iter()
            .find(|p| matches_image(p, image).unwrap_or(false))
            .and_then(|p| p.credentials());
        self.verifier
            .resolve_digest(&reference, credentials, deadline)
            .await
    }

    /// Resolves and checks `image`.
    pub async fn check(&self, image: &str) -> ImageReport {
        match self.resolve(image).await {
            Ok(digest) => self.check_digest(image, &digest).await,
            Err(e) => ImageReport::unresolved(image, &e),
        }
    }

    /// Checks `image` whose manifest digest is `digest`.
    pub async fn check_digest(&self, image: &str, digest: &str) -> ImageReport {
        let pinned = pinned(image, digest);
        let deadline = ivory_clock::now() + self.timeout;
        let mut req = pod_request(&pinned, &self.namespace);
        let routes = Routes {
            verifier: self.verifier.as_ref(),
            resources: self.resources.as_ref(),
            policies: &self.policies,
            exceptions: self.exceptions.as_ref(),
        };
        let judged = run_routes(
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

    /// The loaded policy a result names.
    fn policy(&self, name: &str, namespace: Option<&str>) -> Option<&CompiledPolicy> {
        self.policies
            .iter()
            .map(Arc::as_ref)
            .find(|p| p.name == name && p.namespace.as_deref() == namespace)
    }

    /// Every attestor of `policy` asked about the signature and each attestation of `image`,
    /// with the policy's credentials and platform scope.
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
                    platforms: PlatformScope::of_policy(policy.verify_platforms, None),
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
