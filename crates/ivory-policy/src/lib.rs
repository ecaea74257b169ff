//! ivory-policy: Kyverno `ImageValidatingPolicy` types, loading, validation and compilation.
//!
//! Raw documents ([`types::PolicyDocument`]) go through [`compile`] exactly once and become
//! [`CompiledPolicy`] values with every CEL program, glob and regexp checked. Loading
//! ([`load_path`], [`load_str`]) collects every error of every document instead of stopping at the
//! first. This crate is synchronous and does no IO besides reading policy files; evaluation is
//! the engine's.
//!
//! # What this crate owns
//!
//! * The serde model of the CRDs ([`types`]: `ImageValidatingPolicy` and
//!   `NamespacedImageValidatingPolicy` of `policies.kyverno.io` v1alpha1, v1beta1 and v1, and the
//!   pre-release kind name `ImageVerificationPolicy`).
//! * Loading files and folders (multi-document YAML, JSON: [`policy_files`], [`PolicyFiles`],
//!   [`read_policy_files`], [`LoadReport`]), validation with Kyverno's messages (the CRD's
//!   structural checks in `spec_checks`), and compilation of every CEL program, glob and regex
//!   once ([`compile`]).
//! * Autogen variants for pod controllers ([`autogen_rules`],
//!   [`CompiledPolicy::autogen_eligible`]), and the implied `pods/ephemeralcontainers`
//!   subresource of a rule selecting pods ([`ephemeral`]), so `kubectl debug` cannot bypass a
//!   pod policy.
//! * The ivory extension annotations: `ivory.dev/digest-pinning` ([`Pinning`]),
//!   `ivory.dev/verify-platforms` ([`VerifyPlatforms`]) and `ivory.dev/notation-trust-policy`
//!   ([`notation`]: the Notation trust policy of each notary attestor, checked at load).
//! * [`CompiledPolicy`]: every program compiled once. Its written spec stays inside this crate;
//!   other crates read it through typed accessors ([`CompiledPolicy::credentials`],
//!   [`CompiledPolicy::allows_insecure_registry`], [`CompiledPolicy::admission_enabled`],
//!   [`CompiledPolicy::background_enabled`], [`CompiledPolicy::timeout_seconds`],
//!   [`CompiledPolicy::written_match_conditions`], [`CompiledPolicy::autogen_eligible`]).
//!   [`CompiledPolicy::new`] and [`CompiledPolicy::with_spec`] start a policy built field by
//!   field. [`CompiledPolicy::derived`] is a [`DerivedSlot`] where the engine keeps what it
//!   derives once per policy version, empty on every clone, so an autogen variant or a policy
//!   changed field by field never inherits another's.
//! * The embedded default policy ([`DEFAULT_POLICY_YAML`], [`default_policy`]).
//! * What each policy reads from the cluster ([`cluster_reads`], kept as the policy's
//!   [`ClusterReads`]): `resource.Get`/`resource.List`/`globalContext.Get` calls found at load,
//!   whose `apiVersion`, `resource` and entry names must be literals; Secrets, subresources,
//!   `resource.Post` and `http` are refused. The server watches what these name; the engine
//!   confines each read to them.
//! * PolicyExceptions ([`exception`], [`CompiledException`]): `policyRefs` by name and kind,
//!   `matchConditions` compiled with `object`, `oldObject`, `request`, `namespaceObject`;
//!   `expiresAt` honoured; `images`/`allowedValues` and unknown fields refused. The engine
//!   applies them.
//! * CEL is bounded at load: an expression whose worst-case cost exceeds ivory-cel's static
//!   limit is refused, naming the policy and field.

mod autogen;
mod blind_spots;
pub mod cluster_reads;
mod compile;
pub mod compiled;
mod derived;
pub mod ephemeral;
mod error;
pub mod exception;
mod glob;
mod load;
pub mod notation;
pub mod pem;
mod refs;
mod spec_checks;
pub mod types;
mod unknown;
pub mod yaml;

#[cfg(test)]
mod testutil;

pub use autogen::{CRONJOBS, DEFAULTS, autogen_rules, eligible_rule, rewrite as autogen_rewrite};
pub use blind_spots::blind_spots;
pub use cluster_reads::{ClusterReads, ResourceRead};
pub use compile::compile;
pub use compiled::{
    CompiledAttestor, CompiledAuditAnnotation, CompiledPolicy, CompiledValidation, ImageMatcher,
    NAMESPACE_PINNING_ANNOTATION, NAMESPACE_PINNING_LABEL, NamedProgram, Origin,
    PINNING_ANNOTATION, Pinning, VERIFY_PLATFORMS_ANNOTATION, VerifyPlatforms,
};
pub use derived::DerivedSlot;
pub use error::{PolicyError, Result};
pub use exception::CompiledException;
pub use glob::{GlobError, compile_image_glob};
pub use load::{
    DocumentError, LoadReport, PolicyFiles, SyntaxError, YamlDocument, documents, load_path,
    load_str, policy_files, read_policy_files, yaml_documents,
};

/// The embedded default policy (`policies/default.yaml`): pin every pod image to its digest.
pub const DEFAULT_POLICY_YAML: &str = include_str!("../../../policies/default.yaml");

/// The embedded default policy, compiled. It has no file origin, so errors would read
/// `ImageValidatingPolicy/ivory-pin-digests`.
pub fn default_policy() -> CompiledPolicy {
    let report = load_str(DEFAULT_POLICY_YAML, "embedded default policy");
    let mut policies = report.policies.into_iter();
    // The text is compiled into the binary and `tests::default_policy_loads` proves it valid,
    // so a failure here is a build defect, not bad input.
    let mut policy = policies
        .next()
        .expect("embedded policies/default.yaml must compile");
    policy.origin = Origin {
        file: None,
        document: 1,
    };
    for variant in &mut policy.autogen {
        variant.origin = policy.origin.clone();
    }
    policy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_loads() {
        let report = load_str(DEFAULT_POLICY_YAML, "default.yaml");
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(report.policies.len(), 1);
        let p = default_policy();
        assert_eq!(p.name, "ivory-pin-digests");
        assert_eq!(p.kind, types::PolicyKind::ImageValidatingPolicy);
        assert_eq!(
            p.origin,
            Origin {
                file: None,
                document: 1
            }
        );
        assert!(p.mutate_digest && p.verify_digest && !p.required);
        assert_eq!(p.failure_policy, types::FailurePolicy::Fail);
        assert!(p.attestors.is_empty());
        assert_eq!(p.validations.len(), 1);
        let rule = &p.match_constraints.resource_rules[0];
        assert_eq!(rule.resources, ["pods", "pods/ephemeralcontainers"]);
        assert_eq!(rule.operations, ["CREATE", "UPDATE"]);
        assert_eq!(
            p.match_constraints.resource_rules.len(),
            1,
            "nothing implied"
        );
        assert_eq!(
            p.autogen
                .iter()
                .map(|v| v.autogen_config.as_deref())
                .collect::<Vec<_>>(),
            [Some(DEFAULTS), Some(CRONJOBS)]
        );
    }
}
