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
    /// `policies.kyverno.io/<version>`; checked against [`API_GROUP`] and [`API_VERSIONS`].
    pub api_version: String,
    /// The kind as written; [`PolicyKind::from_kind`] decides whether ivory serves it.
    pub kind: String,
    /// Name, namespace and the labels and annotations reports copy.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the policy matches and checks.
    pub spec: PolicySpec,
}

/// The subset of Kubernetes `ObjectMeta` a policy needs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Identifies the policy in routes (`/ivpol/validate/<name>`), messages and reports.
    #[serde(default)]
    pub name: String,
    /// Set on `NamespacedImageValidatingPolicy` only: the namespace whose requests it judges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Kubernetes UID when read from the API; kept so the document round-trips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Kubernetes resourceVersion when read from the API; kept so the document round-trips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Kept so the document round-trips; ivory does not act on it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Kept so the document round-trips; ivory does not act on it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// `spec` of both policy kinds. `attestors` and `validations` are required by the CRD.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    /// `spec.matchConstraints`: which requests (resources, operations, selectors) the policy
    /// concerns. Policy admission requires at least one resource rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_constraints: Option<MatchResources>,
    /// `spec.matchConditions`: CEL conditions that must all hold, or the policy is skipped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_conditions: Vec<NamedExpression>,
    /// `spec.matchImageReferences`: which images the policy concerns; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_image_references: Vec<MatchImageReference>,
    /// `spec.variables`: named CEL values, read as `variables.<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variables: Vec<NamedExpression>,
    /// `spec.validationActions` as written (`Deny`, `Warn`, `Audit`); see
    /// [`PolicySpec::validation_actions`] for the default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation_actions: Vec<String>,
    /// `spec.failurePolicy` as written; see [`PolicySpec::failure_policy`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<String>,
    /// `spec.auditAnnotations`: values recorded as report properties.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit_annotations: Vec<AuditAnnotation>,
    /// Required by the CRD; `None` means the key was missing (a validation error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validations: Option<Vec<Validation>>,
    /// `spec.webhookConfiguration`: settings of the policy's own webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_configuration: Option<WebhookConfiguration>,
    /// `spec.evaluation`: input mode and whether admission and background scans run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<Evaluation>,
    /// `spec.validationConfigurations`: the digest-pinning, digest and `required` checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_configurations: Option<ValidationConfigurations>,
    /// `spec.credentials`: how to authenticate to registries for this policy's images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<Credentials>,
    /// `spec.images`: custom CEL image extractors, read as `images.<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<NamedExpression>,
    /// Required by the CRD (may be `[]`); `None` means the key was missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestors: Option<Vec<Attestor>>,
    /// `spec.attestations`: the attestation types validations may verify.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attestations: Vec<Attestation>,
    /// `spec.autogen`: which pod controllers the policy is extended to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autogen: Option<Autogen>,
}

/// `spec.matchConstraints` (`admissionregistration.k8s.io/v1` `MatchResources`): which
/// requests concern the policy. Also the source of the generated webhooks' rules.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MatchResources {
    /// Labels the request's namespace must carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Labels the object (or old object) must carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_selector: Option<LabelSelector>,
    /// Requests matching any of these rules are concerned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_rules: Vec<NamedRuleWithOperations>,
    /// Requests matching any of these rules are not concerned, even when included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_resource_rules: Vec<NamedRuleWithOperations>,
    /// `Exact` or `Equivalent` (the API default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_policy: Option<String>,
}

/// One `spec.matchConstraints.resourceRules[]` (or `excludeResourceRules[]`) entry: the
/// operations on which resources a rule covers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamedRuleWithOperations {
    /// Object names the rule is limited to; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    /// `CREATE`, `UPDATE`, `DELETE`, `CONNECT` or `*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operations: Vec<String>,
    /// API groups (`""` is core, `*` any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    /// API versions (`*` any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_versions: Vec<String>,
    /// Resource plurals, optionally with a subresource (`pods/ephemeralcontainers`, `*/*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// `Cluster`, `Namespaced` or `*` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// A Kubernetes label selector (`matchConstraints.namespaceSelector` / `objectSelector`):
/// every requirement must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must be present with exactly these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Further requirements, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry: operator `In`, `NotIn`, `Exists` or `DoesNotExist`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    /// The label the requirement is about.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// The values `In`/`NotIn` compare against; empty for the other operators.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// A named CEL expression: `spec.matchConditions[]`, `spec.variables[]` and `spec.images[]`
/// share this shape.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamedExpression {
    /// The key the result is bound under (`variables.<name>`, `images.<name>`), or the
    /// condition's name in messages.
    #[serde(default)]
    pub name: String,
    /// CEL source text.
    #[serde(default)]
    pub expression: String,
}

