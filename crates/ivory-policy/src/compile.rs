//! `PolicyDocument` → [`CompiledPolicy`]: structural validation, CEL compilation in the scope
//! Kyverno gives each field, glob compilation, hashing and autogen variants.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use ivory_cel::{CompileError, Program, Scope};
use regex::Regex;
use sha2::{Digest, Sha256};

use crate::cluster_reads::{self, ClusterReads};
use crate::compiled::{
    CompiledAttestor, CompiledAuditAnnotation, CompiledPolicy, CompiledValidation, ImageMatcher,
    NAMESPACE_PINNING_ANNOTATION, NamedProgram, Origin, PINNING_ANNOTATION, Pinning,
    VERIFY_PLATFORMS_ANNOTATION, VerifyPlatforms,
};
use crate::error::{Errors, PolicyError, location};
use crate::spec_checks;
use crate::types::{
    API_GROUP, API_VERSIONS, Attestor, NamedExpression, PolicyDocument, PolicyKind, PolicySpec,
};
use crate::{autogen, ephemeral};

mod notation_trust;

/// Variables bound in `matchConditions`.
const MATCH_CONDITION_VARS: [&str; 4] = ["object", "oldObject", "request", "namespaceObject"];
/// Variables bound everywhere else in `evaluation.mode: Kubernetes`.
const KUBERNETES_VARS: [&str; 8] = [
    "object",
    "oldObject",
    "request",
    "namespaceObject",
    "variables",
    "images",
    "attestors",
    "attestations",
];
/// Variables bound in `evaluation.mode: JSON`.
/// Variables bound to what the policy declares rather than to the request: the CEL cost
/// estimate does not size them by the request.
const POLICY_DEFINED_VARS: [&str; 2] = ["attestors", "attestations"];
const JSON_VARS: [&str; 4] = ["object", "images", "attestors", "attestations"];

/// Kyverno CEL libraries ivory does not implement, recognised in expressions that fail to compile.
static UNSUPPORTED_LIBRARY: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"\b(http\s*\.\s*[A-Za-z]+|resource\s*\.\s*(?:[Pp]ost|[Tt]oGVR))\s*\(").ok()
});

/// Validates and compiles one policy document. Every problem found is returned, not just the
/// first; errors are located with `origin` (or `<kind>/<name>` when it has no file).
pub fn compile(doc: &PolicyDocument, origin: Origin) -> Result<CompiledPolicy, Vec<PolicyError>> {
    let label = format!("{}/{}", doc.kind, qualified_name(doc));
    let loc = location(&origin, &label);
    let mut errs = Errors::default();
    let kind = header(doc, &mut errs);
    if let Some(kind) = kind {
        spec_checks::metadata(kind, &doc.metadata, &mut errs);
        spec_checks::credentials_scope(kind, &doc.metadata, &doc.spec, &mut errs);
    }
    spec_checks::spec(&doc.spec, &mut errs);
    let pinning = pinning(doc, &mut errs);
    let namespace_may_skip_pinning = namespace_pinning(doc, &mut errs);
    let Some(kind) = kind else {
        return Err(errs.into_policy_errors(&loc));
    };
    let namespace = match kind {
        PolicyKind::NamespacedImageValidatingPolicy => doc.metadata.namespace.clone(),
        // The API server drops a namespace on cluster-scoped objects; so do we.
        PolicyKind::ImageValidatingPolicy => None,
    };
    let verify_platforms = verify_platforms(&doc.metadata.annotations, &mut errs);
    let mut hash = policy_hash(kind, namespace.as_deref(), &doc.metadata.name, &doc.spec);
    if verify_platforms != VerifyPlatforms::Index {
        // The annotation changes what is verified: the same spec is another policy.
        hash = hex::encode(Sha256::digest(format!("{hash}/{verify_platforms:?}")));
    }
    if let Some(trust) = doc
        .metadata
        .annotations
        .get(crate::notation::NOTATION_TRUST_POLICY_ANNOTATION)
    {
        // So does the Notation trust policy.
        hash = hex::encode(Sha256::digest(format!("{hash}/notation/{trust}")));
    }
    let head = Head {
        kind,
        name: doc.metadata.name.clone(),
        namespace,
        origin,
        hash,
        pinning,
        namespace_may_skip_pinning,
        verify_platforms,
    };
    let mut spec = doc.spec.clone();
    notation_trust::apply(&doc.metadata.annotations, &mut spec, &mut errs);
    let mut parent = compile_spec(&head, Arc::new(spec), None, &mut errs);
    if !errs.is_empty() {
        return Err(errs.into_policy_errors(&loc));
    }
    for (config, mut spec) in autogen::variants(&doc.spec) {
        let mut variant_errs = Errors::default();
        // Its problems were reported for the policy itself.
        notation_trust::apply(&doc.metadata.annotations, &mut spec, &mut Errors::default());
        let variant = compile_spec(&head, Arc::new(spec), Some(config), &mut variant_errs);
        parent.autogen.push(variant);
        errs.extend(variant_errs.with_field_suffix(&format!(" (autogen {config})")));
    }
    if errs.is_empty() {
        Ok(parent)
    } else {
        Err(errs.into_policy_errors(&loc))
    }
}

