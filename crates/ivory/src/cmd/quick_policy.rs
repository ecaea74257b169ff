//! The policies `ivory verify` and `ivory audit` check images against: `--policy` files plus
//! the one the ad-hoc flags (`--key`, `--certificate-identity`, ...) describe. Checking an
//! image is the engine's (`ivory_engine::report`).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use ivory_policy::CompiledPolicy;
use serde_json::{Value, json};

use super::wiring;

/// Flags that build an in-memory policy for ad-hoc checks (no policy file needed).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct QuickPolicy {
    /// Cosign public key (PEM): images must carry a signature by it.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Keyless: the certificate identity (subject) the signature must carry.
    #[arg(long, value_name = "IDENTITY", requires = "certificate_oidc_issuer")]
    pub certificate_identity: Option<String>,
    /// Keyless: the OIDC issuer the signing certificate must name.
    #[arg(long, value_name = "URL", requires = "certificate_identity")]
    pub certificate_oidc_issuer: Option<String>,
    /// Sigstore trusted_root.json for keyless (default: the embedded public-good root).
    #[arg(long, value_name = "FILE", requires = "certificate_identity")]
    pub trusted_root: Option<PathBuf>,
    /// Accept signatures without a transparency-log entry or SCT (cosign's
    /// --insecure-ignore-tlog / --insecure-ignore-sct), e.g. `cosign sign --tlog-upload=false`.
    #[arg(long)]
    pub insecure_ignore_tlog: bool,
    /// Transparency log the signatures' inclusion proofs come from (checked offline against
    /// the trusted root; the log is not contacted).
    #[arg(long, value_name = "URL", default_value = "https://rekor.sigstore.dev")]
    pub rekor_url: String,
}

/// Name of the policy the quick flags build.
pub(crate) const QUICK_POLICY: &str = "ivory-cli-flags";

impl QuickPolicy {
    pub(crate) fn is_set(&self) -> bool {
        self.key.is_some() || self.certificate_identity.is_some()
    }

    /// The policy document the flags describe (JSON), or `None` when no flag is set.
    pub(crate) fn document(&self) -> anyhow::Result<Option<Value>> {
        if !self.is_set() {
            return Ok(None);
        }
        let ctlog = if self.insecure_ignore_tlog {
            json!({"insecureIgnoreTlog": true, "insecureIgnoreSCT": true})
        } else {
            json!({"url": self.rekor_url})
        };
        let mut attestors = Vec::new();
        if let Some(path) = &self.key {
            let pem = std::fs::read_to_string(path)
                .with_context(|| format!("reading --key {}", path.display()))?;
            attestors
                .push(json!({"name": "key", "cosign": {"key": {"data": pem}, "ctlog": ctlog}}));
        }
        if let (Some(subject), Some(issuer)) =
            (&self.certificate_identity, &self.certificate_oidc_issuer)
        {
            let mut cosign = json!({
                "keyless": {"identities": [{"subject": subject, "issuer": issuer}]},
                "ctlog": ctlog,
            });
            if let Some(path) = &self.trusted_root {
                let root = std::fs::read_to_string(path)
                    .with_context(|| format!("reading --trusted-root {}", path.display()))?;
                cosign["trustedRoot"] = json!({"value": root});
            }
            attestors.push(json!({"name": "keyless", "cosign": cosign}));
        }
        let validations: Vec<Value> = attestors
            .iter()
            .filter_map(|a| a["name"].as_str())
            .map(|name| {
                json!({
                    "expression": format!(
                        "images.containers.map(image, verifyImageSignatures(image, [attestors.{name}])).all(e, e > 0)"
                    ),
                    "message": format!("failed the image signature verification with the --{} flags", if name == "key" { "key" } else { "certificate-identity" }),
                })
            })
            .collect();
        Ok(Some(json!({
            "apiVersion": "policies.kyverno.io/v1",
            "kind": "ImageValidatingPolicy",
            "metadata": {"name": QUICK_POLICY},
            "spec": {
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["pods"],
                }]},
                "matchImageReferences": [{"glob": "*"}],
                "attestors": attestors,
                "validations": validations,
            },
        })))
    }
}

/// `--policy` files plus the quick-flag policy; at least one is required.
pub(crate) fn policies(
    paths: &[PathBuf],
    quick: &QuickPolicy,
) -> anyhow::Result<Vec<Arc<CompiledPolicy>>> {
    let mut all = if paths.is_empty() {
        Vec::new()
    } else {
        wiring::load_policies(paths)?
    };
    if let Some(doc) = quick.document()? {
        let report = ivory_policy::load_str(&doc.to_string(), "<command-line flags>");
        all.extend(wiring::finish_load(report, "--key/--certificate-identity")?);
    }
    if all.is_empty() {
        bail!(
            "no policy: give --policy FILE, --key FILE or --certificate-identity/--certificate-oidc-issuer"
        );
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_flags_compile_to_a_policy() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.pub");
        std::fs::write(
            &key,
            std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../fixtures/keys/cosign-p256.pub"
            ))
            .unwrap(),
        )
        .unwrap();
        let quick = QuickPolicy {
            key: Some(key),
            certificate_identity: Some("me@example.com".into()),
            certificate_oidc_issuer: Some("https://issuer.example".into()),
            trusted_root: None,
            insecure_ignore_tlog: false,
            rekor_url: "https://rekor.sigstore.dev".into(),
        };
        let all = policies(&[], &quick).unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].name, QUICK_POLICY);
        let names: Vec<&str> = all[0]
            .attestors
            .iter()
            .map(|a| a.attestor.name.as_str())
            .collect();
        assert_eq!(names, ["key", "keyless"]);
        assert_eq!(all[0].validations.len(), 2);
    }

    #[test]
    fn no_policy_is_a_usage_error() {
        let none = QuickPolicy {
            key: None,
            certificate_identity: None,
            certificate_oidc_issuer: None,
            trusted_root: None,
            insecure_ignore_tlog: false,
            rekor_url: String::new(),
        };
        let err = policies(&[], &none).unwrap_err().to_string();
        assert!(err.contains("--policy"), "{err}");
    }
}
