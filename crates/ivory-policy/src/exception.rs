//! Kyverno's CEL `PolicyException` (`policies.kyverno.io` v1alpha1/v1beta1/v1): which image
//! validating policies it names (`spec.policyRefs`, by name and kind) and the CEL conditions
//! under which a request is exempt (`spec.matchConditions`, all must hold).
//!
//! `spec.expiresAt` retires an exception (checked at every request, as Kyverno does when it
//! lists them). `spec.images` and `spec.allowedValues` (fine-grained exceptions of
//! ValidatingPolicies) are refused at load: Kyverno's image validating engine ignores them and
//! exempts the whole policy, so such an exception would exempt more than it says. `properties`,
//! `evaluationMode` and `reportResult` are metadata for image validating policies (Kyverno
//! reports their exceptions as `skip` whatever `reportResult` says); any other field is refused.

use std::collections::BTreeMap;
use std::time::SystemTime;

use ivory_cel::{Program, Scope};
use serde::Deserialize;
use serde_json::Value;

use crate::compiled::{NamedProgram, Origin};
use crate::error::{PolicyError, location};
use crate::types::{API_GROUP, API_VERSIONS, NamedExpression, PolicyKind};

/// The kind name of an exception object.
pub const EXCEPTION_KIND: &str = "PolicyException";

/// Variables an exception's matchConditions may read (as a policy's matchConditions).
const EXCEPTION_VARS: [&str; 4] = ["object", "oldObject", "request", "namespaceObject"];

/// One `spec.policyRefs[]` entry that names an image validating policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRef {
    /// `policyRefs[].kind`: which of the two policy kinds is exempted.
    pub kind: PolicyKind,
    /// `policyRefs[].name`: the policy's `metadata.name`.
    pub name: String,
}

/// A loaded exception, its conditions compiled.
#[derive(Clone, Debug)]
pub struct CompiledException {
    /// `metadata.name`; with the namespace, what skip messages name.
    pub name: String,
    /// Exceptions are namespaced objects; files may leave the namespace out (`default` is
    /// assumed, as kubectl would).
    pub namespace: String,
    /// The image validating policies it names; refs to other Kyverno policy kinds are kept
    /// out (they belong to other engines).
    pub policy_refs: Vec<PolicyRef>,
    /// `spec.matchConditions`: all must hold for a request to be exempt.
    pub match_conditions: Vec<NamedProgram>,
    /// `spec.expiresAt`: from then on the exception no longer applies.
    pub expires_at: Option<SystemTime>,
    /// The file and document it was loaded from.
    pub origin: Origin,
}

impl CompiledException {
    /// `<namespace>/<name>`, the key Kyverno names an exception by in its skip message.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// True once `spec.expiresAt` has passed at `now`.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }

