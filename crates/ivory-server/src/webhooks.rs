//! The MutatingWebhookConfiguration and ValidatingWebhookConfiguration for a policy set, built
//! the way Kyverno builds them for ImageValidatingPolicies (`docs/kyverno-semantics.md` §6), with three
//! deliberate differences:
//!
//! * cluster (`ivpol`) and namespaced (`nivpol`) policies get distinct webhook names, so a basic
//!   ivpol and a basic nivpol can never collide;
//! * mutating webhooks use `reinvocationPolicy: IfNeeded`, so images injected by later mutating
//!   webhooks (sidecars) are pinned too;
//! * `sideEffects: None` (ivory has no side effects, dry-run or not).
//!
//! A policy is *fine-grained* (its own webhook, path `/<kind>/<stage>/<name>`) when it sets
//! `webhookConfiguration.timeoutSeconds`, `matchPolicy: Exact`, a non-empty
//! `matchConstraints.namespaceSelector`, or has matchConditions the API server can evaluate;
//! all others are *basic*: grouped by (namespaceSelector, objectSelector)
//! and split by failurePolicy into `<base>-fail` / `<base>-ignore`. Whether a matchCondition is
//! API-server compatible is decided by a conservative textual check (no Kyverno libraries, no
//! `variables`, no `namespaceObject`); incompatible conditions stay inside ivory only.
//!
//! The namespaceSelector rule is ivory's own (a fourth difference): when ivory cannot know a
//! Namespace's labels (no Namespace watch, or one not readable in time) it trusts that the API
//! server evaluated the selector, which holds only if every call on a policy's path came
//! through a webhook carrying exactly that policy's selector.

pub mod static_manifests;

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use ivory_policy::types::{
    FailurePolicy, LabelSelector, LabelSelectorRequirement, NamedRuleWithOperations, PolicyKind,
};
use ivory_policy::{CRONJOBS, CompiledPolicy, DEFAULTS, autogen_rules};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// Timeout written on webhooks whose policies set none (the API server's default).
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 10;
/// Label every namespace carries with its own name.
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Where the API server sends the calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// An in-cluster Service.
    Service {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
        /// The Service port the API server calls.
        port: u16,
    },
    /// A base URL (`https://host:port`); the route path is appended.
    Url(String),
}

/// What the rendered webhook configurations point at and are called, beyond what the
/// policies decide: target Service or URL, CA bundle, names, an extra namespace selector.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the API server sends the calls.
    pub target: Target,
    /// PEM CA bundle the API server uses to verify ivory's certificate.
    pub ca_bundle_pem: Option<Vec<u8>>,
    /// Domain part of webhook names: `ivpol.validate.<domain>-fail`.
    pub domain: String,
    /// Name of the MutatingWebhookConfiguration object.
    pub mutating_name: String,
    /// Name of the ValidatingWebhookConfiguration object.
    pub validating_name: String,
    /// ANDed into every webhook's namespaceSelector (e.g. excluding `kube-system`).
    pub namespace_selector: Option<LabelSelector>,
}

impl Options {
    /// Defaults for a Service `ivory` in namespace `ivory` on port 443.
    pub fn for_service(namespace: &str, name: &str, port: u16) -> Self {
        Self {
            target: Target::Service {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                port,
            },
            ca_bundle_pem: None,
            domain: "ivory.svc".to_owned(),
            mutating_name: "ivory-resource-mutating-webhook-cfg".to_owned(),
            validating_name: "ivory-resource-validating-webhook-cfg".to_owned(),
            namespace_selector: None,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Mutate,
    Validate,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Self::Mutate => "mutate",
            Self::Validate => "validate",
        }
    }
}

/// Renders `(mutating, validating)` webhook configurations for `policies`.
pub fn generate(policies: &[CompiledPolicy], opts: &Options) -> (Value, Value) {
    let mutating = configuration(policies, opts, Stage::Mutate);
    let validating = configuration(policies, opts, Stage::Validate);
    (mutating, validating)
}

fn configuration(policies: &[CompiledPolicy], opts: &Options, stage: Stage) -> Value {
    let mut webhooks = Vec::new();
    for kind in [
        PolicyKind::ImageValidatingPolicy,
        PolicyKind::NamespacedImageValidatingPolicy,
    ] {
        let selected: Vec<&CompiledPolicy> = policies
            .iter()
            .filter(|p| p.kind == kind && p.autogen_config.is_none())
            .filter(|p| p.admission_enabled())
            // A `no-patch` policy pins nowhere: the API server need not call it to mutate.
            .filter(|p| stage == Stage::Validate || p.pins_digests())
            .collect();
        webhooks.extend(for_kind(&selected, kind, stage, opts));
    }
    webhooks.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let (kind, name) = match stage {
        Stage::Mutate => ("MutatingWebhookConfiguration", &opts.mutating_name),
        Stage::Validate => ("ValidatingWebhookConfiguration", &opts.validating_name),
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "labels": {"webhook.ivory.dev/managed-by": "ivory"},
        },
        "webhooks": webhooks,
    })
}