/// The facts shared by a policy and its autogen variants.
struct Head {
    kind: PolicyKind,
    name: String,
    namespace: Option<String>,
    origin: Origin,
    hash: String,
    pinning: Pinning,
    namespace_may_skip_pinning: bool,
    verify_platforms: VerifyPlatforms,
}

/// The [`NAMESPACE_PINNING_ANNOTATION`] of the policy: whether namespaces may choose
/// `no-patch` (`any`) or only `pods-only` (the default). Any other value is refused.
fn namespace_pinning(doc: &PolicyDocument, errs: &mut Errors) -> bool {
    match doc
        .metadata
        .annotations
        .get(NAMESPACE_PINNING_ANNOTATION)
        .map(String::as_str)
    {
        None | Some("pods-only") => false,
        Some("any") => true,
        Some(other) => {
            errs.unsupported(
                format!("metadata.annotations[{NAMESPACE_PINNING_ANNOTATION}]"),
                other,
                &["pods-only", "any"],
            );
            false
        }
    }
}

/// The [`PINNING_ANNOTATION`] of the policy. A value ivory does not know, or a mode other than
/// `all` on a policy that does not pin at all (`mutateDigest: false`), is refused: an
/// annotation that would be accepted and then ignored is a silent misconfiguration.
fn pinning(doc: &PolicyDocument, errs: &mut Errors) -> Pinning {
    let Some(value) = doc.metadata.annotations.get(PINNING_ANNOTATION) else {
        return Pinning::default();
    };
    let field = format!("metadata.annotations[{PINNING_ANNOTATION}]");
    let Some(mode) = Pinning::parse(value) else {
        errs.unsupported(field, value, &Pinning::VALUES);
        return Pinning::default();
    };
    if mode != Pinning::All && !doc.spec.mutate_digest() {
        errs.invalid(
            field,
            format!(
                "{value:?}: chooses where digests are pinned, but spec.validationConfigurations.mutateDigest is false"
            ),
        );
    }
    mode
}

/// [`VERIFY_PLATFORMS_ANNOTATION`], `index` when absent; any other value keeps the policy from
/// loading (never accepted and then ignored).
fn verify_platforms(annotations: &BTreeMap<String, String>, errs: &mut Errors) -> VerifyPlatforms {
    let Some(value) = annotations.get(VERIFY_PLATFORMS_ANNOTATION) else {
        return VerifyPlatforms::Index;
    };
    VerifyPlatforms::from_annotation(value).unwrap_or_else(|| {
        errs.unsupported(
            format!("metadata.annotations[{VERIFY_PLATFORMS_ANNOTATION}]"),
            value,
            &VerifyPlatforms::VALUES,
        );
        VerifyPlatforms::Index
    })
}

fn qualified_name(doc: &PolicyDocument) -> String {
    match (&doc.metadata.namespace, PolicyKind::from_kind(&doc.kind)) {
        (Some(ns), Some(PolicyKind::NamespacedImageValidatingPolicy)) => {
            format!("{ns}/{}", doc.metadata.name)
        }
        _ => doc.metadata.name.clone(),
    }
}

