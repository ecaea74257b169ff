//! The admission pipeline: the one path every front end judges a request by. The webhook
//! routes (`ivory-server`'s `routes`), the background scan (`ivory-server`'s `background`) and
//! the one-shot commands (`ivory apply`, `ivory test`, and `ivory verify`/`ivory audit` through
//! [`crate::report`], all by [`run_routes`]) select policies (`crate::matching`) and then call
//! [`Pipeline::judge`], which, in order:
//!
//! 1. refuses an object whose shape policies cannot read ([`crate::admission::shape`]), so a
//!    malformed review gets the same error naming the field everywhere;
//! 2. finds `namespaceObject` ([`Namespaces`]): from a [`NamespaceSource`] within half the
//!    deadline, the caller's own object, or synthesized ([`namespace_object`]);
//! 3. sets aside the policies a PolicyException exempts ([`crate::exceptions`]);
//! 4. makes the Secrets each policy's `credentials` names available ([`CredentialSource`]);
//!    a policy whose Secrets cannot be used is not evaluated, and its failurePolicy decides;
//! 5. runs the stage ([`crate::mutate::mutate`] or [`crate::validate::validate`]) under the
//!    deadline, and, when asked, under a [`Backstop`]; a panic in it is contained and answered
//!    by the failurePolicy;
//! 6. merges the exempted policies' results into the [`Decision`].
//!
//! What differs between front ends is said by the [`Pipeline`]'s fields, never by a second
//! copy of these steps: where Namespaces come from, whether credentials and exceptions apply,
//! and whether a backstop answers for an engine that overran its deadline. What to do with
//! the decision (encode it, audit it, report it, print it) stays with the caller.

mod failure;
mod routes;
mod sources;

#[cfg(test)]
mod tests;

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use ivory_policy::compiled::CompiledPolicy;
use serde_json::Value;
use tokio::time::Instant;

use self::failure::{Unusable, backstop_decision, credentials_verdict, panic_decision};
pub use self::routes::{Routes, run_routes};
pub use self::sources::{CredentialProblem, CredentialSource, NamespaceSource, namespace_object};
use crate::admission::AdmissionRequest;
use crate::admission::shape::{ShapeError, check_shape};
use crate::decision::Decision;
use crate::exceptions::{self, Exceptions, Partition};
use crate::resources::ResourceSource;
use crate::validate::DecisionMemo;
use crate::verifier::ImageVerifier;
use crate::{mutate, validate};

/// Which of the two webhook stages runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Digest pinning ([`crate::mutate`]).
    Mutate,
    /// Verification and validations ([`crate::validate`]).
    Validate,
}

/// Where a namespaced request's `namespaceObject` comes from.
#[derive(Clone, Copy)]
pub enum Namespaces<'a> {
    /// Read from a source (the server's Namespace reflector) within half the deadline. When
    /// it cannot tell, the object is synthesized and the request marked so namespaceSelectors
    /// are left to the API server, which evaluated them already.
    Source(&'a dyn NamespaceSource),
    /// Nothing can tell a Namespace's labels (the server in file mode): synthesized, and
    /// namespaceSelectors left to the API server.
    Unknown,
    /// The caller's own object (the one-shot commands: a test's cluster resources, `ivory
    /// audit`'s cluster); `None`: the synthesized object, judged as the Namespace's.
    Given(Option<&'a Value>),
}

/// The webhook's last line: if the stage has not returned by `at` (it promises to return by
/// the deadline), the request is answered by the policies' failurePolicy anyway, before the
/// API server gives up waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backstop {
    /// When to stop waiting for the stage.
    pub at: Instant,
    /// The time budget the answer says was exhausted.
    pub budget: Duration,
}

/// What one request is judged with besides its policies.
#[derive(Clone, Copy)]
pub struct Pipeline<'a> {
    /// Digests and signatures.
    pub verifier: &'a dyn ImageVerifier,
    /// Cluster objects for the policies' `resource.*` / `globalContext.*` calls.
    pub resources: &'a dyn ResourceSource,
    /// Where `namespaceObject` comes from.
    pub namespaces: Namespaces<'a>,
    /// `None`: policies' `credentials.secrets` are not prepared (the verifier's resolver
    /// decides alone).
    pub credentials: Option<&'a dyn CredentialSource>,
    /// `None`: every PolicyException is inert.
    pub exceptions: Option<&'a Exceptions>,
    /// `None`: the stage's own deadline is the only bound.
    pub backstop: Option<Backstop>,
    /// Kept results of policies that read only their images and verification answers
    /// (`None`: every policy is evaluated afresh).
    pub memo: Option<&'a DecisionMemo>,
}

/// The pipeline's answer.
#[derive(Debug)]
pub struct Judged {
    /// What the policies decided: shared with the memo when a route's kept decision was
    /// reused (`Arc::make_mut` before changing it).
    pub decision: Arc<Decision>,
    /// The text of a panic the stage raised (the decision is then the failurePolicy's).
    pub panic: Option<String>,
}

impl<'a> Pipeline<'a> {
    /// A pipeline with synthesized Namespaces, no credentials, no exceptions and no backstop.
    pub fn new(verifier: &'a dyn ImageVerifier, resources: &'a dyn ResourceSource) -> Self {
        Self {
            verifier,
            resources,
            namespaces: Namespaces::Given(None),
            credentials: None,
            exceptions: None,
            backstop: None,
            memo: None,
        }
    }

