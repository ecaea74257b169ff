//! Serde model of Kyverno's `ImageValidatingPolicy` and `NamespacedImageValidatingPolicy`
//! (`policies.kyverno.io` v1alpha1, v1beta1 and v1 share one schema). Field names follow the CRD
//! exactly, including the odd `source.PullSecrets`. Defaults are applied by accessor methods rather
//! than serde defaults so that a round trip keeps what the user wrote.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The API group every accepted kind lives in.
pub const API_GROUP: &str = "policies.kyverno.io";
/// Versions that share the same spec schema.
pub const API_VERSIONS: [&str; 3] = ["v1alpha1", "v1beta1", "v1"];

/// Which of the two policy kinds a document declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PolicyKind {
    /// Cluster-scoped `ImageValidatingPolicy` (or its pre-release name `ImageVerificationPolicy`).
    ImageValidatingPolicy,
    /// `NamespacedImageValidatingPolicy`: applies only to requests in its own namespace.
    NamespacedImageValidatingPolicy,
}

impl PolicyKind {
    /// Maps a `kind` string to a policy kind; `ImageVerificationPolicy` is the pre-release alias.
    pub fn from_kind(kind: &str) -> Option<Self> {
        match kind {
            "ImageValidatingPolicy" | "ImageVerificationPolicy" => {
                Some(Self::ImageValidatingPolicy)
            }
            "NamespacedImageValidatingPolicy" => Some(Self::NamespacedImageValidatingPolicy),
            _ => None,
        }
    }

    /// The canonical kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ImageValidatingPolicy => "ImageValidatingPolicy",
            Self::NamespacedImageValidatingPolicy => "NamespacedImageValidatingPolicy",
        }
    }
}

/// One policy document as written (`apiVersion`, `kind`, `metadata`, `spec`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDocument {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: PolicySpec,
}

/// The subset of Kubernetes `ObjectMeta` a policy needs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// `spec` of both policy kinds. `attestors` and `validations` are required by the CRD.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_constraints: Option<MatchResources>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_conditions: Vec<NamedExpression>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_image_references: Vec<MatchImageReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variables: Vec<NamedExpression>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation_actions: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit_annotations: Vec<AuditAnnotation>,
    /// Required by the CRD; `None` means the key was missing (a validation error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validations: Option<Vec<Validation>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_configuration: Option<WebhookConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<Evaluation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_configurations: Option<ValidationConfigurations>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Credentials>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<NamedExpression>,
    /// Required by the CRD (may be `[]`); `None` means the key was missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestors: Option<Vec<Attestor>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attestations: Vec<Attestation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autogen: Option<Autogen>,
}

/// `admissionregistration.k8s.io/v1` `MatchResources`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MatchResources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_rules: Vec<NamedRuleWithOperations>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_resource_rules: Vec<NamedRuleWithOperations>,
    /// `Exact` or `Equivalent` (the API default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_policy: Option<String>,
}

/// A resource rule with operations and optional resource names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamedRuleWithOperations {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operations: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_versions: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// `Cluster`, `Namespaced` or `*` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// Kubernetes `LabelSelector`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry: operator `In`, `NotIn`, `Exists` or `DoesNotExist`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// `{name, expression}`: matchConditions, variables and image extractors share this shape.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamedExpression {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub expression: String,
}

/// `matchImageReferences[]`: exactly one of `glob` or `expression`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MatchImageReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub glob: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
}

/// `auditAnnotations[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditAnnotation {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub value_expression: String,
}

/// `validations[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Validation {
    #[serde(default)]
    pub expression: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_expression: Option<String>,
    /// Accepted and unused, as in Kyverno.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `webhookConfiguration`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
}

/// `evaluation`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Evaluation {
    /// `Kubernetes` (default) or `JSON`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Enabled>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<Enabled>,
}

/// `{enabled: bool}`; absent means enabled.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Enabled {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `validationConfigurations`; each flag defaults to `true`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidationConfigurations {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutate_digest: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_digest: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
}

/// `credentials`: when present it replaces the global registry options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_insecure_registry: Option<bool>,
    /// `default`, `amazon`, `azure`, `google`, `github`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<String>,
    /// `kubernetes.io/dockerconfigjson` secrets: `name` (ivory's namespace) or `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

/// `attestors[]`: a name and exactly one of `cosign` or `notary`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attestor {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cosign: Option<Cosign>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notary: Option<Notary>,
}

/// A cosign attestor. Precedence inside one attestor: keyless, then key, then certificate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cosign {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<CosignCertificate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctlog: Option<Ctlog>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<CosignKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyless: Option<Keyless>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_root: Option<StringSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuf: Option<Tuf>,
}

/// `{value}` xor `{expression}` (certificates, chains, trusted roots, notary certs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StringSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
}

/// `cosign.certificate`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CosignCertificate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<StringSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_chain: Option<StringSource>,
}

/// `cosign.ctlog`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ctlog {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ct_log_pub_key: Option<String>,
    /// The CRD spells this `insecureIgnoreSCT` (camelCase would give `insecureIgnoreSct`).
    #[serde(
        default,
        rename = "insecureIgnoreSCT",
        alias = "insecureIgnoreSct",
        skip_serializing_if = "Option::is_none"
    )]
    pub insecure_ignore_sct: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_ignore_tlog: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rekor_pub_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tsa_cert_chain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// `cosign.key`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CosignKey {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
    /// `sha224`, `sha256` (default), `sha384`, `sha512`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_algorithm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms: Option<String>,
}