/// Checks `apiVersion` and `kind`; returns the kind when it is a policy kind.
fn header(doc: &PolicyDocument, errs: &mut Errors) -> Option<PolicyKind> {
    let supported: Vec<String> = API_VERSIONS
        .iter()
        .map(|v| format!("{API_GROUP}/{v}"))
        .collect();
    if !supported.contains(&doc.api_version) {
        let list: Vec<&str> = supported.iter().map(String::as_str).collect();
        errs.unsupported("apiVersion", &doc.api_version, &list);
    }
    let kind = PolicyKind::from_kind(&doc.kind);
    if kind.is_none() {
        errs.unsupported(
            "kind",
            &doc.kind,
            &[
                "ImageValidatingPolicy",
                "ImageVerificationPolicy",
                "NamespacedImageValidatingPolicy",
            ],
        );
    }
    kind
}

/// Compiles the CEL, globs and flags of one spec (the policy itself or an autogen variant).
fn compile_spec(
    head: &Head,
    spec: Arc<PolicySpec>,
    autogen_config: Option<&str>,
    errs: &mut Errors,
) -> CompiledPolicy {
    let json_mode = spec.json_mode();
    let mut cel = CelCompiler {
        errs,
        policy: head.name.clone(),
        json_mode,
        main: Scope::new(
            if json_mode {
                &JSON_VARS[..]
            } else {
                &KUBERNETES_VARS[..]
            }
            .iter()
            .copied(),
        )
        .policy_defined(POLICY_DEFINED_VARS),
        variables: spec.variables.iter().map(|v| v.name.clone()).collect(),
        attestors: spec
            .attestors
            .as_ref()
            .map(|list| list.iter().map(|a| a.name.clone()).collect()),
        attestations: spec.attestations.iter().map(|a| a.name.clone()).collect(),
        namespace: head.namespace.clone(),
        cluster_reads: ClusterReads::default(),
    };
    let match_scope = Scope::new(MATCH_CONDITION_VARS);
    let match_conditions = cel.named(&spec.match_conditions, "spec.matchConditions", &match_scope);
    let image_matchers = cel.image_matchers(&spec);
    let variables = cel.variables(&spec.variables);
    let main = cel.main.clone();
    let image_extractors = cel.named(&spec.images, "spec.images", &main);
    let validations = cel.validations(&spec);
    let audit_annotations = cel.audit_annotations(&spec);
    let attestors = cel.attestors(spec.attestors.as_deref().unwrap_or_default());
    let cluster_reads = std::mem::take(&mut cel.cluster_reads);
    let mut match_constraints = spec.match_constraints.clone().unwrap_or_default();
    match_constraints.resource_rules =
        ephemeral::with_ephemeral_containers(match_constraints.resource_rules);
    match_constraints.exclude_resource_rules =
        ephemeral::with_ephemeral_containers(match_constraints.exclude_resource_rules);
    CompiledPolicy {
        kind: head.kind,
        name: head.name.clone(),
        namespace: head.namespace.clone(),
        origin: head.origin.clone(),
        hash: head.hash.clone(),
        actions: spec.validation_actions(),
        failure_policy: spec.failure_policy(),
        match_constraints,
        match_conditions,
        image_matchers,
        variables,
        image_extractors,
        validations,
        audit_annotations,
        attestors,
        attestations: spec.attestations.clone(),
        mutate_digest: spec.mutate_digest(),
        verify_digest: spec.verify_digest(),
        pinning: head.pinning,
        namespace_may_skip_pinning: head.namespace_may_skip_pinning,
        required: spec.required(),
        json_mode,
        verify_platforms: head.verify_platforms,
        autogen_config: autogen_config.map(str::to_owned),
        autogen: Vec::new(),
        cluster_reads,
        derived: crate::DerivedSlot::default(),
        spec,
    }
}

