//! The policies ivory serves during the run: one per image source, each requiring a cosign
//! key signature on every container image it matches (Kyverno's verifyImageSignatures check).

use ivory_testkit::policy::{VERIFY_SIGNATURES, key_attestor_yaml, pod_policy};

/// An ImageValidatingPolicy for pods whose images match `glob`, verified with `key_pem`.
pub fn key_policy(name: &str, glob: &str, key_pem: &str) -> String {
    let attestors = key_attestor_yaml(key_pem);
    pod_policy(
        name,
        glob,
        &format!(
            "  failurePolicy: Fail
  validationActions: [Deny]
  validationConfigurations:
    mutateDigest: true
    verifyDigest: true
    required: true
{attestors}  validations:
    - expression: >-
        {VERIFY_SIGNATURES}
      message: failed the image Signature verification
"
        ),
    )
}
