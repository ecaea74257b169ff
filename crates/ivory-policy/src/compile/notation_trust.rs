//! The `ivory.dev/notation-trust-policy` annotation compiled into the policy's `notary`
//! attestors (the types and their checks are `crate::notation`'s).

use std::collections::BTreeMap;

use crate::error::Errors;
use crate::notation::{NOTATION_TRUST_POLICY_ANNOTATION, NotationTrustPolicy};
use crate::types::PolicySpec;

/// Reads [`NOTATION_TRUST_POLICY_ANNOTATION`] and writes each entry into its `notary`
/// attestor of `spec`. Every problem is an error at the annotation's field.
pub(crate) fn apply(
    annotations: &BTreeMap<String, String>,
    spec: &mut PolicySpec,
    errs: &mut Errors,
) {
    let Some(text) = annotations.get(NOTATION_TRUST_POLICY_ANNOTATION) else {
        return;
    };
    let field = format!("metadata.annotations[{NOTATION_TRUST_POLICY_ANNOTATION}]");
    let policies: BTreeMap<String, NotationTrustPolicy> = match serde_json::from_str(text) {
        Ok(p) => p,
        Err(e) => {
            errs.invalid(
                field,
                format!("not a JSON object of attestor name to Notation trust policy: {e}"),
            );
            return;
        }
    };
    for (name, policy) in policies {
        let at = format!("{field}.{name}");
        for (key, problem) in policy.problems() {
            errs.invalid(format!("{at}.{key}"), problem);
        }
        let attestor = spec.attestors.iter_mut().flatten().find(|a| a.name == name);
        match attestor.and_then(|a| a.notary.as_mut()) {
            Some(notary) => notary.trust_policy = Some(policy),
            None => errs.invalid(
                at,
                format!("spec.attestors has no notary attestor named {name:?}"),
            ),
        }
    }
}
