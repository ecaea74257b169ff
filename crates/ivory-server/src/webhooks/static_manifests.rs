//! The webhook configurations as the API server's static manifests (Kubernetes 1.37, feature
//! gate `ManifestBasedAdmissionControlConfig`, beta and on by default): files the API server
//! reads at start and re-reads every minute, named with the reserved suffix [`STATIC_SUFFIX`],
//! which the API can neither create nor delete. Whoever can delete webhook objects through the
//! API cannot switch these off, and they are in force from the API server's first request.
//!
//! Each admission plugin reads its own directory, and a directory holding the other plugin's
//! kind fails that plugin's load: the validating configuration goes to [`VALIDATING_DIR`], the
//! mutating one to [`MUTATING_DIR`], and [`admission_configuration`] points each plugin at its
//! directory. [`check`] holds a configuration to the API server's own static-manifest rules
//! (k8s.io/apiserver `pkg/admission/plugin/webhook/manifest/loader`): the suffix, and a
//! `clientConfig.url` on every webhook (a Service reference is refused for static manifests).

use std::path::Path;

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::Options;

/// The name suffix the API server reserves for static configurations.
pub const STATIC_SUFFIX: &str = ".static.k8s.io";
/// Subdirectory for the ValidatingAdmissionWebhook plugin's manifests.
pub const VALIDATING_DIR: &str = "validating";
/// Subdirectory for the MutatingAdmissionWebhook plugin's manifests.
pub const MUTATING_DIR: &str = "mutating";
/// ivory's file in each plugin's directory (other files there are other webhooks').
pub const MANIFEST_FILE: &str = "ivory.yaml";
/// The `AdmissionConfiguration` for `--admission-control-config-file`.
pub const ADMISSION_CONFIGURATION_FILE: &str = "admission-configuration.yaml";

/// Why a configuration cannot be a static manifest.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StaticManifestError {
    /// The configuration's name lacks the reserved suffix.
    #[error("{config:?}: a static configuration's name must end with {STATIC_SUFFIX:?}")]
    Name {
        /// The configuration's name.
        config: String,
    },
    /// A webhook calls a Service, which static manifests cannot.
    #[error(
        "webhook {webhook:?} in {config:?}: a static manifest needs clientConfig.url (the API \
         server refuses Service references there); pass --url with the address the API server \
         reaches ivory at"
    )]
    NeedsUrl {
        /// The configuration's name.
        config: String,
        /// The webhook's name.
        webhook: String,
    },
    /// `staticManifestsDir` must be absolute.
    #[error("{0:?}: the API server's staticManifestsDir must be an absolute path")]
    RelativeDir(String),
}

/// `options` with the configuration names the API server accepts for static manifests:
/// `<name>.static.k8s.io`.
pub fn static_names(options: &mut Options) {
    for name in [&mut options.mutating_name, &mut options.validating_name] {
        if !name.ends_with(STATIC_SUFFIX) {
            name.push_str(STATIC_SUFFIX);
        }
    }
}

/// The API server's static-manifest rules for one rendered configuration.
pub fn check(config: &Value) -> Result<(), StaticManifestError> {
    let name = config["metadata"]["name"].as_str().unwrap_or("");
    if !name.ends_with(STATIC_SUFFIX) {
        return Err(StaticManifestError::Name {
            config: name.to_owned(),
        });
    }
    let webhooks = config["webhooks"].as_array().map_or(&[][..], Vec::as_slice);
    for hook in webhooks {
        let url = hook["clientConfig"]["url"].as_str().unwrap_or("");
        if url.is_empty() || !hook["clientConfig"]["service"].is_null() {
            return Err(StaticManifestError::NeedsUrl {
                config: name.to_owned(),
                webhook: hook["name"].as_str().unwrap_or("").to_owned(),
            });
        }
    }
    Ok(())
}

/// The `AdmissionConfiguration` pointing each webhook plugin at its directory under
/// `apiserver_dir`, the directory as the API server sees it (absolute).
pub fn admission_configuration(apiserver_dir: &str) -> Result<Value, StaticManifestError> {
    if !Path::new(apiserver_dir).is_absolute() {
        return Err(StaticManifestError::RelativeDir(apiserver_dir.to_owned()));
    }
    let base = apiserver_dir.trim_end_matches('/');
    let plugin = |name: &str, dir: &str| {
        json!({
            "name": name,
            "configuration": {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "WebhookAdmissionConfiguration",
                "staticManifestsDir": format!("{base}/{dir}"),
            },
        })
    };
    Ok(json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            plugin("ValidatingAdmissionWebhook", VALIDATING_DIR),
            plugin("MutatingAdmissionWebhook", MUTATING_DIR),
        ],
    }))
}

