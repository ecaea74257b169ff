//! Judging one request on every webhook route, as the API server would call ivory's webhooks:
//! the cluster route with every ImageValidatingPolicy, the namespaced route with the request
//! namespace's NamespacedImageValidatingPolicies ([`crate::matching::route_policies`]), each
//! through the one [`Pipeline`], and the answers merged (every route must allow). The
//! one-shot commands (`ivory apply`, `ivory test`) and the report of one image
//! ([`crate::report`]) judge this way; `ivory serve` gets one route per webhook call instead.

use std::sync::Arc;

use ivory_policy::compiled::CompiledPolicy;
use serde_json::Value;
use tokio::time::Instant;

use super::{Namespaces, Pipeline, Stage};
use crate::admission::AdmissionRequest;
use crate::admission::shape::ShapeError;
use crate::decision::Decision;
use crate::exceptions::Exceptions;
use crate::matching::{Route, route_policies};
use crate::resources::ResourceSource;
use crate::verifier::ImageVerifier;

/// What the engine judges a request with, on every route.
#[derive(Clone, Copy)]
pub struct Routes<'a> {
    /// Digests and signatures.
    pub verifier: &'a dyn ImageVerifier,
    /// What the policies' `resource.*` / `globalContext.*` calls read.
    pub resources: &'a dyn ResourceSource,
    /// Every loaded policy; each route selects its own.
    pub policies: &'a [Arc<CompiledPolicy>],
    /// PolicyExceptions acted on (`None`: every exception is inert).
    pub exceptions: Option<&'a Exceptions>,
}

/// Runs `stage` for `req` on each route that has policies for it and merges the answers
/// (every route must allow). Each route goes through the [`Pipeline`], as in `ivory serve`:
/// an object policies cannot read is refused with the field named, and with `exceptions` an
/// excepted policy is skipped (and pins nothing), as `ivory serve --enable-policy-exceptions`
/// does. `namespace_object` is the request namespace as the cluster holds it; `None` gives
/// the webhook's minimal form, judged as the Namespace's. There is no backstop (nobody gives
/// up waiting) and no Secret to prepare (registry credentials are the verifier's).
pub async fn run_routes(
    routes: &Routes<'_>,
    stage: Stage,
    req: &mut AdmissionRequest,
    namespace_object: Option<&Value>,
    deadline: Instant,
) -> Result<Decision, ShapeError> {
    let pipeline = Pipeline {
        exceptions: routes.exceptions,
        namespaces: Namespaces::Given(namespace_object),
        ..Pipeline::new(routes.verifier, routes.resources)
    };
    let mut merged = Decision {
        allowed: true,
        ..Decision::default()
    };
    for namespaced in [false, true] {
        let selected = route_policies(routes.policies, Route { namespaced }, req.namespace());
        if selected.is_empty() {
            continue;
        }
        let judged = pipeline.judge(stage, &selected, req, deadline).await?;
        if let Some(panic) = judged.panic {
            tracing::error!(uid = %req.uid, %panic, "policy evaluation panicked");
        }
        merge(&mut merged, Arc::unwrap_or_clone(judged.decision));
    }
    Ok(merged)
}

/// Adds one route's decision to the merged one: allowed only if both allow, messages joined
/// by `; `, everything else appended.
fn merge(into: &mut Decision, d: Decision) {
    into.allowed &= d.allowed;
    if let Some(message) = d.message {
        into.message = Some(match into.message.take() {
            Some(prev) => format!("{prev}; {message}"),
            None => message,
        });
    }
    into.warnings.extend(d.warnings);
    into.audit_annotations.extend(d.audit_annotations);
    into.patch.extend(d.patch);
    into.results.extend(d.results);
    into.budget_exhausted |= d.budget_exhausted;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_decisions_need_every_route_to_allow() {
        let mut m = Decision {
            allowed: true,
            ..Decision::default()
        };
        merge(
            &mut m,
            Decision {
                allowed: false,
                message: Some("Policy a failed: x".into()),
                ..Decision::default()
            },
        );
        merge(
            &mut m,
            Decision {
                allowed: true,
                warnings: vec!["w".into()],
                ..Decision::default()
            },
        );
        assert!(!m.allowed);
        assert_eq!(m.message.as_deref(), Some("Policy a failed: x"));
        assert_eq!(m.warnings, vec!["w".to_owned()]);
    }
}
