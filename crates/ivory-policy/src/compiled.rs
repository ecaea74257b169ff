//! The checked, compiled form of a policy. The engine only ever sees [`CompiledPolicy`]:
//! every CEL program, glob and regex is compiled once at load, never per request.

use std::path::PathBuf;
use std::sync::Arc;

use ivory_cel::Program;

use crate::types::{
    Attestation, Attestor, Credentials, FailurePolicy, MatchResources, NamedExpression, PolicyKind,
    PolicySpec, ValidationAction,
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
    /// The entry's `name`: the key under `variables.` / `images.`, or the condition named in
    /// errors.
    pub name: String,
    /// The compiled `expression`.
    pub program: Program,
}

/// One `matchImageReferences` entry.
#[derive(Clone, Debug)]
pub enum ImageMatcher {
    /// gobwas-style glob without separators: `*` also matches `/`.
    Glob {
        /// `matchImageReferences[].glob` as written, for messages.
        pattern: String,
        /// The compiled glob the image string is tested against.
        matcher: globset::GlobMatcher,
    },
    /// CEL boolean over the variable `ref` (string).
    Expression(Program),
}

/// One `validations` entry.
#[derive(Clone, Debug)]
pub struct CompiledValidation {
    /// `validations[].expression`: the boolean that must hold for the policy to pass.
    pub expression: Program,
    /// `validations[].message`: the failure text when no `messageExpression` applies.
    pub message: Option<String>,
    /// `validations[].messageExpression`: a string computed per request, preferred over
    /// `message`.
    pub message_expression: Option<Program>,
}

/// One `auditAnnotations` entry.
#[derive(Clone, Debug)]
pub struct CompiledAuditAnnotation {
    /// `auditAnnotations[].key`: the report property the value is stored under.
    pub key: String,
    /// `auditAnnotations[].valueExpression`: a string, or null to leave the property out.
    pub value_expression: Program,
}

/// An attestor plus its CEL-sourced fields, compiled. `fields` holds (JSON pointer inside the
/// attestor object, program), e.g. `("/cosign/key/data", <key.expression>)`: the engine evaluates
/// each program per request and writes the string result at that pointer before verification.
#[derive(Clone, Debug)]
pub struct CompiledAttestor {
    /// The `attestors[]` entry as written.
    pub attestor: Attestor,
    /// The `…expression` fields of the attestor (key, certificate, chain, notary certs,
    /// trustedRoot), as described above.
    pub fields: Vec<(String, Program)>,
    /// `attestor` as the JSON object CEL sees, serialized once at compile time (used as is
    /// when `fields` is empty).
    pub json: serde_json::Value,
}

/// The policy annotation that chooses where a policy pins digests (an ivory extension, see
/// `docs/kyverno-semantics.md` §3): `all` (Kyverno's behaviour, the default), `pods-only` or
/// `no-patch`. Kyverno ignores it and pins everywhere, so a policy moved to Kyverno only pins
/// more, never verifies less.
pub const PINNING_ANNOTATION: &str = "ivory.dev/digest-pinning";

/// The Namespace label that chooses how the namespace's requests are pinned under a policy:
/// `pods-only` always, `no-patch` only where the policy allows it with
/// [`NAMESPACE_PINNING_ANNOTATION`] (see [`Pinning::effective`] and docs/SECURITY.md).
pub const NAMESPACE_PINNING_LABEL: &str = "ivory.dev/digest-pinning";

/// The policy annotation that lets namespaces choose `no-patch` with
/// [`NAMESPACE_PINNING_LABEL`]: `pods-only` (the default: namespaces may only narrow pinning
/// to Pods) or `any`. Only the policy author can open the tag window `no-patch` brings.
pub const NAMESPACE_PINNING_ANNOTATION: &str = "ivory.dev/namespace-digest-pinning";

/// Where a policy's digest pins go, and so where the validating stage demands a digest
/// (`verifyDigest`). Verification itself is the same in every mode: every matched image is
/// verified by the digest its reference names or its tag resolves to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pinning {
    /// Kyverno's behaviour: Pods and the pod templates of controllers are pinned.
    #[default]
    All,
    /// Only Pods are pinned; controllers' templates are left as applied, so GitOps tools
    /// see no drift. Every Pod still runs a pinned digest.
    PodsOnly,
    /// Nothing is patched; tags are resolved and the digest they name now is verified.
    NoPatch,
}