struct CelCompiler<'e> {
    errs: &'e mut Errors,
    /// The policy's name, for errors read far from the file (a refused costly expression).
    policy: String,
    json_mode: bool,
    /// Scope of validations, variables, image extractors and attestor expressions.
    main: Scope,
    /// Declared `spec.variables` names, in order.
    variables: Vec<String>,
    /// Declared `spec.attestors` names (`None` when the key is missing, already an error).
    attestors: Option<Vec<String>>,
    /// Declared `spec.attestations` names.
    attestations: Vec<String>,
    /// The namespace of a NamespacedImageValidatingPolicy (its cluster reads are confined to it).
    namespace: Option<String>,
    /// What the expressions compiled so far read from the cluster.
    cluster_reads: ClusterReads,
}

impl CelCompiler<'_> {
    /// Compiles one expression; on failure records the error at `field` and returns `None`.
    fn expr(&mut self, source: &str, field: &str, scope: &Scope) -> Option<Program> {
        if source.trim().is_empty() {
            // Reported by validation as `Required value`.
            return None;
        }
        match ivory_cel::compile(source, scope) {
            Ok(program) => {
                self.check_variable_refs(&program, field, None);
                self.check_member_refs(source, field, scope);
                self.record_cluster_reads(&program, field);
                Some(program)
            }
            Err(err) => {
                let reason = self.explain(source, &err, scope);
                self.errs.push(field, reason);
                None
            }
        }
    }

    /// Records what `program` reads from the cluster; a read ivory cannot know before the
    /// policy runs, or may not serve, is an error at `field`.
    fn record_cluster_reads(&mut self, program: &Program, field: &str) {
        let namespace = self.namespace.as_deref();
        for reason in cluster_reads::record(program, namespace, &mut self.cluster_reads) {
            self.errs.push(field, reason.to_string());
        }
    }

    /// Turns a compile error into the message users see, naming unsupported Kyverno libraries
    /// and variables that the field's scope lacks.
    fn explain(&self, source: &str, err: &CompileError, scope: &Scope) -> String {
        if let Some(caps) = UNSUPPORTED_LIBRARY
            .as_ref()
            .and_then(|re| re.captures(source))
            && let Some(lib) = caps.get(1)
        {
            return if lib.as_str().starts_with("http") {
                "Kyverno library 'http' is not supported by ivory: an admission never makes an \
                 HTTP call a policy chooses"
                    .to_owned()
            } else {
                format!(
                    "Kyverno function '{}' is not supported by ivory: it reads cluster objects \
                     from watch caches (resource.Get, resource.List) and never writes",
                    lib.as_str()
                        .split('(')
                        .next()
                        .unwrap_or_default()
                        .replace(' ', "")
                )
            };
        }
        if let CompileError::TooCostly { .. } = err {
            return format!("policy {:?}: {err}", self.policy);
        }
        if let CompileError::UndeclaredReference(name) = err
            && KUBERNETES_VARS.contains(&name.as_str())
        {
            let hint = if !scope.contains("variables") && scope.contains("request") {
                "matchConditions can only use object, oldObject, request and namespaceObject"
            } else if self.json_mode {
                "evaluation.mode JSON binds only object, images, attestors and attestations"
            } else {
                ""
            };
            if !hint.is_empty() {
                return format!("{err} ({hint})");
            }
        }
        err.to_string()
    }

    /// `variables.NAME` must name a declared variable; inside `spec.variables[i]` it must name an
    /// earlier one (Kyverno evaluates variables in order).
    fn check_variable_refs(&mut self, program: &Program, field: &str, index: Option<usize>) {
        for name in program.variable_refs() {
            match self.variables.iter().position(|v| v == name) {
                None => self
                    .errs
                    .push(field, format!("undeclared variable 'variables.{name}'")),
                Some(pos) if index.is_some_and(|i| pos >= i) => self.errs.push(
                    field,
                    format!("variable 'variables.{name}' is declared at or after this one (spec.variables[{pos}]); a variable may only use earlier variables"),
                ),
                Some(_) => {}
            }
        }
    }

    /// `attestors.NAME` and `attestations.NAME` must name a declared attestor / attestation.
    fn check_member_refs(&mut self, source: &str, field: &str, scope: &Scope) {
        for (map, key) in crate::refs::member_refs(source) {
            if !scope.contains(&map) {
                continue;
            }
            let (declared, what) = match (map.as_str(), &self.attestors) {
                ("attestors", Some(attestors)) => (attestors, "attestor"),
                ("attestors", None) => continue,
                _ => (&self.attestations, "attestation"),
            };
            if !declared.contains(&key) {
                self.errs.push(
                    field,
                    format!(
                        "undeclared {what} '{key}' (declared: {})",
                        list_or_none(declared)
                    ),
                );
            }
        }
    }

    fn named(&mut self, list: &[NamedExpression], field: &str, scope: &Scope) -> Vec<NamedProgram> {
        list.iter()
            .enumerate()
            .filter_map(|(i, item)| {
                let program =
                    self.expr(&item.expression, &format!("{field}[{i}].expression"), scope)?;
                Some(NamedProgram {
                    name: item.name.clone(),
                    program,
                })
            })
            .collect()
    }

    fn variables(&mut self, list: &[NamedExpression]) -> Vec<NamedProgram> {
        let scope = self.main.clone();
        let mut out = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            let field = format!("spec.variables[{i}].expression");
            if item.expression.trim().is_empty() {
                continue;
            }
            match ivory_cel::compile(&item.expression, &scope) {
                Ok(program) => {
                    self.check_variable_refs(&program, &field, Some(i));
                    self.check_member_refs(&item.expression, &field, &scope);
                    self.record_cluster_reads(&program, &field);
                    out.push(NamedProgram {
                        name: item.name.clone(),
                        program,
                    });
                }
                Err(err) => {
                    let reason = self.explain(&item.expression, &err, &scope);
                    self.errs.push(field, reason);
                }
            }
        }
        out
    }

    fn image_matchers(&mut self, spec: &PolicySpec) -> Vec<ImageMatcher> {
        let ref_scope = Scope::new(["ref"]);
        let mut out = Vec::new();
        for (i, m) in spec.match_image_references.iter().enumerate() {
            match (&m.glob, &m.expression) {
                (Some(glob), None) => {
                    // An invalid glob was already reported by validation.
                    if let Ok(matcher) = crate::glob::compile_image_glob(glob) {
                        out.push(ImageMatcher::Glob {
                            pattern: glob.clone(),
                            matcher,
                        });
                    }
                }
                (None, Some(expr)) => {
                    let field = format!("spec.matchImageReferences[{i}].expression");
                    if let Some(p) = self.expr(expr, &field, &ref_scope) {
                        if cluster_reads::reads_cluster(&p) {
                            // Kyverno compiles these in an environment without its libraries;
                            // and an image's selection must not depend on cluster state.
                            self.errs.push(
                                &field,
                                "resource and globalContext are not available in \
                                 matchImageReferences (Kyverno's match environment has no \
                                 libraries): read the cluster in a validation",
                            );
                        }
                        out.push(ImageMatcher::Expression(p));
                    }
                }
                _ => {}
            }
        }
        out
    }

    fn validations(&mut self, spec: &PolicySpec) -> Vec<CompiledValidation> {
        let scope = self.main.clone();
        let mut out = Vec::new();
        for (i, v) in spec
            .validations
            .as_deref()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let field = format!("spec.validations[{i}]");
            let expression = self.expr(&v.expression, &format!("{field}.expression"), &scope);
            let message_expression = v
                .message_expression
                .as_deref()
                .filter(|m| !m.trim().is_empty())
                .and_then(|m| self.expr(m, &format!("{field}.messageExpression"), &scope));
            if let Some(expression) = expression {
                out.push(CompiledValidation {
                    expression,
                    message: v.message.clone(),
                    message_expression,
                });
            }
        }
        out
    }

    fn audit_annotations(&mut self, spec: &PolicySpec) -> Vec<CompiledAuditAnnotation> {
        let scope = self.main.clone();
        spec.audit_annotations
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                let field = format!("spec.auditAnnotations[{i}].valueExpression");
                let value_expression = self.expr(&a.value_expression, &field, &scope)?;
                Some(CompiledAuditAnnotation {
                    key: a.key.clone(),
                    value_expression,
                })
            })
            .collect()
    }

    fn attestors(&mut self, list: &[Attestor]) -> Vec<CompiledAttestor> {
        let scope = self.main.clone();
        list.iter()
            .enumerate()
            .map(|(i, attestor)| {
                let mut fields = Vec::new();
                for (pointer, field, source) in attestor_expressions(attestor) {
                    let field = format!("spec.attestors[{i}].{field}");
                    if let Some(p) = self.expr(source, &field, &scope) {
                        fields.push((pointer, p));
                    }
                }
                CompiledAttestor {
                    json: serde_json::to_value(attestor).unwrap_or(serde_json::Value::Null),
                    attestor: attestor.clone(),
                    fields,
                }
            })
            .collect()
    }
}