    /// True when `spec.policyRefs` names the policy `name` of `kind`.
    pub fn refers_to(&self, kind: PolicyKind, name: &str) -> bool {
        self.policy_refs
            .iter()
            .any(|r| r.kind == kind && r.name == name)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExceptionDocument {
    api_version: String,
    #[serde(default)]
    metadata: ExceptionMeta,
    spec: ExceptionSpec,
}

#[derive(Default, Deserialize)]
struct ExceptionMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ExceptionSpec {
    #[serde(default)]
    policy_refs: Vec<RawPolicyRef>,
    #[serde(default)]
    match_conditions: Vec<NamedExpression>,
    #[serde(default)]
    images: Vec<String>,
    #[serde(default)]
    allowed_values: Vec<String>,
    #[serde(default)]
    expires_at: Option<String>,
    #[serde(default)]
    report_result: Option<String>,
    #[serde(default)]
    evaluation_mode: Option<String>,
    #[serde(default)]
    properties: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicyRef {
    #[serde(default)]
    name: String,
    #[serde(default)]
    kind: String,
}

/// True for an object whose `apiVersion` group and `kind` make it a CEL PolicyException.
pub fn is_exception(api_version: &str, kind: &str) -> bool {
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    group == API_GROUP && kind == EXCEPTION_KIND
}

/// Deserializes, checks and compiles one exception object. Every problem is returned, each
/// naming its field.
pub fn compile_exception(
    value: Value,
    origin: &Origin,
) -> Result<CompiledException, Vec<PolicyError>> {
    let label = format!(
        "{EXCEPTION_KIND}/{}",
        value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    );
    let loc = location(origin, &label);
    let error = |field: &str, reason: String| PolicyError::new(&loc, field, reason);
    if value.get("spec").is_none_or(Value::is_null) {
        return Err(vec![error("spec", "Required value".to_owned())]);
    }
    let doc: ExceptionDocument = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        vec![error(&field, e.into_inner().to_string())]
    })?;
    let mut errors = Vec::new();
    let versions: Vec<String> = API_VERSIONS
        .iter()
        .map(|v| format!("{API_GROUP}/{v}"))
        .collect();
    if !versions.contains(&doc.api_version) {
        errors.push(error(
            "apiVersion",
            format!(
                "Unsupported value: {:?}: supported values: {}",
                doc.api_version,
                versions.join(", ")
            ),
        ));
    }
    if doc.metadata.name.is_empty() {
        errors.push(error("metadata.name", "Required value".to_owned()));
    }
    if doc.spec.policy_refs.is_empty() {
        errors.push(error("spec.policyRefs", "Required value".to_owned()));
    }
    for (field, list) in [
        ("spec.images", &doc.spec.images),
        ("spec.allowedValues", &doc.spec.allowed_values),
    ] {
        if !list.is_empty() {
            errors.push(error(
                field,
                "Forbidden: not supported for image validating policies (the exception would exempt more than it says)".to_owned(),
            ));
        }
    }
    if let Some(result) = doc.spec.report_result.as_deref()
        && !matches!(result, "skip" | "pass")
    {
        errors.push(error(
            "spec.reportResult",
            format!("Unsupported value: {result:?}: supported values: \"skip\", \"pass\""),
        ));
    }
    // Read so that the metadata fields are part of the accepted shape.
    let _ = (&doc.spec.evaluation_mode, &doc.spec.properties);
    let expires_at = match doc.spec.expires_at.as_deref().map(parse_time).transpose() {
        Ok(at) => at,
        Err(reason) => {
            errors.push(error("spec.expiresAt", reason.to_string()));
            None
        }
    };
    let mut policy_refs = Vec::new();
    for (i, r) in doc.spec.policy_refs.iter().enumerate() {
        if r.name.is_empty() {
            errors.push(error(
                &format!("spec.policyRefs[{i}].name"),
                "Required value".to_owned(),
            ));
        }
        // The pre-release alias does not count: Kyverno compares the kind string exactly.
        if let Some(kind) =
            PolicyKind::from_kind(&r.kind).filter(|_| r.kind != "ImageVerificationPolicy")
        {
            policy_refs.push(PolicyRef {
                kind,
                name: r.name.clone(),
            });
        }
    }
    let scope = Scope::new(EXCEPTION_VARS);
    let mut match_conditions = Vec::new();
    for (i, condition) in doc.spec.match_conditions.iter().enumerate() {
        let field = format!("spec.matchConditions[{i}].expression");
        if condition.name.is_empty() {
            errors.push(error(
                &format!("spec.matchConditions[{i}].name"),
                "Required value".to_owned(),
            ));
        }
        match compile_condition(&condition.expression, &scope) {
            Ok(program) => match_conditions.push(NamedProgram {
                name: condition.name.clone(),
                program,
            }),
            Err(reason) => errors.push(error(&field, reason.to_string())),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(CompiledException {
        name: doc.metadata.name,
        namespace: doc
            .metadata
            .namespace
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_owned()),
        policy_refs,
        match_conditions,
        expires_at,
        origin: origin.clone(),
    })
}

/// Why a field of an exception is refused; its text is the field error's reason.
#[derive(Debug, thiserror::Error)]
enum FieldError {
    /// `expiresAt` that is not an RFC 3339 date-time.
    #[error("Invalid value: {text:?}: not an RFC 3339 date-time: {source}")]
    Time {
        text: String,
        source: chrono::ParseError,
    },
    /// An empty matchCondition expression.
    #[error("Required value")]
    Required,
    /// A variable the exception's environment does not have.
    #[error(
        "{0} (an exception's matchConditions can only use object, oldObject, request and namespaceObject)"
    )]
    Undeclared(ivory_cel::CompileError),
    /// Any other compile error of a matchCondition.
    #[error(transparent)]
    Compile(ivory_cel::CompileError),
    /// A cluster read: whether an exception applies is decided without cluster data.
    #[error(
        "resource and globalContext are not available in an exception's matchConditions (ivory decides whether an exception applies without reading the cluster)"
    )]
    ClusterRead,
}

/// An RFC 3339 date-time, as the CRD's `format: date-time`.
fn parse_time(text: &str) -> Result<SystemTime, FieldError> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(SystemTime::from)
        .map_err(|source| FieldError::Time {
            text: text.to_owned(),
            source,
        })
}