impl Pinning {
    /// The annotation and label values, in the order of the variants.
    pub const VALUES: [&'static str; 3] = ["all", "pods-only", "no-patch"];

    /// The mode a value of [`PINNING_ANNOTATION`] names.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "all" => Some(Self::All),
            "pods-only" => Some(Self::PodsOnly),
            "no-patch" => Some(Self::NoPatch),
            _ => None,
        }
    }

    /// The value as written in the annotation.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::PodsOnly => "pods-only",
            Self::NoPatch => "no-patch",
        }
    }

    /// The mode for one request: the policy's, narrowed by the request's Namespace label
    /// [`NAMESPACE_PINNING_LABEL`]: to `pods-only` always (no Pod runs unpinned), to `no-patch`
    /// only when `namespace_may_skip` (the policy's [`NAMESPACE_PINNING_ANNOTATION`] is `any`).
    /// A label never widens pinning; a value it may not choose is ignored (and said, see
    /// [`Pinning::ignored_namespace_label`]).
    pub fn effective(
        self,
        namespace_object: Option<&serde_json::Value>,
        namespace_may_skip: bool,
    ) -> Self {
        match (self, namespace_label(namespace_object)) {
            (Self::All, Some("pods-only")) => Self::PodsOnly,
            (Self::All | Self::PodsOnly, Some("no-patch")) if namespace_may_skip => Self::NoPatch,
            _ => self,
        }
    }

    /// The Namespace label's value when it is one this policy does not let the namespace
    /// choose, for a warning.
    pub fn ignored_namespace_label(
        namespace_object: Option<&serde_json::Value>,
        namespace_may_skip: bool,
    ) -> Option<&str> {
        namespace_label(namespace_object).filter(|v| match *v {
            "all" | "pods-only" => false,
            "no-patch" => !namespace_may_skip,
            _ => true,
        })
    }

    /// The value of the Namespace's [`NAMESPACE_PINNING_LABEL`], if it has one.
    pub fn namespace_label(namespace_object: Option<&serde_json::Value>) -> Option<&str> {
        namespace_label(namespace_object)
    }

    /// Whether an object of `kind` gets pins (and must carry digests) in this mode.
    pub fn pins(self, kind: &str) -> bool {
        match self {
            Self::All => true,
            Self::PodsOnly => kind == "Pod",
            Self::NoPatch => false,
        }
    }
}

fn namespace_label(namespace_object: Option<&serde_json::Value>) -> Option<&str> {
    namespace_object?
        .get("metadata")?
        .get("labels")?
        .get(NAMESPACE_PINNING_LABEL)?
        .as_str()
}

/// The policy annotation that chooses which manifests of a multi-platform image its signature
/// and attestation checks cover (an ivory extension: the API server prunes fields Kyverno's
/// CRD does not declare from `spec`, never annotations).
pub const VERIFY_PLATFORMS_ANNOTATION: &str = "ivory.dev/verify-platforms";

/// What must be signed when an image is an index (a multi-platform image), from
/// [`VERIFY_PLATFORMS_ANNOTATION`]. A single-manifest image is that manifest under all three.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum VerifyPlatforms {
    /// `index` (Kyverno's behaviour, the default): the digest the image names or its tag
    /// resolves to, the index itself.
    #[default]
    Index,
    /// `allPlatforms`: every platform manifest of the index.
    AllPlatforms,
    /// `podPlatform`: the manifests of the platforms the Pod can run on (its `nodeSelector` and
    /// required node affinity on `kubernetes.io/os` and `kubernetes.io/arch`; every platform
    /// when it pins none).
    PodPlatform,
}

