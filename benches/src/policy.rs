//! The policies ivory serves during the run: one per image source, each requiring a cosign
//! key signature on every container image it matches (Kyverno's verifyImageSignatures check).

/// An ImageValidatingPolicy for pods whose images match `glob`, verified with `key_pem`.
pub fn key_policy(name: &str, glob: &str, key_pem: &str) -> String {
    let key: String = key_pem
        .lines()
        .map(|l| format!("            {l}\n"))
        .collect();
    format!(
        "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata:
  name: {name}
spec:
  failurePolicy: Fail
  validationActions: [Deny]
  matchConstraints:
    resourceRules:
      - apiGroups: [\"\"]
        apiVersions: [v1]
        operations: [CREATE, UPDATE]
        resources: [pods]
  matchImageReferences:
    - glob: \"{glob}\"
  validationConfigurations:
    mutateDigest: true
    verifyDigest: true
    required: true
  attestors:
    - name: key
      cosign:
        key:
          data: |
{key}        ctlog:
          insecureIgnoreTlog: true
          insecureIgnoreSCT: true
  validations:
    - expression: >-
        images.containers.map(image, verifyImageSignatures(image, [attestors.key])).all(e, e > 0)
      message: failed the image Signature verification
"
    )
}