/// `spec.matchImageReferences[]`: one way of saying which images the policy concerns; exactly
/// one of `glob` or `expression`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MatchImageReference {
    /// Glob over the image string; `*` also matches `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub glob: Option<String>,
    /// CEL boolean over the image string, bound as `ref`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
}

/// `spec.auditAnnotations[]`: a value computed per request and recorded as a report property
/// (not returned to the API server).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditAnnotation {
    /// The report property the value is stored under.
    #[serde(default)]
    pub key: String,
    /// CEL string (or null to omit the property).
    #[serde(default)]
    pub value_expression: String,
}

/// `spec.validations[]`: one check the request must pass, and the message when it does not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Validation {
    /// CEL boolean; `false` fails the policy.
    #[serde(default)]
    pub expression: String,
    /// Failure text when `messageExpression` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// CEL string giving the failure text per request; wins over `message`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_expression: Option<String>,
    /// Accepted and unused, as in Kyverno.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `spec.webhookConfiguration`: settings that give the policy a webhook of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookConfiguration {
    /// The API server's timeout for the policy's webhook (1–30 s); setting it gives the
    /// policy a fine-grained webhook of its own, and ivory's time budget follows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
}

/// `spec.evaluation`: what input the policy reads and in which contexts (admission, background)
/// it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Evaluation {
    /// `Kubernetes` (default) or `JSON`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `evaluation.admission.enabled` (default true): whether admission requests are judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Enabled>,
    /// `evaluation.background.enabled` (default true): whether background scans judge
    /// existing resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<Enabled>,
}

/// `{enabled: bool}`; absent means enabled.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Enabled {
    /// `None` means enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `spec.validationConfigurations`: the checks beyond `validations` (digest pinning, digest
/// references, `required`); each flag defaults to `true`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidationConfigurations {
    /// Pin matched images to their digests in the mutating stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutate_digest: Option<bool>,
    /// Fail when a matched image is not referenced by digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_digest: Option<bool>,
    /// Fail when a matched image was verified by no policy of the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
}

/// `spec.credentials`: how this policy's images are fetched; when present it replaces the
/// global registry options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    /// Allow plain HTTP and unverified TLS to the registries of this policy's images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_insecure_registry: Option<bool>,
    /// `default`, `amazon`, `azure`, `google`, `github`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<String>,
    /// `kubernetes.io/dockerconfigjson` secrets: `name` (ivory's namespace) or `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

/// `spec.attestors[]`: one trusted signer, a name and exactly one of `cosign` or `notary`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attestor {
    /// The key validations use: `attestors.<name>`.
    #[serde(default)]
    pub name: String,
    /// Verify cosign / Sigstore signatures and attestations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cosign: Option<Cosign>,
    /// Notary v2 certificates; accepted by validation, verification reports it unsupported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notary: Option<Notary>,
}

/// `spec.attestors[].cosign`: a cosign / Sigstore signer. Precedence inside one attestor: keyless, then key, then certificate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cosign {
    /// `cosign.annotations`: key/values every accepted signature payload must carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// `cosign.certificate`: trust a given signing certificate (and chain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<CosignCertificate>,
    /// `cosign.ctlog`: transparency-log (Rekor), CT log and timestamp-authority settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctlog: Option<Ctlog>,
    /// `cosign.key`: trust signatures made with one public key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<CosignKey>,
    /// `cosign.keyless`: trust Fulcio certificates issued to the given identities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyless: Option<Keyless>,
    /// `cosign.source`: where signatures are stored when not beside the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// `cosign.trustedRoot`: a Sigstore trusted-root JSON replacing the public-good root
    /// (private Sigstore deployments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_root: Option<StringSource>,
    /// `cosign.tuf`: a TUF mirror or root; ivory has no TUF client and rejects it unless a
    /// `trustedRoot` is also given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuf: Option<Tuf>,
}

/// Text given literally or computed per request: `{value}` xor `{expression}` (certificates,
/// chains, trusted roots, notary certs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StringSource {
    /// The literal text (PEM or JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// CEL string evaluated per request, used as the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
}

/// `spec.attestors[].cosign.certificate`: trust signatures made by one given certificate,
/// optionally checked against its chain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CosignCertificate {
    /// The signing certificate (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<StringSource>,
    /// The chain from the certificate to its root (PEM); also the trust anchor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_chain: Option<StringSource>,
}

/// `spec.attestors[].cosign.ctlog`: which transparency evidence a signature needs and whose
/// keys vouch for it (Rekor, CT log, timestamp authority).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ctlog {
    /// PEM key of the CT log that signs Fulcio certificates' SCTs, instead of the trusted
    /// root's.
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
    /// Accept signatures without transparency-log evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_ignore_tlog: Option<bool>,
    /// PEM key of the Rekor instance, instead of the trusted root's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rekor_pub_key: Option<String>,
    /// PEM chain of an RFC 3161 timestamp authority whose timestamps are accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tsa_cert_chain: Option<String>,
    /// Rekor URL; required when `ctlog` is set unless `insecureIgnoreTlog` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// `spec.attestors[].cosign.key`: trust signatures made with one public key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CosignKey {
    /// The public key (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// CEL string giving the PEM key per request (e.g. from a ConfigMap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
    /// `sha224`, `sha256` (default), `sha384`, `sha512`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_algorithm: Option<String>,
    /// A KMS key URI; rejected by validation (ivory reads no KMS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms: Option<String>,
}