impl VerifyPlatforms {
    /// The annotation values, in the order of the variants.
    pub const VALUES: [&'static str; 3] = ["index", "allPlatforms", "podPlatform"];

    /// The variant an annotation value names.
    pub fn from_annotation(value: &str) -> Option<Self> {
        match value {
            "index" => Some(Self::Index),
            "allPlatforms" => Some(Self::AllPlatforms),
            "podPlatform" => Some(Self::PodPlatform),
            _ => None,
        }
    }
}

/// A policy ready for evaluation.
#[derive(Clone, Debug)]
pub struct CompiledPolicy {
    /// Cluster or namespaced policy: decides the route (`/ivpol` or `/nivpol`) it serves.
    pub kind: PolicyKind,
    /// `metadata.name`; shared by the autogen variants, and the name in messages and routes.
    pub name: String,
    /// Set for `NamespacedImageValidatingPolicy` only.
    pub namespace: Option<String>,
    /// The file and document the policy was loaded from.
    pub origin: Origin,
    /// The spec as written: read only inside this crate. Other crates read what they need
    /// through the typed accessors ([`CompiledPolicy::credentials`],
    /// [`CompiledPolicy::admission_enabled`], [`CompiledPolicy::timeout_seconds`], ...).
    pub(crate) spec: Arc<PolicySpec>,
    /// Hex sha256 of kind, namespace, name and the canonical JSON of the spec: changes whenever
    /// the policy changes, so it can be part of verification cache keys.
    pub hash: String,
    /// `spec.validationActions`, defaulted to `[Deny]`: what a failure or error does to the
    /// answer.
    pub actions: Vec<ValidationAction>,
    /// `spec.failurePolicy`, defaulted to `Fail`: what ivory does when it cannot decide in time
    /// or the registry fails, and which webhook (`-fail`/`-ignore`) the policy lands in.
    pub failure_policy: FailurePolicy,
    /// After autogen this is the variant's rules (controllers), not the pod rule.
    /// Also lists `pods/ephemeralcontainers` wherever the written rules name `pods`, so
    /// `kubectl debug` cannot bypass a pod policy.
    pub match_constraints: MatchResources,
    /// `spec.matchConditions`: all must hold or the policy is skipped.
    pub match_conditions: Vec<NamedProgram>,
    /// `spec.matchImageReferences`: an image concerns the policy when any entry matches; empty
    /// means every image does.
    pub image_matchers: Vec<ImageMatcher>,
    /// `spec.variables`, in order (a variable may use earlier ones).
    pub variables: Vec<NamedProgram>,
    /// `spec.images`: custom extractors added to the built-in `images` map.
    pub image_extractors: Vec<NamedProgram>,
    /// `spec.validations`, evaluated in order until the first failure.
    pub validations: Vec<CompiledValidation>,
    /// `spec.auditAnnotations`: properties attached to the policy's report result.
    pub audit_annotations: Vec<CompiledAuditAnnotation>,
    /// `spec.attestors`: the trusted keys and identities, exposed to CEL as `attestors.<name>`.
    pub attestors: Vec<CompiledAttestor>,
    /// `spec.attestations`: the attestation types CEL may verify, as `attestations.<name>`.
    pub attestations: Vec<Attestation>,
    /// `spec.validationConfigurations.mutateDigest` (default true): take part in digest pinning.
    pub mutate_digest: bool,
    /// `spec.validationConfigurations.verifyDigest` (default true): fail when a matched image
    /// is not referenced by digest.
    pub verify_digest: bool,
    /// Where this policy pins digests (ivory extension, [`PINNING_ANNOTATION`]); the
    /// namespace may narrow it further ([`CompiledPolicy::pinning_for`]).
    pub pinning: Pinning,
    /// Whether a Namespace label may choose `no-patch` under this policy
    /// ([`NAMESPACE_PINNING_ANNOTATION`]: `any`).
    pub namespace_may_skip_pinning: bool,
    /// `spec.validationConfigurations.required` (default true): fail when a matched image was
    /// not verified by any policy of the request.
    pub required: bool,
    /// `spec.evaluation.mode: JSON`: only `object` is bound and images come from `spec.images`.
    pub json_mode: bool,
    /// Which manifests of an image index the signature and attestation checks cover
    /// ([`VERIFY_PLATFORMS_ANNOTATION`]).
    pub verify_platforms: VerifyPlatforms,
    /// `None` for the policy as written; `Some("defaults")` / `Some("cronjobs")` for autogen
    /// variants, which keep the parent's name and are evaluated exactly like it.
    pub autogen_config: Option<String>,
    /// The autogen variants of this policy (empty for variants and non-eligible policies).
    pub autogen: Vec<CompiledPolicy>,
    /// What its expressions read from the cluster (`resource.Get`/`List`,
    /// `globalContext.Get`): what ivory must watch for it.
    pub cluster_reads: crate::cluster_reads::ClusterReads,
    /// What the engine derives from this policy once per policy version (empty on a clone).
    pub derived: crate::DerivedSlot,
}

impl CompiledPolicy {
    /// A policy of `kind` named `name` that matches no resource and checks nothing, with an
    /// empty spec: where a policy built field by field (tests, tools) starts. Policies that are
    /// enforced come from [`crate::load_str`] and its siblings, which compile every field.
    pub fn new(kind: PolicyKind, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
            namespace: None,
            origin: Origin::default(),
            spec: Arc::new(PolicySpec::default()),
            hash: String::new(),
            actions: vec![ValidationAction::Deny],
            failure_policy: FailurePolicy::Fail,
            match_constraints: MatchResources::default(),
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
            pinning: Pinning::All,
            namespace_may_skip_pinning: false,
            required: true,
            json_mode: false,
            verify_platforms: VerifyPlatforms::default(),
            autogen_config: None,
            autogen: Vec::new(),
            cluster_reads: crate::cluster_reads::ClusterReads::default(),
            derived: crate::DerivedSlot::default(),
        }
    }

