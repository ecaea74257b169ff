//! ImageValidatingPolicy YAML pieces shared by the tests and benchmarks.

/// Kyverno's signature check: every container image verified by the attestor named `key`.
pub const VERIFY_SIGNATURES: &str =
    "images.containers.map(image, verifyImageSignatures(image, [attestors.key])).all(e, e > 0)";

/// A spec that checks nothing about the images (no digest pinning or verification, no
/// attestors), for policies whose validations are about something else.
pub const NO_IMAGE_CHECKS: &str = "  validationConfigurations:
    mutateDigest: false
    verifyDigest: false
    required: false
  attestors: []
";

/// `spec.attestors` (at spec indentation) with one cosign key attestor named `key` holding
/// `pem`, without transparency log or SCT checks.
pub fn key_attestor_yaml(pem: &str) -> String {
    let key: String = pem.lines().map(|l| format!("            {l}\n")).collect();
    format!(
        "  attestors:
    - name: key
      cosign:
        key:
          data: |
{key}        ctlog:
          insecureIgnoreTlog: true
          insecureIgnoreSCT: true
"
    )
}

/// A cosign key attestor named `key` holding `pem`, without transparency log, as the JSON of
/// one `spec.attestors[]` entry: for tests that build ivory's `Attestor` from it
/// (`serde_json::from_value`). Unlike [`key_attestor_yaml`] it leaves the SCT check unset.
pub fn key_attestor_json(pem: &str) -> serde_json::Value {
    serde_json::json!({
        "name": "key",
        "cosign": {"key": {"data": pem}, "ctlog": {"insecureIgnoreTlog": true}},
    })
}

/// An ImageValidatingPolicy for Pods as YAML: the header and `matchConstraints` every test
/// policy repeats, and the parts tests vary. Fields a test leaves unset are left out, so the
/// policy gets Kyverno's defaults.
#[derive(Debug, Clone)]
pub struct PodPolicy {
    name: String,
    annotations: Vec<(String, String)>,
    namespace_selector: Option<String>,
    operations: String,
    globs: Vec<String>,
    spec: String,
}

impl PodPolicy {
    /// A policy named `name` matching Pod CREATE and UPDATE in every namespace.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            annotations: Vec::new(),
            namespace_selector: None,
            operations: "CREATE, UPDATE".to_owned(),
            globs: Vec::new(),
            spec: String::new(),
        }
    }

    /// Adds the annotation `key: value` to the policy's metadata.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Matches only the admission `operations` (`CREATE` or `CREATE, UPDATE`).
    pub fn operations(mut self, operations: &str) -> Self {
        self.operations = operations.to_owned();
        self
    }

    /// Matches only in the namespaces `selector` selects: the selector's YAML lines, at the
    /// indentation of `namespaceSelector`'s fields (6 spaces).
    pub fn namespace_selector(mut self, selector: &str) -> Self {
        self.namespace_selector = Some(selector.to_owned());
        self
    }

    /// Matches only in the namespace named `namespace` (by its `kubernetes.io/metadata.name`
    /// label).
    pub fn in_namespace(self, namespace: &str) -> Self {
        self.namespace_selector(&format!(
            "      matchExpressions:
        - key: kubernetes.io/metadata.name
          operator: In
          values: [{namespace}]
"
        ))
    }

    /// Selects the images `glob` matches (`matchImageReferences`; each call adds one).
    pub fn glob(mut self, glob: &str) -> Self {
        self.globs.push(glob.to_owned());
        self
    }

    /// The rest of the spec (`failurePolicy`, `attestors`, `validations`, ...), as YAML lines at
    /// the spec's indentation (2 spaces).
    pub fn spec(mut self, spec: &str) -> Self {
        self.spec = spec.to_owned();
        self
    }

    /// The policy document.
    pub fn yaml(&self) -> String {
        let name = &self.name;
        let annotations = block(
            "  annotations:",
            self.annotations
                .iter()
                .map(|(k, v)| format!("    {k}: {v}")),
        );
        let selector = self
            .namespace_selector
            .as_deref()
            .map(|s| format!("    namespaceSelector:\n{s}"))
            .unwrap_or_default();
        let operations = &self.operations;
        let glob = block(
            "  matchImageReferences:",
            self.globs.iter().map(|g| format!("    - glob: \"{g}\"")),
        );
        format!(
            "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata:
  name: {name}
{annotations}spec:
  matchConstraints:
{selector}    resourceRules:
      - apiGroups: [\"\"]
        apiVersions: [v1]
        operations: [{operations}]
        resources: [pods]
{glob}{spec}",
            spec = self.spec
        )
    }
}

/// `header` and `lines`, one a line; nothing when there are no lines.
fn block(header: &str, lines: impl Iterator<Item = String>) -> String {
    let lines: String = lines.map(|l| format!("{l}\n")).collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!("{header}\n{lines}")
    }
}

/// [`PodPolicy`] `name` for Pods whose images match `glob`, with the rest of the spec `spec`.
pub fn pod_policy(name: &str, glob: &str, spec: &str) -> String {
    PodPolicy::new(name).glob(glob).spec(spec).yaml()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attestor_block_is_yaml_with_the_key_intact() {
        let pem = "-----BEGIN PUBLIC KEY-----\nABC\n-----END PUBLIC KEY-----\n";
        let doc: serde_json::Value =
            serde_saphyr::from_str(&key_attestor_yaml(pem)).expect("valid YAML");
        let attestor = &doc["attestors"][0];
        assert_eq!(attestor["name"], "key");
        assert_eq!(attestor["cosign"]["key"]["data"].as_str(), Some(pem));
        assert_eq!(attestor["cosign"]["ctlog"]["insecureIgnoreTlog"], true);
    }

    #[test]
    fn a_pod_policy_is_yaml_with_what_the_test_set() {
        let yaml = PodPolicy::new("p")
            .annotation("ivory.dev/digest-pinning", "pods")
            .operations("CREATE")
            .in_namespace("team-a")
            .glob("reg.example/*")
            .glob("other.example/*")
            .spec("  failurePolicy: Fail\n  validations:\n    - expression: \"true\"\n")
            .yaml();
        let doc: serde_json::Value = serde_saphyr::from_str(&yaml).expect("valid YAML");
        assert_eq!(doc["kind"], "ImageValidatingPolicy");
        assert_eq!(doc["metadata"]["name"], "p");
        let spec = &doc["spec"];
        let constraints = &spec["matchConstraints"];
        assert_eq!(
            constraints["namespaceSelector"]["matchExpressions"][0]["values"][0],
            "team-a"
        );
        let rule = &constraints["resourceRules"][0];
        assert_eq!(rule["operations"], serde_json::json!(["CREATE"]));
        assert_eq!(rule["resources"], serde_json::json!(["pods"]));
        assert_eq!(
            doc["metadata"]["annotations"]["ivory.dev/digest-pinning"],
            "pods"
        );
        assert_eq!(spec["matchImageReferences"][0]["glob"], "reg.example/*");
        assert_eq!(spec["matchImageReferences"][1]["glob"], "other.example/*");
        assert_eq!(spec["failurePolicy"], "Fail");
        assert_eq!(spec["validations"][0]["expression"], "true");

        let plain: serde_json::Value =
            serde_saphyr::from_str(&pod_policy("q", "*", "")).expect("valid YAML");
        assert!(plain["spec"]["matchConstraints"]["namespaceSelector"].is_null());
        assert_eq!(
            plain["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
            serde_json::json!(["CREATE", "UPDATE"])
        );
    }
}
