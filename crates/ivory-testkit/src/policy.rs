//! ImageValidatingPolicy YAML pieces shared by the tests and benchmarks.

/// Kyverno's signature check: every container image verified by the attestor named `key`.
pub const VERIFY_SIGNATURES: &str =
    "images.containers.map(image, verifyImageSignatures(image, [attestors.key])).all(e, e > 0)";

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
}