fn compile_condition(source: &str, scope: &Scope) -> Result<Program, FieldError> {
    if source.trim().is_empty() {
        return Err(FieldError::Required);
    }
    let program = ivory_cel::compile(source, scope).map_err(|e| match e {
        ivory_cel::CompileError::UndeclaredReference(_) => FieldError::Undeclared(e),
        other => FieldError::Compile(other),
    })?;
    if crate::cluster_reads::reads_cluster(&program) {
        return Err(FieldError::ClusterRead);
    }
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn origin() -> Origin {
        Origin {
            file: None,
            document: 1,
        }
    }

    #[test]
    fn compiles_refs_and_conditions() {
        let value = json!({
            "apiVersion": "policies.kyverno.io/v1",
            "kind": "PolicyException",
            "metadata": {"name": "allow-skipped", "namespace": "team"},
            "spec": {
                "policyRefs": [
                    {"name": "check", "kind": "ImageValidatingPolicy"},
                    {"name": "other", "kind": "ValidatingPolicy"}
                ],
                "matchConditions": [{"name": "by-name", "expression": "object.metadata.name == 'skipped'"}]
            }
        });
        let ex = compile_exception(value, &origin()).expect("valid exception");
        assert_eq!(ex.key(), "team/allow-skipped");
        assert!(ex.refers_to(PolicyKind::ImageValidatingPolicy, "check"));
        assert!(!ex.refers_to(PolicyKind::NamespacedImageValidatingPolicy, "check"));
        assert!(!ex.refers_to(PolicyKind::ImageValidatingPolicy, "other"));
        assert_eq!(ex.match_conditions.len(), 1);
    }

    #[test]
    fn refuses_what_it_would_ignore() {
        let value = json!({
            "apiVersion": "policies.kyverno.io/v1beta1",
            "kind": "PolicyException",
            "metadata": {"name": "x"},
            "spec": {
                "policyRefs": [{"name": "check", "kind": "ImageValidatingPolicy"}],
                "images": ["ghcr.io/*"],
                "matchConditions": [{"name": "bad", "expression": "variables.x == 1"}]
            }
        });
        let errors = compile_exception(value, &origin()).expect_err("refused");
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(
            text.iter().any(|e| e.contains("spec.images: Forbidden")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|e| e.contains("spec.matchConditions[0].expression")),
            "{text:?}"
        );

        let unknown = json!({
            "apiVersion": "policies.kyverno.io/v1",
            "kind": "PolicyException",
            "metadata": {"name": "x"},
            "spec": {"policyRefs": [{"name": "c", "kind": "ImageValidatingPolicy"}], "exclude": {}}
        });
        let errors = compile_exception(unknown, &origin()).expect_err("unknown field refused");
        assert!(errors[0].to_string().contains("exclude"), "{errors:?}");

        let reads = json!({
            "apiVersion": "policies.kyverno.io/v1",
            "kind": "PolicyException",
            "metadata": {"name": "x"},
            "spec": {"policyRefs": [{"name": "c", "kind": "ImageValidatingPolicy"}],
                     "matchConditions": [{"name": "cm", "expression": "resource.Get('v1', 'configmaps', 'ops', 'allow') != null"}]}
        });
        let errors = compile_exception(reads, &origin()).expect_err("cluster read refused");
        assert!(
            errors[0]
                .to_string()
                .contains("not available in an exception's matchConditions"),
            "{errors:?}"
        );
    }

    #[test]
    fn expires_at_retires_the_exception() {
        let value = json!({
            "apiVersion": "policies.kyverno.io/v1",
            "kind": "PolicyException",
            "metadata": {"name": "x", "namespace": "ops"},
            "spec": {"policyRefs": [{"name": "c", "kind": "ImageValidatingPolicy"}],
                     "expiresAt": "2026-05-01T00:00:00Z", "reportResult": "skip",
                     "properties": {"ticket": "OPS-1"}}
        });
        let ex = compile_exception(value, &origin()).expect("valid");
        let at = ex.expires_at.expect("parsed");
        assert!(!ex.is_expired(at - std::time::Duration::from_secs(1)));
        assert!(ex.is_expired(at));
        let bad = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "PolicyException",
            "metadata": {"name": "x"}, "spec": {"policyRefs": [{"name": "c", "kind": "ImageValidatingPolicy"}],
            "expiresAt": "tomorrow"}});
        let errors = compile_exception(bad, &origin()).expect_err("bad time");
        assert!(
            errors[0]
                .to_string()
                .contains("spec.expiresAt: Invalid value"),
            "{errors:?}"
        );
    }

    #[test]
    fn requires_policy_refs_and_defaults_namespace() {
        let none = json!({"apiVersion": "policies.kyverno.io/v1", "kind": "PolicyException",
            "metadata": {"name": "x"}, "spec": {}});
        let errors = compile_exception(none, &origin()).expect_err("no refs");
        assert!(
            errors[0]
                .to_string()
                .contains("spec.policyRefs: Required value")
        );
        let ok = json!({"apiVersion": "policies.kyverno.io/v1alpha1", "kind": "PolicyException",
            "metadata": {"name": "x"}, "spec": {"policyRefs": [{"name": "c", "kind": "NamespacedImageValidatingPolicy"}]}});
        let ex = compile_exception(ok, &origin()).expect("valid");
        assert_eq!(ex.key(), "default/x");
        assert!(ex.match_conditions.is_empty());
    }
}
