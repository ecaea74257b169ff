//! Which policies apply to a request: route selection, `matchConstraints` (the
//! ValidatingAdmissionPolicy rules of k8s.io/apiserver `policy/matching` and `webhook/predicates`),
//! label selectors and `matchConditions`.

use std::collections::BTreeMap;
use std::sync::Arc;

use ivory_cel::{Activation, NoHost};
use ivory_plumbing::keyed::{KeyedMap, keyed_state};
use ivory_policy::compiled::CompiledPolicy;
use ivory_policy::types::{
    FailurePolicy, LabelSelector, MatchResources, NamedRuleWithOperations, PolicyKind,
};
use serde_json::Value;
use thiserror::Error;
use tokio::time::Instant;

use crate::admission::object::object_labels;
use crate::admission::{AdmissionRequest, AdmittedObject, GroupVersionResource, Operation};
use crate::bindings::RequestBindings;

/// Why matching could not decide.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MatchError {
    /// A label selector of the policy does not parse.
    #[error("invalid {field}: {message}")]
    InvalidSelector {
        /// The selector's field path in the policy.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The request's Namespace object is needed for a namespaceSelector and cannot be had.
    #[error(
        "namespace {namespace:?} is unknown, cannot evaluate spec.matchConstraints.namespaceSelector"
    )]
    NamespaceUnavailable {
        /// The request's namespace.
        namespace: String,
    },
    /// A matchCondition's CEL expression failed (its failurePolicy decides what follows).
    #[error("matchCondition {name:?} failed to evaluate: {message}")]
    Condition {
        /// The matchCondition's name.
        name: String,
        /// The CEL error.
        message: String,
    },
    /// A `matchImageReferences` expression failed on an image.
    #[error("matchImageReferences[{index}] failed to evaluate for image {image}: {message}")]
    ImageReference {
        /// Position of the entry in `matchImageReferences`.
        index: usize,
        /// The image it was evaluated on.
        image: String,
        /// The CEL error.
        message: String,
    },
}

/// `Result` with [`MatchError`].
pub type Result<T, E = MatchError> = std::result::Result<T, E>;

/// Which webhook path a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// `/nivpol/...` (NamespacedImageValidatingPolicy) rather than `/ivpol/...`.
    pub namespaced: bool,
}

/// Policy names from the webhook path that no loaded policy of the route's kind carries.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown {kind} policies: {}", names.join(", "))]
pub struct UnknownPolicies {
    /// The route's policy kind.
    pub kind: &'static str,
    /// The names no loaded policy carries.
    pub names: Vec<String>,
}

/// Picks the policies a route names, each followed by its autogen variants.
///
/// The cluster route takes `ImageValidatingPolicy` objects by name; the namespaced route takes
/// `NamespacedImageValidatingPolicy` objects by name whose namespace is the request's (a name
/// that exists only in other namespaces is known but not selected). Policies with
/// `evaluation.admission.enabled: false` are never selected. Names that match no policy of the
/// route's kind at all are reported so the caller can answer explicitly instead of silently
/// allowing.
pub fn select_policies<'a>(
    all: &'a [Arc<CompiledPolicy>],
    route: Route,
    names: &[String],
    request_namespace: Option<&str>,
) -> Result<Vec<&'a CompiledPolicy>, UnknownPolicies> {
    let kind = if route.namespaced {
        PolicyKind::NamespacedImageValidatingPolicy
    } else {
        PolicyKind::ImageValidatingPolicy
    };
    let names = NameIndex::new(names);
    let unique = names.unique();
    let mut found: Vec<(bool, Vec<&'a CompiledPolicy>)> = vec![(false, Vec::new()); unique.len()];
    for policy in all.iter().map(Arc::as_ref) {
        let slot = names
            .position(policy.name.as_str())
            .filter(|_| policy.kind == kind)
            .and_then(|i| found.get_mut(i));
        let Some((known, policies)) = slot else {
            continue;
        };
        *known = true;
        let in_scope = !route.namespaced || policy.namespace.as_deref() == request_namespace;
        if in_scope && policy.admission_enabled() {
            policies.push(policy);
            policies.extend(policy.autogen.iter());
        }
    }
    let mut unknown: Vec<String> = Vec::new();
    let mut selected: Vec<&'a CompiledPolicy> = Vec::new();
    for (name, (known, policies)) in unique.iter().zip(found) {
        if known {
            selected.extend(policies);
        } else {
            unknown.push((*name).to_owned());
        }
    }
    if unknown.is_empty() {
        Ok(selected)
    } else {
        Err(UnknownPolicies {
            kind: kind.as_str(),
            names: unknown,
        })
    }
}