/// `cosign.keyless`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Keyless {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_extensions: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub identities: Vec<Identity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roots: Option<String>,
}

/// One accepted keyless identity; any identity may match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_reg_exp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_reg_exp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_expression: Option<String>,
}

/// `cosign.source`: where signatures are stored when not beside the image.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// The CRD spells this key with a capital P (Go tag); the docs' `pullSecrets` is accepted too.
    #[serde(
        default,
        rename = "PullSecrets",
        alias = "pullSecrets",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub pull_secrets: Vec<SecretReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag_prefix: Option<String>,
}

/// `{name}` reference to a secret.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    #[serde(default)]
    pub name: String,
}

/// `cosign.tuf`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tuf {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<TufRoot>,
}

/// `cosign.tuf.root`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TufRoot {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// A notary attestor (parsed and validated; verification is reported as unsupported).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certs: Option<StringSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tsa_certs: Option<StringSource>,
}

/// `attestations[]`: a name and exactly one of `intoto` or `referrer`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attestation {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intoto: Option<TypeRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub referrer: Option<TypeRef>,
}

/// `{type}`: an in-toto predicate type or an OCI referrer artifactType.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeRef {
    #[serde(default, rename = "type")]
    pub type_: String,
}

/// `autogen`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Autogen {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_controllers: Option<PodControllers>,
}

/// `autogen.podControllers`; `controllers: []` disables autogen, absent means all six.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodControllers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controllers: Option<Vec<String>>,
}

/// The validation actions a policy can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ValidationAction {
    Audit,
    Deny,
    Warn,
}

impl ValidationAction {
    /// Parses the CRD enum value; anything else is rejected by validation.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Audit" => Some(Self::Audit),
            "Deny" => Some(Self::Deny),
            "Warn" => Some(Self::Warn),
            _ => None,
        }
    }
}

/// What happens when ivory cannot reach a verdict (budget spent, registry unreachable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FailurePolicy {
    Fail,
    Ignore,
}

/// The six pod controllers autogen knows.
pub const POD_CONTROLLERS: [&str; 6] = [
    "daemonsets",
    "deployments",
    "replicasets",
    "statefulsets",
    "jobs",
    "cronjobs",
];

impl PolicySpec {
    /// `failurePolicy`, defaulting to `Fail`. Invalid values are rejected by validation.
    pub fn failure_policy(&self) -> FailurePolicy {
        match self.failure_policy.as_deref() {
            Some("Ignore") => FailurePolicy::Ignore,
            _ => FailurePolicy::Fail,
        }
    }

    /// `validationActions`, defaulting to `[Deny]`; unknown values are skipped (validation rejects them).
    pub fn validation_actions(&self) -> Vec<ValidationAction> {
        if self.validation_actions.is_empty() {
            return vec![ValidationAction::Deny];
        }
        let mut actions: Vec<_> = self
            .validation_actions
            .iter()
            .filter_map(|a| ValidationAction::parse(a))
            .collect();
        actions.sort();
        actions.dedup();
        actions
    }

    fn flags(&self) -> ValidationConfigurations {
        self.validation_configurations.clone().unwrap_or_default()
    }

    /// `validationConfigurations.mutateDigest`, default `true`.
    pub fn mutate_digest(&self) -> bool {
        self.flags().mutate_digest.unwrap_or(true)
    }

    /// `validationConfigurations.verifyDigest`, default `true`.
    pub fn verify_digest(&self) -> bool {
        self.flags().verify_digest.unwrap_or(true)
    }

    /// `validationConfigurations.required`, default `true`.
    pub fn required(&self) -> bool {
        self.flags().required.unwrap_or(true)
    }

    /// `evaluation.mode` is `JSON` (only `object` bound; images from `spec.images`).
    pub fn json_mode(&self) -> bool {
        self.evaluation
            .as_ref()
            .and_then(|e| e.mode.as_deref())
            .is_some_and(|m| m == "JSON")
    }

    /// `evaluation.admission.enabled`, default `true`.
    pub fn admission_enabled(&self) -> bool {
        self.evaluation
            .as_ref()
            .and_then(|e| e.admission.as_ref())
            .and_then(|a| a.enabled)
            .unwrap_or(true)
    }

    /// `evaluation.background.enabled`, default `true`.
    pub fn background_enabled(&self) -> bool {
        self.evaluation
            .as_ref()
            .and_then(|e| e.background.as_ref())
            .and_then(|a| a.enabled)
            .unwrap_or(true)
    }

    /// `webhookConfiguration.timeoutSeconds` when set.
    pub fn timeout_seconds(&self) -> Option<i32> {
        self.webhook_configuration
            .as_ref()
            .and_then(|w| w.timeout_seconds)
    }

    /// Controllers autogen targets: all six when unset, none for `[]`.
    pub fn autogen_controllers(&self) -> Vec<String> {
        match self
            .autogen
            .as_ref()
            .and_then(|a| a.pod_controllers.as_ref())
            .and_then(|p| p.controllers.as_ref())
        {
            Some(list) => list.clone(),
            None => POD_CONTROLLERS.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}