/// One policy's webhook-relevant facts.
struct Facts<'a> {
    policy: &'a CompiledPolicy,
    namespace_selector: Value,
    object_selector: Value,
    rules: Vec<Value>,
    conditions: Vec<Value>,
    fine_grained: bool,
}

fn for_kind(
    policies: &[&CompiledPolicy],
    kind: PolicyKind,
    stage: Stage,
    opts: &Options,
) -> Vec<Value> {
    let prefix = match kind {
        PolicyKind::ImageValidatingPolicy => "ivpol",
        PolicyKind::NamespacedImageValidatingPolicy => "nivpol",
    };
    let base = format!("{prefix}.{}.{}", stage.as_str(), opts.domain);
    let path = format!("/{prefix}/{}", stage.as_str());
    let facts: Vec<Facts<'_>> = policies.iter().map(|p| facts(p, opts)).collect();
    let mut out = Vec::new();

    // Basic policies, grouped by selectors, then split by failure policy.
    let mut groups: BTreeMap<String, Vec<&Facts<'_>>> = BTreeMap::new();
    for f in facts.iter().filter(|f| !f.fine_grained) {
        let key = json!([f.namespace_selector, f.object_selector]).to_string();
        groups.entry(key).or_default().push(f);
    }
    let many = groups.len() > 1;
    for (key, members) in &groups {
        let suffix = if many {
            format!("-{}", &hex::encode(Sha256::digest(key.as_bytes()))[..8])
        } else {
            String::new()
        };
        for failure in [FailurePolicy::Fail, FailurePolicy::Ignore] {
            let chosen: Vec<&&Facts<'_>> = members
                .iter()
                .filter(|f| f.policy.failure_policy == failure)
                .collect();
            let Some(first) = chosen.first() else {
                continue;
            };
            let names: BTreeSet<&str> = chosen.iter().map(|f| f.policy.name.as_str()).collect();
            let rules: BTreeSet<String> = chosen
                .iter()
                .flat_map(|f| f.rules.iter().map(Value::to_string))
                .collect();
            let mut hook = webhook(
                &format!("{base}-{}{suffix}", failure_str(failure)),
                &format!("{path}/{}", names.into_iter().collect::<Vec<_>>().join("/")),
                failure,
                rules
                    .iter()
                    .filter_map(|r| serde_json::from_str(r).ok())
                    .collect(),
                first,
                stage,
                opts,
            );
            hook["timeoutSeconds"] = json!(DEFAULT_TIMEOUT_SECONDS);
            out.push(hook);
        }
    }

    // Fine-grained policies: one webhook each.
    for f in facts.iter().filter(|f| f.fine_grained) {
        let p = f.policy;
        let who = match &p.namespace {
            Some(ns) => format!("{ns}-{}", p.name),
            None => p.name.clone(),
        };
        let mut hook = webhook(
            &format!("{base}-{}-finegrained-{who}", failure_str(p.failure_policy)),
            &format!("{path}/{}", p.name),
            p.failure_policy,
            f.rules.clone(),
            f,
            stage,
            opts,
        );
        hook["timeoutSeconds"] = json!(p.timeout_seconds().unwrap_or(DEFAULT_TIMEOUT_SECONDS));
        let exact = p.match_constraints.match_policy.as_deref() == Some("Exact");
        if exact && stage == Stage::Validate {
            hook["matchPolicy"] = json!("Exact");
        }
        if !f.conditions.is_empty() {
            hook["matchConditions"] = json!(f.conditions);
        }
        out.push(hook);
    }
    out
}

fn failure_str(f: FailurePolicy) -> &'static str {
    match f {
        FailurePolicy::Fail => "fail",
        FailurePolicy::Ignore => "ignore",
    }
}

fn webhook(
    name: &str,
    path: &str,
    failure: FailurePolicy,
    rules: Vec<Value>,
    facts: &Facts<'_>,
    stage: Stage,
    opts: &Options,
) -> Value {
    let mut client = match &opts.target {
        Target::Service {
            namespace,
            name,
            port,
        } => json!({"service": {"namespace": namespace, "name": name, "port": port, "path": path}}),
        Target::Url(base) => json!({"url": format!("{}{path}", base.trim_end_matches('/'))}),
    };
    if let Some(pem) = &opts.ca_bundle_pem {
        client["caBundle"] = json!(base64::engine::general_purpose::STANDARD.encode(pem));
    }
    let mut hook = json!({
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": client,
        "failurePolicy": match failure { FailurePolicy::Fail => "Fail", FailurePolicy::Ignore => "Ignore" },
        "matchPolicy": "Equivalent",
        "namespaceSelector": facts.namespace_selector,
        "objectSelector": facts.object_selector,
        "rules": rules,
        "sideEffects": "None",
    });
    if stage == Stage::Mutate {
        hook["reinvocationPolicy"] = json!("IfNeeded");
    }
    hook
}

