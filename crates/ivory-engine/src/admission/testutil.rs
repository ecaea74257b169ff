//! Test support shared by the engine's unit tests: fixture loading and policy builders.

use std::path::PathBuf;
use std::sync::Arc;

use ivory_policy::compiled::{CompiledPolicy, ImageMatcher, NamedProgram, Origin};
use ivory_policy::types::{
    FailurePolicy, MatchResources, NamedRuleWithOperations, PolicyKind, PolicySpec,
    ValidationAction,
};

use super::{AdmissionRequest, AdmissionReview};

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
    CompiledPolicy {
        kind: PolicyKind::ImageValidatingPolicy,
        name: name.to_owned(),
        namespace: None,
        origin: Origin::default(),
        spec: Arc::new(PolicySpec::default()),
        hash: String::new(),
        actions: vec![ValidationAction::Deny],
        failure_policy: FailurePolicy::Fail,
        match_constraints: MatchResources {
            resource_rules: rules,
            ..MatchResources::default()
        },
        match_conditions: Vec::new(),
        image_matchers: Vec::new(),
        variables: Vec::new(),
        image_extractors: Vec::new(),
        validations: Vec::new(),
        audit_annotations: Vec::new(),
        attestors: Vec::new(),
        attestations: Vec::new(),
        mutate_digest: true,
        verify_digest: true,
        pinning: ivory_policy::compiled::Pinning::All,
        namespace_may_skip_pinning: false,
        required: true,
        json_mode: false,
        verify_platforms: Default::default(),
        autogen_config: None,
        autogen: Vec::new(),
        cluster_reads: Default::default(),
    }
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