/// A path's policy names without repeats, in order, and where each is among them. One pass
/// over the names and one over the policies: a path naming many policies must not compare every
/// name with every policy (BENCHMARKS.md, "Cost curves"); a path naming a few (the usual
/// webhook) compares them directly, cheaper than building and hashing into a keyed map.
enum NameIndex<'n> {
    Few(Vec<&'n str>),
    Many {
        unique: Vec<&'n str>,
        position: KeyedMap<&'n str, usize>,
    },
}

/// Up to this many names are looked up by comparing them all.
const FEW_NAMES: usize = 8;

impl<'n> NameIndex<'n> {
    fn new(names: &'n [String]) -> Self {
        let mut unique: Vec<&str> = Vec::with_capacity(names.len());
        if names.len() <= FEW_NAMES {
            for name in names {
                if !unique.contains(&name.as_str()) {
                    unique.push(name);
                }
            }
            return Self::Few(unique);
        }
        let mut position = KeyedMap::with_capacity_and_hasher(names.len(), keyed_state());
        for name in names {
            if !position.contains_key(name.as_str()) {
                position.insert(name.as_str(), unique.len());
                unique.push(name);
            }
        }
        Self::Many { unique, position }
    }

    fn unique(&self) -> &[&'n str] {
        match self {
            Self::Few(unique) | Self::Many { unique, .. } => unique,
        }
    }

    fn position(&self, name: &str) -> Option<usize> {
        match self {
            Self::Few(unique) => unique.iter().position(|n| *n == name),
            Self::Many { position, .. } => position.get(name).copied(),
        }
    }
}

/// Every policy a route's webhooks would name, as [`select_policies`] selects them: what the
/// one-shot commands judge a request by, as if `ivory webhooks` had registered every loaded
/// policy.
pub fn route_policies<'a>(
    all: &'a [Arc<CompiledPolicy>],
    route: Route,
    request_namespace: Option<&str>,
) -> Vec<&'a CompiledPolicy> {
    let kind = if route.namespaced {
        PolicyKind::NamespacedImageValidatingPolicy
    } else {
        PolicyKind::ImageValidatingPolicy
    };
    let names: Vec<String> = all
        .iter()
        .filter(|p| {
            p.kind == kind && (!route.namespaced || p.namespace.as_deref() == request_namespace)
        })
        .map(|p| p.name.clone())
        .collect();
    // Every name comes from `all`, so none can be unknown.
    select_policies(all, route, &names, request_namespace).unwrap_or_default()
}

/// Evaluates `spec.matchConstraints` like the API server does for a ValidatingAdmissionPolicy:
/// namespaceSelector, objectSelector, excludeResourceRules, then resourceRules.
///
/// `namespace_object` is the request namespace's Namespace object; it is only needed when the
/// request is namespaced and the policy has a non-empty namespaceSelector.
pub fn matches_constraints(
    policy: &CompiledPolicy,
    req: &AdmissionRequest,
    namespace_object: Option<&Value>,
) -> Result<bool> {
    let constraints = &policy.match_constraints;
    if !namespace_selector_matches(constraints, req, namespace_object)? {
        return Ok(false);
    }
    if !object_selector_matches(constraints, req)? {
        return Ok(false);
    }
    let exact = constraints.match_policy.as_deref() == Some("Exact");
    if rules_match(&constraints.exclude_resource_rules, req, exact) {
        return Ok(false);
    }
    // An empty rule list matches everything (policy admission rejects it anyway).
    Ok(constraints.resource_rules.is_empty()
        || rules_match(&constraints.resource_rules, req, exact))
}

const NAMESPACES: &str = "namespaces";

fn is_namespace_request(req: &AdmissionRequest) -> bool {
    req.resource.group.is_empty() && req.resource.resource == NAMESPACES
}