fn facts<'a>(policy: &'a CompiledPolicy, opts: &Options) -> Facts<'a> {
    let mc = &policy.match_constraints;
    let mut ns = merge(
        mc.namespace_selector.as_ref(),
        opts.namespace_selector.as_ref(),
    );
    if let Some(namespace) = &policy.namespace {
        ns.match_expressions.push(LabelSelectorRequirement {
            key: NAME_LABEL.to_owned(),
            operator: "In".to_owned(),
            values: vec![namespace.clone()],
        });
    }
    let mut rules: Vec<NamedRuleWithOperations> = mc.resource_rules.clone();
    rules.extend(autogen_rules(policy));
    let rules: BTreeSet<String> = rules.iter().map(|r| rule_json(r).to_string()).collect();
    let conditions = conditions(policy);
    let own_namespace_selector = mc
        .namespace_selector
        .as_ref()
        .is_some_and(|s| !s.match_labels.is_empty() || !s.match_expressions.is_empty());
    let fine_grained = policy.timeout_seconds().is_some()
        || mc.match_policy.as_deref() == Some("Exact")
        || own_namespace_selector
        || !conditions.is_empty();
    Facts {
        policy,
        namespace_selector: selector_json(&ns),
        object_selector: selector_json(&mc.object_selector.clone().unwrap_or_default()),
        rules: rules
            .iter()
            .filter_map(|r| serde_json::from_str(r).ok())
            .collect(),
        conditions,
        fine_grained,
    }
}

/// AND of two selectors: labels unioned, expressions concatenated.
fn merge(a: Option<&LabelSelector>, b: Option<&LabelSelector>) -> LabelSelector {
    let mut out = a.cloned().unwrap_or_default();
    if let Some(b) = b {
        out.match_labels
            .extend(b.match_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        out.match_expressions
            .extend(b.match_expressions.iter().cloned());
    }
    out
}

fn selector_json(s: &LabelSelector) -> Value {
    serde_json::to_value(s).unwrap_or_else(|_| json!({}))
}

/// `RuleWithOperations` (resourceNames dropped, scope defaulted to `*`).
fn rule_json(r: &NamedRuleWithOperations) -> Value {
    json!({
        "apiGroups": r.api_groups,
        "apiVersions": r.api_versions,
        "operations": r.operations,
        "resources": r.resources,
        "scope": r.scope.as_deref().unwrap_or("*"),
    })
}

/// Identifiers only ivory (not the API server's matchConditions environment) knows.
const IVORY_ONLY: [&str; 9] = [
    "namespaceObject",
    "variables",
    "images",
    "image(",
    "resource.",
    "http.",
    "globalContext",
    "imagedata",
    "parseImageReference",
];

fn compatible(expression: &str) -> bool {
    !IVORY_ONLY.iter().any(|t| expression.contains(t))
}

/// matchConditions to offload to the API server (empty when any is not compatible).
fn conditions(policy: &CompiledPolicy) -> Vec<Value> {
    let own = policy.written_match_conditions();
    if own.is_empty() || !own.iter().all(|c| compatible(&c.expression)) {
        return Vec::new();
    }
    if !policy.autogen_eligible() || policy.autogen.is_empty() {
        return own
            .iter()
            .map(|c| json!({"name": c.name, "expression": c.expression}))
            .collect();
    }
    let pod = "(object.apiVersion == 'v1' && object.kind =='Pod')";
    let mut out: Vec<Value> = own
        .iter()
        .map(|c| {
            json!({"name": format!("autogen-{}", c.name),
                   "expression": format!("!({pod}) || ({})", c.expression)})
        })
        .collect();
    for config in [CRONJOBS, DEFAULTS] {
        let Some(variant) = policy
            .autogen
            .iter()
            .find(|v| v.autogen_config.as_deref() == Some(config))
        else {
            continue;
        };
        let kinds: Vec<String> = variant
            .match_constraints
            .resource_rules
            .iter()
            .flat_map(|r| {
                let group = r.api_groups.first().cloned().unwrap_or_default();
                r.resources.iter().filter_map(move |res| {
                    controller_kind(res).map(|k| {
                        format!("(object.apiVersion == '{group}/v1' && object.kind =='{k}')")
                    })
                })
            })
            .collect();
        for c in variant.written_match_conditions() {
            out.push(json!({
                "name": format!("autogen-{config}-{}", c.name),
                "expression": format!("!({}) || ({})", kinds.join(" || "), c.expression),
            }));
        }
    }
    out
}

fn controller_kind(resource: &str) -> Option<&'static str> {
    Some(match resource {
        "daemonsets" => "DaemonSet",
        "deployments" => "Deployment",
        "replicasets" => "ReplicaSet",
        "statefulsets" => "StatefulSet",
        "jobs" => "Job",
        "cronjobs" => "CronJob",
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
