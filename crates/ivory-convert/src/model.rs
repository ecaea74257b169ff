//! Serde model of the parts of Kyverno's legacy `ClusterPolicy` / `Policy` (`kyverno.io/v1`,
//! `v2beta1`) a `verifyImages` rule depends on. Field names follow Kyverno's CRD
//! (`api/kyverno/v1/image_verification_types.go`, `match_resources_types.go`). The structs that
//! describe a `verifyImages` entry refuse unknown fields, so a field the converter does not know
//! is named in an error instead of being dropped.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

/// `spec` of a ClusterPolicy or Policy: the fields that change how `verifyImages` rules run.
/// Fields that only matter to other rule types (`generateExisting`, `schemaValidation`, …) are
/// accepted and ignored.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Spec {
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub apply_rules: Option<String>,
    #[serde(default)]
    pub failure_policy: Option<String>,
    #[serde(default)]
    pub validation_failure_action: Option<String>,
    #[serde(default)]
    pub validation_failure_action_overrides: Option<Vec<Value>>,
    #[serde(default)]
    pub admission: Option<bool>,
    #[serde(default)]
    pub background: Option<bool>,
    #[serde(default)]
    pub webhook_timeout_seconds: Option<i32>,
    #[serde(default)]
    pub webhook_configuration: Option<WebhookConfiguration>,
}

/// `spec.webhookConfiguration` (Kyverno ≥ 1.12): supersedes `failurePolicy` and
/// `webhookTimeoutSeconds`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct WebhookConfiguration {
    #[serde(default)]
    pub failure_policy: Option<String>,
    #[serde(default)]
    pub timeout_seconds: Option<i32>,
    #[serde(default)]
    pub match_conditions: Vec<CelCondition>,
}

/// A CEL `{name, expression}` (webhook matchConditions, `celPreconditions`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CelCondition {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub expression: String,
}

/// One rule; only `verifyImages` rules are converted, the others are reported as skipped.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Rule {
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "match")]
    pub match_: Option<MatchResources>,
    #[serde(default)]
    pub exclude: Option<MatchResources>,
    #[serde(default)]
    pub preconditions: Option<Value>,
    #[serde(default)]
    pub cel_preconditions: Vec<CelCondition>,
    #[serde(default)]
    pub context: Vec<Value>,
    #[serde(default)]
    pub image_extractors: Option<Value>,
    #[serde(default)]
    pub verify_images: Vec<Value>,
}

/// `match` / `exclude`: `any`, `all`, or the older top-level resource description.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MatchResources {
    #[serde(default)]
    pub any: Vec<ResourceFilter>,
    #[serde(default)]
    pub all: Vec<ResourceFilter>,
    #[serde(default)]
    pub resources: Option<ResourceDescription>,
    #[serde(default)]
    pub subjects: Vec<Subject>,
    #[serde(default)]
    pub roles: Vec<String>,
    #[serde(default)]
    pub cluster_roles: Vec<String>,
}

/// One entry of `match.any` / `match.all`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ResourceFilter {
    #[serde(default)]
    pub resources: Option<ResourceDescription>,
    #[serde(default)]
    pub subjects: Vec<Subject>,
    #[serde(default)]
    pub roles: Vec<String>,
    #[serde(default)]
    pub cluster_roles: Vec<String>,
}

/// `resources`: what a filter matches.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ResourceDescription {
    #[serde(default)]
    pub kinds: Vec<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub names: Vec<String>,
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub selector: Option<ivory_policy::types::LabelSelector>,
    #[serde(default)]
    pub namespace_selector: Option<ivory_policy::types::LabelSelector>,
    #[serde(default)]
    pub operations: Vec<String>,
}

/// `subjects[]`: `{kind: User|Group|ServiceAccount, name, namespace}` (rbac/v1 Subject).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Subject {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    /// `rbac.authorization.k8s.io` or empty; accepted and not needed.
    #[serde(default, rename = "apiGroup")]
    pub _api_group: Option<IgnoredAny>,
}