fn namespace_selector_matches(
    constraints: &MatchResources,
    req: &AdmissionRequest,
    namespace_object: Option<&Value>,
) -> Result<bool> {
    let Some(selector) = constraints.namespace_selector.as_ref() else {
        return Ok(true);
    };
    let namespace_request = is_namespace_request(req);
    // Cluster-scoped requests other than Namespaces are never excluded (k8s semantics).
    if req.namespace().is_none() && !namespace_request {
        return Ok(true);
    }
    if selector_is_empty(selector) {
        return Ok(true);
    }
    let labels = if namespace_request && req.sub_resource().is_empty() {
        // A Namespace being created or updated is judged by its own (new) labels; on DELETE
        // the object being deleted is the current state.
        req.subject()
            .map(AdmittedObject::labels)
            .unwrap_or_default()
    } else if req.namespace_labels_unknown {
        // The API server only called this policy's webhook because its namespaceSelector,
        // which that webhook carries, matched the labels ivory cannot see.
        return Ok(true);
    } else {
        match namespace_object {
            Some(ns) => object_labels(Some(ns)),
            None => {
                return Err(MatchError::NamespaceUnavailable {
                    namespace: req.namespace.clone(),
                });
            }
        }
    };
    selector_matches(selector, &labels, "spec.matchConstraints.namespaceSelector")
}

fn object_selector_matches(constraints: &MatchResources, req: &AdmissionRequest) -> Result<bool> {
    let Some(selector) = constraints.object_selector.as_ref() else {
        return Ok(true);
    };
    if selector_is_empty(selector) {
        return Ok(true);
    }
    const FIELD: &str = "spec.matchConstraints.objectSelector";
    // Either the new or the old object may carry the labels (k8s matches both).
    for object in [req.object.as_ref(), req.old_object.as_ref()]
        .into_iter()
        .flatten()
    {
        if selector_matches(selector, &object.labels(), FIELD)? {
            return Ok(true);
        }
    }
    // Still surface a malformed selector even when there is nothing to match it against.
    selector_matches(selector, &BTreeMap::new(), FIELD)?;
    Ok(false)
}

fn selector_is_empty(selector: &LabelSelector) -> bool {
    selector.match_labels.is_empty() && selector.match_expressions.is_empty()
}

/// Evaluates a Kubernetes label selector (`matchLabels` AND every `matchExpressions` entry).
/// An empty selector matches everything. Malformed requirements (unknown operator, values on
/// `Exists`, no values on `In`) are errors naming `field`.
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
    field: &str,
) -> Result<bool> {
    let invalid = |message: String| MatchError::InvalidSelector {
        field: field.to_owned(),
        message,
    };
    let mut matched = selector
        .match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v));
    for (i, req) in selector.match_expressions.iter().enumerate() {
        let value = labels.get(&req.key);
        let ok = match req.operator.as_str() {
            "In" | "NotIn" => {
                if req.values.is_empty() {
                    return Err(invalid(format!(
                        "matchExpressions[{i}]: values must be non-empty for operator {}",
                        req.operator
                    )));
                }
                let contained = value.is_some_and(|v| req.values.contains(v));
                if req.operator == "In" {
                    contained
                } else {
                    !contained
                }
            }
            "Exists" | "DoesNotExist" => {
                if !req.values.is_empty() {
                    return Err(invalid(format!(
                        "matchExpressions[{i}]: values must be empty for operator {}",
                        req.operator
                    )));
                }
                (req.operator == "Exists") == value.is_some()
            }
            other => {
                return Err(invalid(format!(
                    "matchExpressions[{i}]: unknown operator {other:?}"
                )));
            }
        };
        matched &= ok;
    }
    Ok(matched)
}

/// The resource/kind/sub-resource a rule is compared against.
struct Target<'r> {
    resource: &'r GroupVersionResource,
    sub_resource: &'r str,
}

/// With `Exact` only the resource the client addressed counts; with `Equivalent` (the default)
/// the resource the API server converted the request to (what the webhook matched) counts too,
/// e.g. `apps/v1` for a request made against `apps/v1beta1`.
/// One or two targets, without a heap allocation: rules are matched several times per
/// admission.
fn targets(req: &AdmissionRequest, exact: bool) -> impl Iterator<Item = Target<'_>> {
    let original = Target {
        resource: req.original_resource(),
        sub_resource: req
            .request_sub_resource
            .as_deref()
            .unwrap_or(req.sub_resource()),
    };
    if exact {
        return std::iter::once(original).chain(None);
    }
    let converted = Target {
        resource: &req.resource,
        sub_resource: req.sub_resource(),
    };
    let (a, b) = (converted.resource, original.resource);
    let unchanged = same(&a.group, &b.group)
        && same(&a.version, &b.version)
        && same(&a.resource, &b.resource)
        && same(converted.sub_resource, original.sub_resource);
    let second = (!unchanged).then_some(original);
    std::iter::once(converted).chain(second)
}