    /// Judges `req` by `selected` (the policies, with autogen variants, the route or scan
    /// selected) in `stage`, by `deadline`. Fails only when the object cannot hold what the
    /// policies read; every other problem is a policy result or the failurePolicy's answer.
    /// `req` is marked when its Namespace's labels cannot be known.
    pub async fn judge(
        &self,
        stage: Stage,
        selected: &[&CompiledPolicy],
        req: &mut AdmissionRequest,
        deadline: Instant,
    ) -> Result<Judged, ShapeError> {
        if !selected.is_empty() {
            check_shape(req)?;
        }
        let ns_object = self.namespace_object(req, halfway(deadline)).await;
        let ns_object = ns_object.as_deref();
        let req = &*req;
        let Partition { evaluate, skipped } = match self.exceptions {
            Some(set) => set.partition(selected, req, ns_object, deadline),
            None => Partition {
                evaluate: selected.to_vec(),
                skipped: Vec::new(),
            },
        };
        let (usable, unusable) = self.usable_credentials(evaluate, deadline).await;
        let mut judged = match credentials_verdict(&unusable) {
            Some(decision) => Judged {
                decision: Arc::new(decision),
                panic: None,
            },
            None => {
                let mut judged = self
                    .run_stage(stage, &usable, req, ns_object, deadline)
                    .await;
                if !unusable.is_empty() {
                    let reasons = unusable.into_iter().map(|(_, why)| why);
                    Arc::make_mut(&mut judged.decision).warnings.extend(reasons);
                }
                judged
            }
        };
        if !skipped.is_empty() {
            exceptions::merge_into(Arc::make_mut(&mut judged.decision), skipped);
        }
        Ok(judged)
    }

    /// `namespaceObject` for a namespaced request (see [`Namespaces`]).
    async fn namespace_object(
        &self,
        req: &mut AdmissionRequest,
        deadline: Instant,
    ) -> Option<Arc<Value>> {
        let source = match self.namespaces {
            Namespaces::Given(object) => {
                return object
                    .map(|o| Arc::new(o.clone()))
                    .or_else(|| req.namespace().map(sources::shared_namespace_object));
            }
            Namespaces::Source(source) => Some(source),
            Namespaces::Unknown => None,
        };
        let name = req.namespace()?.to_owned();
        let known = match source {
            Some(source) => source.namespace(&name, deadline).await,
            None => None,
        };
        if known.is_none() {
            req.namespace_labels_unknown = true;
        }
        Some(known.map_or_else(|| sources::shared_namespace_object(&name), Arc::new))
    }

    /// Reads the Secrets every policy's `credentials` names. A policy whose Secrets cannot be
    /// used is taken out of the selection and returned with the reason: evaluating it
    /// anonymously would judge images by other credentials than the policy asked for.
    async fn usable_credentials<'p>(
        &self,
        selected: Vec<&'p CompiledPolicy>,
        deadline: Instant,
    ) -> (Vec<&'p CompiledPolicy>, Vec<Unusable<'p>>) {
        let Some(source) = self.credentials else {
            return (selected, Vec::new());
        };
        let mut unusable: Vec<Unusable<'p>> = Vec::new();
        for policy in &selected {
            let Some(credentials) = policy.credentials() else {
                continue;
            };
            if credentials.secrets.is_empty() || unusable.iter().any(|(p, _)| same(p, policy)) {
                continue;
            }
            if let Err(why) = source
                .prepare(policy.namespace.as_deref(), credentials, deadline)
                .await
            {
                let who = match &policy.namespace {
                    Some(ns) => format!("{} {ns}/{}", policy.kind.as_str(), policy.name),
                    None => format!("{} {}", policy.kind.as_str(), policy.name),
                };
                tracing::warn!(policy = %who, error = %why, "policy credentials unusable");
                unusable.push((policy, format!("ivory: {who}: {why}")));
            }
        }
        let usable = selected
            .into_iter()
            .filter(|p| !unusable.iter().any(|(u, _)| same(u, p)))
            .collect();
        (usable, unusable)
    }

    /// Runs the stage under the backstop; a panic in it is answered by the failurePolicy.
    async fn run_stage(
        &self,
        stage: Stage,
        selected: &[&CompiledPolicy],
        req: &AdmissionRequest,
        ns_object: Option<&Value>,
        deadline: Instant,
    ) -> Judged {
        let (verifier, resources, memo) = (self.verifier, self.resources, self.memo);
        let engine = async move {
            match stage {
                Stage::Mutate => Arc::new(
                    mutate::mutate(verifier, resources, selected, req, ns_object, deadline).await,
                ),
                Stage::Validate => {
                    validate::validate_memoized(
                        verifier, resources, selected, req, ns_object, deadline, memo,
                    )
                    .await
                }
            }
        };
        let bounded = async move {
            match self.backstop {
                Some(backstop) => tokio::time::timeout_at(backstop.at, engine)
                    .await
                    .unwrap_or_else(|_| Arc::new(backstop_decision(selected, backstop.budget))),
                None => engine.await,
            }
        };
        match AssertUnwindSafe(bounded).catch_unwind().await {
            Ok(decision) => Judged {
                decision,
                panic: None,
            },
            Err(panic) => Judged {
                decision: Arc::new(panic_decision(selected)),
                panic: Some(panic_text(panic.as_ref()).to_owned()),
            },
        }
    }
}

/// The same policy object (autogen variants share their parent's name and namespace).
fn same(a: &CompiledPolicy, b: &CompiledPolicy) -> bool {
    a.kind == b.kind && a.name == b.name && a.namespace == b.namespace
}

/// Halfway from now to `deadline`: what a lookup before the stage may spend.
fn halfway(deadline: Instant) -> Instant {
    let now = ivory_clock::now();
    now + deadline.saturating_duration_since(now) / 2
}

/// The text of a panic payload (`panic!` with a literal or a formatted message).
fn panic_text(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-text panic payload")
}