    /// This policy with `spec` as its written spec. Only what the accessors read from the spec
    /// changes ([`CompiledPolicy::credentials`], [`CompiledPolicy::admission_enabled`], ...):
    /// nothing is compiled again, so this is for policies built field by field (tests, tools).
    #[must_use]
    pub fn with_spec(mut self, spec: PolicySpec) -> Self {
        self.spec = Arc::new(spec);
        self
    }

    /// `spec.credentials`: how this policy's images are pulled (`None`: the global registry
    /// options).
    pub fn credentials(&self) -> Option<&Credentials> {
        self.spec.credentials.as_ref()
    }

    /// `spec.credentials.allowInsecureRegistry`, default `false`.
    pub fn allows_insecure_registry(&self) -> bool {
        self.credentials()
            .and_then(|c| c.allow_insecure_registry)
            .unwrap_or(false)
    }

    /// `spec.evaluation.admission.enabled`, default `true`: whether admission requests are
    /// judged by this policy.
    pub fn admission_enabled(&self) -> bool {
        self.spec.admission_enabled()
    }

    /// `spec.evaluation.background.enabled`, default `true`: whether background scans judge
    /// running Pods by this policy.
    pub fn background_enabled(&self) -> bool {
        self.spec.background_enabled()
    }

    /// `spec.webhookConfiguration.timeoutSeconds` when set.
    pub fn timeout_seconds(&self) -> Option<i32> {
        self.spec.timeout_seconds()
    }

    /// `spec.matchConditions` as written (name and expression text), for a webhook
    /// configuration that hands them to the API server; [`CompiledPolicy::match_conditions`]
    /// holds them compiled.
    pub fn written_match_conditions(&self) -> &[NamedExpression] {
        &self.spec.match_conditions
    }

    /// The pinning mode for a request in the namespace `namespace_object` ([`Pinning::effective`]).
    pub fn pinning_for(&self, namespace_object: Option<&serde_json::Value>) -> Pinning {
        self.pinning
            .effective(namespace_object, self.namespace_may_skip_pinning)
    }

    /// The namespace's pinning label when this policy ignores it (for a warning).
    pub fn ignored_namespace_pinning<'n>(
        &self,
        namespace_object: Option<&'n serde_json::Value>,
    ) -> Option<&'n str> {
        Pinning::ignored_namespace_label(namespace_object, self.namespace_may_skip_pinning)
    }

    /// Whether the policy can ever pin a digest, so needs a mutating webhook:
    /// `mutateDigest` and a [`Pinning`] mode other than `no-patch` (a namespace cannot widen it).
    pub fn pins_digests(&self) -> bool {
        self.mutate_digest && self.pinning != Pinning::NoPatch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata:
  name: accessors
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: ['']
      apiVersions: ['v1']
      operations: ['CREATE']
      resources: ['pods']
  matchConditions:
  - name: labelled
    expression: has(object.metadata.labels)
  evaluation:
    admission:
      enabled: false
  webhookConfiguration:
    timeoutSeconds: 7
  credentials:
    allowInsecureRegistry: true
    secrets: [regcred]
  attestors:
  - name: signer
    cosign:
      keyless:
        identities:
        - issuer: https://issuer.example
          subject: someone@example.com
  validations:
  - expression: 'true'
";

    #[test]
    fn accessors_read_the_written_spec() {
        let report = crate::load_str(POLICY, "accessors.yaml");
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        let policy = &report.policies[0];
        assert_eq!(
            policy.credentials().map(|c| c.secrets.clone()),
            Some(vec!["regcred".to_owned()])
        );
        assert!(policy.allows_insecure_registry());
        assert!(!policy.admission_enabled());
        assert!(policy.background_enabled());
        assert_eq!(policy.timeout_seconds(), Some(7));
        let written = policy.written_match_conditions();
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].name, "labelled");
        assert_eq!(written[0].expression, "has(object.metadata.labels)");
        assert!(policy.autogen_eligible());
    }

    #[test]
    fn a_policy_built_field_by_field_has_the_specs_defaults() {
        let policy = CompiledPolicy::new(PolicyKind::ImageValidatingPolicy, "bare");
        assert_eq!(policy.credentials(), None);
        assert!(!policy.allows_insecure_registry());
        assert!(policy.admission_enabled() && policy.background_enabled());
        assert_eq!(policy.timeout_seconds(), None);
        assert!(!policy.autogen_eligible());
        let with = policy.with_spec(PolicySpec {
            credentials: Some(Credentials {
                allow_insecure_registry: Some(true),
                ..Credentials::default()
            }),
            ..PolicySpec::default()
        });
        assert!(with.allows_insecure_registry());
    }
}