fn rules_match(rules: &[NamedRuleWithOperations], req: &AdmissionRequest, exact: bool) -> bool {
    targets(req, exact).any(|t| rules.iter().any(|rule| rule_matches(rule, req, &t)))
}

fn rule_matches(rule: &NamedRuleWithOperations, req: &AdmissionRequest, t: &Target<'_>) -> bool {
    scope_matches(rule.scope.as_deref(), req, t.resource)
        && operation_matches(&rule.operations, req.operation)
        && exact_or_wildcard(&rule.api_groups, &t.resource.group)
        && exact_or_wildcard(&rule.api_versions, &t.resource.version)
        && resource_matches(&rule.resources, &t.resource.resource, t.sub_resource)
        && (rule.resource_names.is_empty() || rule.resource_names.contains(&req.name))
}

fn exact_or_wildcard(items: &[String], requested: &str) -> bool {
    items.iter().any(|i| i == "*" || same(i, requested))
}

fn operation_matches(ops: &[String], op: Operation) -> bool {
    ops.iter().any(|o| o == "*" || same(o, op.as_str()))
}

/// `pods` matches only the main resource, `pods/ephemeralcontainers` only that sub-resource,
/// `*/scale` every scale sub-resource, `*/*` everything; as in k8s, `pods/*` also matches the
/// main `pods` resource (an empty sub-resource satisfies `*`).
fn resource_matches(resources: &[String], resource: &str, sub_resource: &str) -> bool {
    resources.iter().any(|r| {
        let (res, sub) = r.split_once('/').unwrap_or((r.as_str(), ""));
        (res == "*" || same(res, resource)) && (sub == "*" || same(sub, sub_resource))
    })
}

/// `a == b` without a call to libc's `memcmp`: these are a few bytes long and compared many
/// times per admission, where that call (glibc's AVX-512 variant) cost more than the compare
/// (BENCHMARKS.md, issue 27's second round). The loop does not stop at the first difference,
/// so the compiler does not turn it back into that call.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(true, |equal, (x, y)| equal & (x == y))
}

fn scope_matches(
    scope: Option<&str>,
    req: &AdmissionRequest,
    resource: &GroupVersionResource,
) -> bool {
    let namespace_object = resource.group.is_empty() && resource.resource == NAMESPACES;
    match scope {
        None | Some("*") => true,
        // Namespace objects are cluster-scoped even though their requests carry a namespace.
        Some("Namespaced") => !namespace_object && req.namespace().is_some(),
        Some("Cluster") => namespace_object || req.namespace().is_none(),
        Some(_) => false,
    }
}

/// Evaluates `spec.matchConditions` (all must be true) with `object`, `oldObject`, `request` and
/// `namespaceObject` bound. An evaluation error makes the policy not match under
/// `failurePolicy: Ignore` and is returned under `Fail`. Evaluation stops at `deadline`.
pub fn matches_conditions(
    policy: &CompiledPolicy,
    req: &AdmissionRequest,
    namespace_object: Option<&Value>,
    deadline: Instant,
) -> Result<bool> {
    matches_conditions_with(policy, req, namespace_object, deadline, &NoHost)
}

/// [`matches_conditions`], with the policy's cluster reads (`resource.*`) answered by `host`.
pub(crate) fn matches_conditions_with(
    policy: &CompiledPolicy,
    req: &AdmissionRequest,
    namespace_object: Option<&Value>,
    deadline: Instant,
    host: &dyn ivory_cel::Host,
) -> Result<bool> {
    if policy.match_conditions.is_empty() {
        return Ok(true);
    }
    let bindings =
        RequestBindings::new(req, req.object.as_ref(), namespace_object).with_deadline(deadline);
    let mut act = Activation::new(host);
    bindings.bind(&mut act, false);
    for condition in &policy.match_conditions {
        match condition.program.evaluate_bool(&act) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => {
                return match policy.failure_policy {
                    FailurePolicy::Ignore => Ok(false),
                    FailurePolicy::Fail => Err(MatchError::Condition {
                        name: condition.name.clone(),
                        message: e.to_string(),
                    }),
                };
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests;