/// The hash the API server computes over a manifest directory's files and reports in
/// `apiserver_manifest_admission_config_controller_last_config_info{hash=…}`: SHA-256 over each
/// non-empty `.yaml`/`.yml`/`.json` file's bytes followed by a zero byte, in file-name order;
/// `None` when no file has data. `files` are (name, bytes) in any order.
pub fn directory_hash(files: &[(String, Vec<u8>)]) -> Option<String> {
    let mut chosen: Vec<&(String, Vec<u8>)> = files
        .iter()
        .filter(|(name, bytes)| is_manifest_name(name) && !bytes.is_empty())
        .collect();
    if chosen.is_empty() {
        return None;
    }
    chosen.sort_by(|a, b| a.0.cmp(&b.0));
    let mut hasher = Sha256::new();
    for (_, bytes) in chosen {
        hasher.update(bytes);
        hasher.update([0]);
    }
    Some(format!("sha256:{}", hex::encode(hasher.finalize())))
}

/// Whether the API server reads a file of this name: what follows its last dot (Go's
/// `filepath.Ext`, so `.yaml` alone counts) is `yaml`, `yml` or `json`, in any case.
pub fn is_manifest_name(name: &str) -> bool {
    name.rsplit_once('.').is_some_and(|(_, ext)| {
        ["yaml", "yml", "json"].contains(&ext.to_ascii_lowercase().as_str())
    })
}

#[cfg(test)]
mod tests {
    use ivory_policy::default_policy;
    use serde_json::json;

    use super::*;
    use crate::webhooks::{Target, generate};

    fn static_options(target: Target) -> Options {
        let mut options = Options::for_service("ivory-system", "ivory", 443);
        options.target = target;
        static_names(&mut options);
        options
    }

    #[test]
    fn url_webhooks_with_static_names_pass_and_keep_the_suffix_once() {
        let mut options = static_options(Target::Url("https://10.96.0.10:443".to_owned()));
        static_names(&mut options);
        assert_eq!(
            options.validating_name,
            "ivory-resource-validating-webhook-cfg.static.k8s.io"
        );
        let (mutating, validating) = generate(&[default_policy()], &options);
        assert_eq!(check(&mutating), Ok(()));
        assert_eq!(check(&validating), Ok(()));
        assert_eq!(
            validating["webhooks"][0]["clientConfig"]["url"],
            "https://10.96.0.10:443/ivpol/validate/ivory-pin-digests"
        );
    }

    #[test]
    fn a_service_reference_or_a_plain_name_is_refused_as_the_api_server_refuses_it() {
        let options = static_options(Target::Service {
            namespace: "ivory-system".to_owned(),
            name: "ivory".to_owned(),
            port: 443,
        });
        let (_, validating) = generate(&[default_policy()], &options);
        assert!(matches!(
            check(&validating),
            Err(StaticManifestError::NeedsUrl { .. })
        ));
        let plain = json!({"metadata": {"name": "ivory"}, "webhooks": []});
        assert_eq!(
            check(&plain),
            Err(StaticManifestError::Name {
                config: "ivory".to_owned()
            })
        );
    }

    #[test]
    fn the_admission_configuration_points_each_plugin_at_its_own_directory() {
        let config = admission_configuration("/etc/kubernetes/ivory/").unwrap();
        assert_eq!(config["kind"], "AdmissionConfiguration");
        assert_eq!(config["plugins"][0]["name"], "ValidatingAdmissionWebhook");
        assert_eq!(
            config["plugins"][0]["configuration"]["staticManifestsDir"],
            "/etc/kubernetes/ivory/validating"
        );
        assert_eq!(
            config["plugins"][1]["configuration"]["staticManifestsDir"],
            "/etc/kubernetes/ivory/mutating"
        );
        assert_eq!(
            admission_configuration("ivory"),
            Err(StaticManifestError::RelativeDir("ivory".to_owned()))
        );
    }

    #[test]
    fn the_directory_hash_is_the_api_servers() {
        // Go: sha256("a: 1\n" 0x00 "b: 2\n" 0x00), files in name order, others skipped.
        let files = vec![
            ("b.yml".to_owned(), b"b: 2\n".to_vec()),
            ("a.YAML".to_owned(), b"a: 1\n".to_vec()),
            ("notes.txt".to_owned(), b"skipped".to_vec()),
            ("empty.json".to_owned(), Vec::new()),
        ];
        let mut expected = Sha256::new();
        expected.update(b"a: 1\n\0b: 2\n\0");
        assert_eq!(
            directory_hash(&files),
            Some(format!("sha256:{}", hex::encode(expected.finalize())))
        );
        assert_eq!(directory_hash(&files[2..]), None);
        assert!(is_manifest_name(".yaml"));
        assert!(!is_manifest_name(".ivory.yaml.tmp"));
    }
}
