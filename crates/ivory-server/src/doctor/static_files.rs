//! The static registration: the webhook manifests `ivory webhooks --static DIR` wrote (the
//! API server never shows them through its API), read from DIR's plugin folders, and whether
//! the API server applies them, from the hash it reports in
//! `apiserver_manifest_admission_config_controller_last_config_info`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use serde_json::Value;

use super::check::{Check, Finding, MAX_MANIFEST_BYTES, Source, StaticReadError};
use super::hooks::{Hook, hooks_of};
use crate::webhooks::static_manifests::{
    MUTATING_DIR, STATIC_SUFFIX, VALIDATING_DIR, directory_hash, is_manifest_name,
};

/// The API server's metric naming the hash of the static manifests each plugin applies.
const LAST_CONFIG_METRIC: &str = "apiserver_manifest_admission_config_controller_last_config_info";

/// One admission plugin's folder of static manifests.
#[derive(Debug)]
pub struct StaticFolder {
    /// `ValidatingAdmissionWebhook` or `MutatingAdmissionWebhook`.
    pub plugin: &'static str,
    /// The folder read.
    pub dir: PathBuf,
    /// The API server's hash of the folder's files; `None` when none holds data.
    pub hash: Option<String>,
    /// The webhooks of its configurations that call ivory.
    pub hooks: Vec<Hook>,
}

/// Reads `dir/validating` and `dir/mutating` (a missing folder holds nothing).
pub fn read_static(dir: &Path) -> Result<Vec<StaticFolder>, StaticReadError> {
    [
        ("ValidatingAdmissionWebhook", VALIDATING_DIR),
        ("MutatingAdmissionWebhook", MUTATING_DIR),
    ]
    .into_iter()
    .map(|(plugin, sub)| read_folder(plugin, &dir.join(sub)))
    .collect()
}

fn read_folder(plugin: &'static str, dir: &Path) -> Result<StaticFolder, StaticReadError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| StaticReadError::Io { path, source }
    };
    let mut files = Vec::new();
    if dir.is_dir() {
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let entry = entry.map_err(io(dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_manifest_name(&name) && !entry.path().is_dir() {
                files.push((name, read_bounded(&entry.path())?));
            }
        }
    }
    let mut configurations = (Vec::new(), Vec::new());
    for (name, bytes) in &files {
        let path = dir.join(name);
        let text = String::from_utf8_lossy(bytes);
        let documents =
            ivory_policy::documents(&text).map_err(|source| StaticReadError::Document {
                path: path.clone(),
                source,
            })?;
        for document in documents.into_iter().filter(|d| !d.is_null()) {
            accept(plugin, &path, document, &mut configurations)?;
        }
    }
    let (mutating, validating) = configurations;
    Ok(StaticFolder {
        plugin,
        dir: dir.to_owned(),
        hash: directory_hash(&files),
        hooks: hooks_of(mutating, validating, Source::Static),
    })
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, StaticReadError> {
    let io = |source| StaticReadError::Io {
        path: path.to_owned(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(StaticReadError::TooLarge {
            path: path.to_owned(),
        });
    }
    Ok(bytes)
}

/// Adds one document (a configuration of the folder's kind, or a list of them) to the
/// (mutating, validating) configurations, as the API server's loader accepts it.
fn accept(
    plugin: &'static str,
    path: &Path,
    document: Value,
    out: &mut (
        Vec<MutatingWebhookConfiguration>,
        Vec<ValidatingWebhookConfiguration>,
    ),
) -> Result<(), StaticReadError> {
    let kind = document["kind"].as_str().unwrap_or("").to_owned();
    let decode = |source| StaticReadError::Decode {
        path: path.to_owned(),
        source,
    };
    let items = match kind.as_str() {
        "List" | "MutatingWebhookConfigurationList" | "ValidatingWebhookConfigurationList" => {
            document["items"].as_array().cloned().unwrap_or_default()
        }
        _ => vec![document],
    };
    for item in items {
        let item_kind = item["kind"].as_str().unwrap_or(&kind).to_owned();
        let name = item["metadata"]["name"].as_str().unwrap_or("").to_owned();
        match (plugin, item_kind.as_str()) {
            ("MutatingAdmissionWebhook", "MutatingWebhookConfiguration") => {
                out.0.push(serde_json::from_value(item).map_err(decode)?);
            }
            ("ValidatingAdmissionWebhook", "ValidatingWebhookConfiguration") => {
                out.1.push(serde_json::from_value(item).map_err(decode)?);
            }
            _ => {
                return Err(StaticReadError::Kind {
                    path: path.to_owned(),
                    kind: item_kind,
                    plugin,
                });
            }
        }
        if !name.ends_with(STATIC_SUFFIX) {
            return Err(StaticReadError::Name {
                path: path.to_owned(),
                name,
            });
        }
    }
    Ok(())
}

/// The hashes each plugin reports applying, from the API server's metrics text.
pub fn loaded_hashes(metrics: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(labels) = line
            .strip_prefix(LAST_CONFIG_METRIC)
            .and_then(|rest| rest.strip_prefix('{'))
            .and_then(|rest| rest.split_once('}'))
            .map(|(labels, _)| labels)
        else {
            continue;
        };
        let label = |key: &str| {
            labels.split(',').find_map(|pair| {
                pair.strip_prefix(key)
                    .and_then(|v| v.strip_prefix("=\""))
                    .and_then(|v| v.strip_suffix('"'))
                    .map(str::to_owned)
            })
        };
        if let (Some(plugin), Some(hash)) = (label("plugin"), label("hash")) {
            out.entry(plugin).or_default().insert(hash);
        }
    }
    out
}

/// The API server's `/metrics` text.
pub(super) async fn read_metrics(client: &kube::Client) -> Result<String, kube::Error> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request_text(request).await
}

