//! Test support shared by the engine's unit tests: fixture loading and policy builders.

use std::path::PathBuf;

use ivory_policy::compiled::{CompiledPolicy, ImageMatcher, NamedProgram};
use ivory_policy::types::{MatchResources, NamedRuleWithOperations, PolicyKind};

use super::{AdmissionRequest, AdmissionResponse, AdmissionReview, ReviewResponse};

/// Path of `fixtures/admission/<name>` in the workspace.
pub(crate) fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/admission")
        .join(name)
}

/// The parsed request of `fixtures/admission/<name>`.
pub(crate) fn request(name: &str) -> AdmissionRequest {
    let path = fixture_path(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    AdmissionReview::parse(&bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .request
}

/// The AdmissionReview the server sends for `resp` (the text of [`ReviewResponse::to_json`]),
/// read back as JSON, once that text is checked to be what serde writes of the same review.
pub(crate) fn sent(resp: &AdmissionResponse) -> serde_json::Value {
    let review = ReviewResponse::new(resp);
    let text = review.to_json();
    assert_eq!(text, serde_json::to_string(&review).unwrap());
    serde_json::from_str(&text).unwrap()
}

/// A rule over `resources` of `group`/`version` for `operations`.
pub(crate) fn rule(
    operations: &[&str],
    groups: &[&str],
    versions: &[&str],
    resources: &[&str],
) -> NamedRuleWithOperations {
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
    NamedRuleWithOperations {
        operations: owned(operations),
        api_groups: owned(groups),
        api_versions: owned(versions),
        resources: owned(resources),
        ..NamedRuleWithOperations::default()
    }
}

/// The usual pod rule: CREATE/UPDATE of core v1 pods.
pub(crate) fn pod_rule() -> NamedRuleWithOperations {
    rule(&["CREATE", "UPDATE"], &[""], &["v1"], &["pods"])
}

/// A cluster policy named `name` matching `rules`, Deny, failurePolicy Fail, mutateDigest on,
/// every image.
pub(crate) fn policy(name: &str, rules: Vec<NamedRuleWithOperations>) -> CompiledPolicy {
    let mut policy = CompiledPolicy::new(PolicyKind::ImageValidatingPolicy, name);
    policy.match_constraints = MatchResources {
        resource_rules: rules,
        ..MatchResources::default()
    };
    policy
}

/// A gobwas-style glob matcher (`*` crosses `/`), as ivory-policy compiles them.
pub(crate) fn glob(pattern: &str) -> ImageMatcher {
    let matcher = globset::GlobBuilder::new(pattern)
        .literal_separator(false)
        .build()
        .unwrap()
        .compile_matcher();
    ImageMatcher::Glob {
        pattern: pattern.to_owned(),
        matcher,
    }
}

/// A CEL program over the given variables.
pub(crate) fn cel(expr: &str, vars: &[&str]) -> ivory_cel::Program {
    ivory_cel::compile(expr, &ivory_cel::Scope::new(vars.iter().copied()))
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
}

/// A named matchCondition over the four admission variables.
pub(crate) fn condition(name: &str, expr: &str) -> NamedProgram {
    NamedProgram {
        name: name.to_owned(),
        program: cel(expr, &["object", "oldObject", "request", "namespaceObject"]),
    }
}