/// `spec.attestors[].cosign.keyless`: trust short-lived Fulcio certificates issued to the listed
/// OIDC identities.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Keyless {
    /// Fulcio certificate extensions (GitHub workflow claims) that must have these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_extensions: BTreeMap<String, serde_json::Value>,
    /// Accepted signers; a certificate must match at least one.
    #[serde(default)]
    pub identities: Vec<Identity>,
    /// PEM roots replacing Fulcio's (a private CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roots: Option<String>,
}

/// `spec.attestors[].cosign.keyless.identities[]`: one accepted signer identity; any identity
/// may match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    /// OIDC issuer the certificate must name exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// Subject (SAN) the certificate must name exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Regular expression for the issuer; wins over `issuer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_reg_exp: Option<String>,
    /// Regular expression for the subject; wins over `subject`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_reg_exp: Option<String>,
    /// CEL string evaluated per request; the subject must also equal it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_expression: Option<String>,
}

/// `spec.attestors[].cosign.source`: where signatures are stored when not beside the image.
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
    /// Repository holding the signatures instead of the image's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// Prefix of the signature tags (`<prefix>sha256-<hex>.sig`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag_prefix: Option<String>,
}

/// `spec.attestors[].cosign.source.PullSecrets[]`: a secret by name (ivory does not read it;
/// see `ivory_verify`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// The secret's name.
    #[serde(default)]
    pub name: String,
}

/// `spec.attestors[].cosign.tuf`: where Kyverno fetches the Sigstore trust root over TUF; ivory
/// has no TUF client and accepts it only beside a `trustedRoot`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tuf {
    /// TUF repository URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<String>,
    /// The TUF root to start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<TufRoot>,
}

/// `spec.attestors[].cosign.tuf.root`: the initial TUF root to trust.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TufRoot {
    /// Base64 `root.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// File path or URL of `root.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// `spec.attestors[].notary`: a Notary Project (Notation) signer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notary {
    /// CA or leaf certificates (PEM) trusted for Notary signatures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certs: Option<StringSource>,
    /// Timestamp-authority certificates (PEM) for Notary signatures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tsa_certs: Option<StringSource>,
    /// ivory's trust-policy extension for this attestor, from the policy's
    /// `ivory.dev/notation-trust-policy` annotation ([`crate::notation`]). Never read from the
    /// spec (Kyverno's CRD has no such field; written there it is an unknown field); serialized
    /// so that it is part of the attestor's identity in verification cache keys.
    #[serde(
        default,
        skip_deserializing,
        skip_serializing_if = "Option::is_none",
        rename = "ivory.dev/notationTrustPolicy"
    )]
    pub trust_policy: Option<crate::notation::NotationTrustPolicy>,
}

/// `spec.attestations[]`: an attestation validations may verify, a name and exactly one of
/// `intoto` or `referrer`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attestation {
    /// The key validations use: `attestations.<name>`.
    #[serde(default)]
    pub name: String,
    /// An in-toto attestation signed with cosign, by predicate type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intoto: Option<TypeRef>,
    /// An OCI 1.1 referrer, by artifactType (Notary-signed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub referrer: Option<TypeRef>,
}

/// `{type}`: an in-toto predicate type or an OCI referrer artifactType.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeRef {
    /// The predicate type or artifactType.
    #[serde(default, rename = "type")]
    pub type_: String,
}

/// `spec.autogen`: extends a pod policy to the pod templates of controllers (see
/// `docs/kyverno-semantics.md` §5).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Autogen {
    /// Which pod controllers get variants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_controllers: Option<PodControllers>,
}

/// `spec.autogen.podControllers`: which controllers get variants; `controllers: []` disables autogen, absent means all six.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodControllers {
    /// A subset of [`POD_CONTROLLERS`]; `[]` disables autogen, absent means all six.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controllers: Option<Vec<String>>,
}

/// One `spec.validationActions` entry: what a failure or error of the policy does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ValidationAction {
    /// Record the result in reports only.
    Audit,
    /// A failure or error denies the request.
    Deny,
    /// A failure or error is returned as a warning.
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

/// `spec.failurePolicy`: what happens when ivory cannot reach a verdict (budget spent, registry unreachable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FailurePolicy {
    /// Deny, naming the image and the reason (the default).
    Fail,
    /// Admit with a warning and an audit annotation.
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