/// (JSON pointer the result is written to, field path, CEL source) of every CEL-sourced field.
/// A `keyless.identities[].subjectExpression` result replaces the expression itself: the
/// verifier reads it as one more exact subject the certificate must name.
fn attestor_expressions(a: &Attestor) -> Vec<(String, String, &str)> {
    let mut out: Vec<(String, String, &str)> = attestor_value_expressions(a)
        .into_iter()
        .map(|(p, f, e)| (p.to_owned(), f.to_owned(), e))
        .collect();
    let identities = a
        .cosign
        .as_ref()
        .and_then(|c| c.keyless.as_ref())
        .map(|k| k.identities.as_slice())
        .unwrap_or_default();
    for (i, id) in identities.iter().enumerate() {
        if let Some(e) = id.subject_expression.as_deref() {
            out.push((
                format!("/cosign/keyless/identities/{i}/subjectExpression"),
                format!("cosign.keyless.identities[{i}].subjectExpression"),
                e,
            ));
        }
    }
    out
}

/// The CEL-sourced fields whose result goes into a sibling `value`/`data` field.
fn attestor_value_expressions(a: &Attestor) -> Vec<(&'static str, &'static str, &str)> {
    let mut out = Vec::new();
    if let Some(c) = &a.cosign {
        if let Some(e) = c.key.as_ref().and_then(|k| k.expression.as_deref()) {
            out.push(("/cosign/key/data", "cosign.key.expression", e));
        }
        if let Some(cert) = &c.certificate {
            if let Some(e) = cert.cert.as_ref().and_then(|s| s.expression.as_deref()) {
                out.push((
                    "/cosign/certificate/cert/value",
                    "cosign.certificate.cert.expression",
                    e,
                ));
            }
            if let Some(e) = cert
                .cert_chain
                .as_ref()
                .and_then(|s| s.expression.as_deref())
            {
                out.push((
                    "/cosign/certificate/certChain/value",
                    "cosign.certificate.certChain.expression",
                    e,
                ));
            }
        }
        if let Some(e) = c
            .trusted_root
            .as_ref()
            .and_then(|s| s.expression.as_deref())
        {
            out.push((
                "/cosign/trustedRoot/value",
                "cosign.trustedRoot.expression",
                e,
            ));
        }
    }
    if let Some(n) = &a.notary {
        if let Some(e) = n.certs.as_ref().and_then(|s| s.expression.as_deref()) {
            out.push(("/notary/certs/value", "notary.certs.expression", e));
        }
        if let Some(e) = n.tsa_certs.as_ref().and_then(|s| s.expression.as_deref()) {
            out.push(("/notary/tsaCerts/value", "notary.tsaCerts.expression", e));
        }
    }
    out
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// Hex sha256 over kind, namespace, name and the key-sorted JSON of the spec.
pub(crate) fn policy_hash(
    kind: PolicyKind,
    namespace: Option<&str>,
    name: &str,
    spec: &PolicySpec,
) -> String {
    let json = serde_json::to_value(spec)
        .map(canonical)
        .unwrap_or_default();
    let mut hasher = Sha256::new();
    for part in [kind.as_str(), namespace.unwrap_or_default(), name] {
        hasher.update(part.as_bytes());
        hasher.update([0u8]);
    }
    hasher.update(json.to_string().as_bytes());
    hex::encode(hasher.finalize())
}

/// Sorts object keys recursively so the hash does not depend on map ordering features.
fn canonical(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().map(|(k, v)| (k, canonical(v))).collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().collect())
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(canonical).collect())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests;