/// One row per plugin: whether the API server applies the folder's manifests (or, without
/// folders, whatever static manifests it reports), from `loaded` (`Err`: metrics unreadable).
pub fn static_checks(
    folders: &[StaticFolder],
    loaded: &Result<BTreeMap<String, BTreeSet<String>>, kube::Error>,
) -> Vec<Check> {
    let subject = |plugin: &str| format!("static manifests ({plugin})");
    let loaded = match loaded {
        Ok(loaded) => loaded,
        Err(_) if folders.is_empty() => return Vec::new(),
        Err(e) => {
            return vec![Check::new(
                "static manifests",
                Finding::StaticUnknown(e.to_string()),
            )];
        }
    };
    if folders.is_empty() {
        return loaded
            .iter()
            .map(|(plugin, hashes)| {
                let hashes = hashes.iter().cloned().collect();
                Check::new(subject(plugin), Finding::StaticUnread { hashes })
            })
            .collect();
    }
    folders
        .iter()
        .filter(|f| f.hash.is_some() || loaded.contains_key(f.plugin))
        .map(|folder| {
            let applied = loaded.get(folder.plugin);
            let finding = match (&folder.hash, applied) {
                (Some(hash), Some(applied)) if applied.contains(hash) => Finding::StaticInForce {
                    dir: folder.dir.clone(),
                    hash: hash.clone(),
                    webhooks: folder.hooks.len(),
                },
                (_, Some(applied)) => Finding::StaticStale {
                    dir: folder.dir.clone(),
                    on_disk: folder.hash.clone(),
                    applied: applied.iter().cloned().collect(),
                },
                (_, None) => Finding::StaticNotApplied {
                    dir: folder.dir.clone(),
                },
            };
            Check::new(subject(folder.plugin), finding)
        })
        .collect()
}

/// Whether the API server applies (some version of) `folder`'s manifests, so its webhooks
/// count as registered; when its metrics could not be read, they are taken at their word.
pub fn applied(
    folder: &StaticFolder,
    loaded: &Result<BTreeMap<String, BTreeSet<String>>, kube::Error>,
) -> bool {
    loaded
        .as_ref()
        .map_or(true, |loaded| loaded.contains_key(folder.plugin))
}
