//! The checked, compiled form of a policy. The engine only ever sees [`CompiledPolicy`]:
//! every CEL program, glob and regex is compiled once at load, never per request.

use std::path::PathBuf;
use std::sync::Arc;

use ivory_cel::Program;

use crate::types::{
    Attestation, Attestor, FailurePolicy, MatchResources, PolicyKind, PolicySpec, ValidationAction,
};

/// Where a policy came from, for error messages and `/readyz`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// The file, or `None` for the embedded default policy or the Kubernetes API.
    pub file: Option<PathBuf>,
    /// 1-based document number inside a multi-document file.
    pub document: usize,
}

/// A named CEL program (`matchConditions`, `variables`, `images`).
#[derive(Clone, Debug)]
pub struct NamedProgram {
    pub name: String,
    pub program: Program,
}

/// One `matchImageReferences` entry.
#[derive(Clone, Debug)]
pub enum ImageMatcher {
    /// gobwas-style glob without separators: `*` also matches `/`.
    Glob {
        pattern: String,
        matcher: globset::GlobMatcher,
    },
    /// CEL boolean over the variable `ref` (string).
    Expression(Program),
}

/// One `validations` entry.
#[derive(Clone, Debug)]
pub struct CompiledValidation {
    pub expression: Program,
    pub message: Option<String>,
    pub message_expression: Option<Program>,
}

/// One `auditAnnotations` entry.
#[derive(Clone, Debug)]
pub struct CompiledAuditAnnotation {
    pub key: String,
    pub value_expression: Program,
}

/// An attestor plus its CEL-sourced fields, compiled. `fields` holds (JSON pointer inside the
/// attestor object, program), e.g. `("/cosign/key/data", <key.expression>)`: the engine evaluates
/// each program per request and writes the string result at that pointer before verification.
#[derive(Clone, Debug)]
pub struct CompiledAttestor {
    pub attestor: Attestor,
    pub fields: Vec<(String, Program)>,
    /// `attestor` as the JSON object CEL sees, serialized once at compile time (used as is
    /// when `fields` is empty).
    pub json: serde_json::Value,
}

/// A policy ready for evaluation.
#[derive(Clone, Debug)]
pub struct CompiledPolicy {
    pub kind: PolicyKind,
    pub name: String,
    /// Set for `NamespacedImageValidatingPolicy` only.
    pub namespace: Option<String>,
    pub origin: Origin,
    /// The spec as written (webhook generation and reports read it).
    pub spec: Arc<PolicySpec>,
    /// Hex sha256 of kind, namespace, name and the canonical JSON of the spec: changes whenever
    /// the policy changes, so it can be part of verification cache keys.
    pub hash: String,
    pub actions: Vec<ValidationAction>,
    pub failure_policy: FailurePolicy,
    /// After autogen this is the variant's rules (controllers), not the pod rule.
    pub match_constraints: MatchResources,
    pub match_conditions: Vec<NamedProgram>,
    pub image_matchers: Vec<ImageMatcher>,
    pub variables: Vec<NamedProgram>,
    pub image_extractors: Vec<NamedProgram>,
    pub validations: Vec<CompiledValidation>,
    pub audit_annotations: Vec<CompiledAuditAnnotation>,
    pub attestors: Vec<CompiledAttestor>,
    pub attestations: Vec<Attestation>,
    pub mutate_digest: bool,
    pub verify_digest: bool,
    pub required: bool,
    pub json_mode: bool,
    /// `None` for the policy as written; `Some("defaults")` / `Some("cronjobs")` for autogen
    /// variants, which keep the parent's name and are evaluated exactly like it.
    pub autogen_config: Option<String>,
    /// The autogen variants of this policy (empty for variants and non-eligible policies).
    pub autogen: Vec<CompiledPolicy>,
}