/// One `verifyImages[]` entry (`ImageVerification`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ImageVerification {
    #[serde(default)]
    pub failure_action: Option<String>,
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub image_references: Vec<String>,
    #[serde(default)]
    pub skip_image_references: Vec<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub roots: Option<String>,
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default)]
    pub additional_extensions: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub attestors: Vec<AttestorSet>,
    #[serde(default)]
    pub attestations: Vec<Attestation>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub repository: Option<String>,
    #[serde(default, rename = "cosignOCI11")]
    pub cosign_oci11: Option<bool>,
    /// The CRD defaults the three flags to `true`.
    #[serde(default)]
    pub mutate_digest: Option<bool>,
    #[serde(default)]
    pub verify_digest: Option<bool>,
    #[serde(default)]
    pub required: Option<bool>,
    #[serde(default)]
    pub validate: Option<Value>,
    #[serde(default)]
    pub image_registry_credentials: Option<ImageRegistryCredentials>,
    /// ivory caches verdicts by digest whatever this says; the verdicts are the same.
    #[serde(default, rename = "useCache")]
    pub _use_cache: Option<IgnoredAny>,
}

/// `attestors[]`: entries of which `count` (default: all) must verify.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AttestorSet {
    #[serde(default)]
    pub count: Option<i64>,
    #[serde(default)]
    pub entries: Vec<Attestor>,
}

/// One attestor entry: exactly one of `keys`, `certificates`, `keyless`, `attestor`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Attestor {
    #[serde(default)]
    pub keys: Option<StaticKey>,
    #[serde(default)]
    pub certificates: Option<Certificates>,
    #[serde(default)]
    pub keyless: Option<Keyless>,
    #[serde(default)]
    pub attestor: Option<Value>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub repository: Option<String>,
    #[serde(default)]
    pub signature_algorithm: Option<String>,
}

/// `keys`: static public keys.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct StaticKey {
    #[serde(default)]
    pub public_keys: Option<String>,
    #[serde(default)]
    pub signature_algorithm: Option<String>,
    #[serde(default)]
    pub kms: Option<String>,
    #[serde(default)]
    pub secret: Option<Value>,
    #[serde(default)]
    pub rekor: Option<Rekor>,
    #[serde(default)]
    pub ctlog: Option<CtLog>,
}

/// `certificates`: a signing certificate and/or chain.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Certificates {
    #[serde(default)]
    pub cert: Option<String>,
    #[serde(default)]
    pub cert_chain: Option<String>,
    #[serde(default)]
    pub rekor: Option<Rekor>,
    #[serde(default)]
    pub ctlog: Option<CtLog>,
}

/// `keyless`: Fulcio certificates for one identity.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Keyless {
    #[serde(default)]
    pub rekor: Option<Rekor>,
    #[serde(default)]
    pub ctlog: Option<CtLog>,
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default)]
    pub issuer_reg_exp: Option<String>,
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub subject_reg_exp: Option<String>,
    #[serde(default)]
    pub roots: Option<String>,
    #[serde(default)]
    pub additional_extensions: Option<BTreeMap<String, String>>,
}

/// `rekor`: the transparency log.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Rekor {
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub pubkey: Option<String>,
    #[serde(default)]
    pub ignore_tlog: Option<bool>,
}

/// `ctlog`: certificate transparency and timestamps.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CtLog {
    #[serde(default, rename = "ignoreSCT")]
    pub ignore_sct: Option<bool>,
    #[serde(default)]
    pub pubkey: Option<String>,
    #[serde(default)]
    pub tsa_cert_chain: Option<String>,
}

/// `attestations[]`: in-toto statements of one type, their signers and conditions.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Attestation {
    /// The JMESPath context entry name; CEL reads the payload through `extractPayload`.
    #[serde(default, rename = "name")]
    pub _name: Option<IgnoredAny>,
    #[serde(default)]
    pub predicate_type: Option<String>,
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub attestors: Vec<AttestorSet>,
    #[serde(default)]
    pub conditions: Vec<Value>,
}

/// `imageRegistryCredentials`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ImageRegistryCredentials {
    #[serde(default)]
    pub allow_insecure_registry: Option<bool>,
    #[serde(default)]
    pub providers: Vec<String>,
    #[serde(default)]
    pub secrets: Vec<String>,
}
