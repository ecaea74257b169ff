//! Loading one Kyverno test case: its image policies (and the names and kinds of the other
//! policy documents it holds), PolicyExceptions, resources (namespaced ones without a
//! namespace in `default`), values, user info and the namespaces its cluster resources and
//! values describe.

use ivory_engine::resources::FileResources;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use ivory_engine::admission::UserInfo;
use ivory_engine::exceptions::Exceptions;
use ivory_policy::CompiledPolicy;
use serde_json::Value;

use super::legacy::{self, Converted};
use super::suite::{self, ResultRow, RowOperation, TestCase, ValuesSpec};
use crate::cmd::apply::{CLUSTER_SCOPED, documents};

/// `apiVersion, kind, namespace, name` of a test resource (Kyverno's resource key).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ResourceKey {
    api_version: String,
    kind: String,
    pub(super) namespace: String,
    name: String,
}

impl ResourceKey {
    pub(super) fn of(object: &Value) -> Self {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        Self {
            api_version: text(&object["apiVersion"]),
            kind: text(&object["kind"]),
            namespace: text(&object["metadata"]["namespace"]),
            name: text(&object["metadata"]["name"]),
        }
    }

    /// `v1/Pod/default/bad-pod`, as Kyverno's table shows a resource.
    pub(super) fn display(&self) -> String {
        let mut parts = vec![self.api_version.as_str(), self.kind.as_str()];
        if !self.namespace.is_empty() {
            parts.push(&self.namespace);
        }
        parts.push(&self.name);
        parts.join("/")
    }

    /// A row's `resources` entry: `name` or `namespace/name`.
    pub(super) fn named(&self, entry: &str) -> bool {
        match entry.split_once('/') {
            Some((ns, name)) => ns == self.namespace && name == self.name,
            None => entry == self.name,
        }
    }

    pub(super) fn specified(&self, spec: &suite::ResourceSpec) -> bool {
        let api_version = if spec.group.is_empty() {
            spec.version.clone()
        } else {
            format!("{}/{}", spec.group, spec.version)
        };
        api_version == self.api_version
            && spec.namespace == self.namespace
            && spec.name == self.name
            && (spec.kind.is_empty() || spec.kind == self.kind)
    }
}

/// A policy document the test loads that ivory does not run.
pub(super) struct OtherPolicy {
    pub(super) kind: String,
    pub(super) file: PathBuf,
    /// A legacy `kyverno.io` ClusterPolicy/Policy with `verifyImages` rules.
    pub(super) legacy_verify_images: bool,
}

impl Loaded {
    /// True when an image policy of the test has the row's policy name.
    pub(super) fn knows(&self, row: &ResultRow) -> bool {
        let name = self.engine_policy(row);
        self.policies.iter().any(|p| p.name == name)
    }

    /// The name of the policy whose results answer the row: the row's policy, or for a rule
    /// of a legacy policy, the ImageValidatingPolicy it was converted to.
    pub(super) fn engine_policy<'r>(&'r self, row: &'r ResultRow) -> &'r str {
        self.legacy
            .policy_for(row.policy_name(), &row.rule)
            .unwrap_or_else(|| row.policy_name())
    }

    /// The kind of policy the row is about when ivory does not run it: the kind the row
    /// declares, else that of the policy document of its name. A name both an image policy
    /// and another kind carry is the image policy's unless the row says otherwise.
    pub(super) fn other_kind(&self, row: &ResultRow) -> Option<String> {
        if let Some(kind) = row.declared_other_kind() {
            return Some(kind.to_owned());
        }
        if self.knows(row) || row.is_image_validating_policy {
            return None;
        }
        self.others.get(row.policy_name()).map(|o| o.kind.clone())
    }

    /// True when ivory judges the row (it is not about another kind of policy).
    pub(super) fn is_image_row(&self, row: &ResultRow) -> bool {
        self.other_kind(row).is_none()
    }
}

/// Policy documents ivory does not run, by name.
pub(super) type OtherPolicies = BTreeMap<String, OtherPolicy>;

/// Everything a test case loads.
pub(super) struct Loaded {
    pub(super) policies: Vec<Arc<CompiledPolicy>>,
    pub(super) others: OtherPolicies,
    pub(super) exceptions: Option<Exceptions>,
    pub(super) resources: Vec<Value>,
    pub(super) namespaces: BTreeMap<String, Value>,
    /// The legacy `verifyImages` rules of the test, converted (also among `policies`).
    pub(super) legacy: Converted,
    /// The `clusterResources` objects, for policies' `resource.*` / `globalContext.*` reads.
    pub(super) cluster: FileResources,
    pub(super) user: Option<UserInfo>,
    pub(super) operation: RowOperation,
}

/// Everything the test names, read and compiled; notes for what is read but not used.
pub(super) fn load(case: &TestCase, notes: &mut Vec<String>) -> anyhow::Result<Loaded> {
    let t = &case.test;
    let where_ = case.path.display();
    let values = match &t.variables {
        Some(file) => suite::load_values(&case.input("variables", file)?)?,
        None => t.values.clone().unwrap_or_default(),
    };
    let operation = operation_of(&values).with_context(|| format!("{where_}: values"))?;
    if !values.policies.is_empty() || !values.subresources.is_empty() {
        notes.push(format!(
            "{where_}: values policies/subresources are not used: image policies read no Kyverno variables"
        ));
    }
    let user = match &t.userinfo {
        Some(file) => Some(suite::load_user_info(&case.input("userinfo", file)?)?),
        None => None,
    };
    // Resources first, as a missing resource file is the first thing Kyverno reports too.
    let resources = load_resources(case)?;
    let (mut policies, others) = load_policies(case)?;
    let legacy_files: BTreeSet<&Path> = others
        .values()
        .filter(|o| o.legacy_verify_images)
        .map(|o| o.file.as_path())
        .collect();
    let legacy = legacy::convert(legacy_files)?;
    policies.extend(legacy.policies.iter().cloned());
    let exceptions = load_exceptions(case)?;
    let mut namespaces = BTreeMap::new();
    let mut cluster_objects = Vec::new();
    for file in &t.cluster_resources {
        for object in suite::load_cluster_resources(&case.input("clusterResources", file)?)? {
            if object["kind"] == "Namespace" {
                add_namespace(&mut namespaces, object.clone());
            }
            cluster_objects.push(object);
        }
    }
    let cluster = FileResources::new(cluster_objects)
        .with_context(|| format!("{where_}: clusterResources"))?;
    for object in &values.namespaces {
        add_namespace(&mut namespaces, object.clone());
    }
    for selector in &values.namespace_selector {
        let ns = namespaces
            .entry(selector.name.clone())
            .or_insert_with(|| ivory_engine::pipeline::namespace_object(&selector.name));
        for (k, v) in &selector.labels {
            ns["metadata"]["labels"][k] = Value::String(v.clone());
        }
    }
    Ok(Loaded {
        legacy,
        cluster,
        policies,
        others,
        exceptions,
        resources,
        namespaces,
        user,
        operation,
    })
}

/// The test's resources, in order, each once (as Kyverno removes duplicates).
fn load_resources(case: &TestCase) -> anyhow::Result<Vec<Value>> {
    let mut resources = Vec::new();
    let mut seen = BTreeSet::new();
    for file in &case.test.resources {
        let path = case.input("resources", file)?;
        let text = suite::read_input(&path)
            .with_context(|| format!("{}: resources", case.path.display()))?;
        for mut object in suite::objects(&path, &text)
            .with_context(|| format!("{}: resources", case.path.display()))?
        {
            default_namespace(&mut object);
            if seen.insert(ResourceKey::of(&object)) {
                resources.push(object);
            }
        }
    }
    Ok(resources)
}

/// A namespaced resource written without a namespace is in `default`, as Kyverno's CLI
/// reads it (and as `kubectl apply` would create it).
fn default_namespace(object: &mut Value) {
    let kind = object["kind"].as_str().unwrap_or_default();
    if CLUSTER_SCOPED.contains(&kind) || object["metadata"]["namespace"].is_string() {
        return;
    }
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("namespace".into(), Value::String("default".into()));
    }
}

fn add_namespace(namespaces: &mut BTreeMap<String, Value>, object: Value) {
    if let Some(name) = object["metadata"]["name"].as_str() {
        namespaces.insert(name.to_owned(), object.clone());
    }
}

/// `globalValues["request.operation"]`, else CREATE.
fn operation_of(values: &ValuesSpec) -> anyhow::Result<RowOperation> {
    match values.global_values.get("request.operation") {
        None => Ok(RowOperation::Create),
        Some(v) => suite::strict(v.clone()).context("globalValues.request.operation"),
    }
}

/// The test's image policies, and the other policy documents by name.
fn load_policies(case: &TestCase) -> anyhow::Result<(Vec<Arc<CompiledPolicy>>, OtherPolicies)> {
    let mut report = ivory_policy::LoadReport::default();
    let mut others = BTreeMap::new();
    for file in &case.test.policies {
        let files = policy_inputs(case, "policies", file)?;
        for (path, text) in &files {
            scan_other_policies(path, text, &mut others);
        }
        report.merge(policy_files(files).load());
    }
    if !report.errors.is_empty() {
        let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
        bail!(
            "{}: invalid policies: {}",
            case.path.display(),
            errors.join("; ")
        );
    }
    Ok((report.policies.into_iter().map(Arc::new).collect(), others))
}

/// The policy files `relative` names (a file, or the `*.yaml`, `*.yml` and `*.json` below a
/// folder, as `ivory_policy::policy_files` lists them), each confined to the suite's root and
/// read as a suite file.
fn policy_inputs(
    case: &TestCase,
    field: &str,
    relative: &str,
) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let path = case.input(field, relative)?;
    let (files, errors) = ivory_policy::policy_files(&path);
    if let Some(e) = errors.first() {
        bail!("{}: {field}: {e}", case.path.display());
    }
    files
        .iter()
        .map(|file| {
            let file = case.confine(field, file)?;
            let text = suite::read_input(&file)
                .with_context(|| format!("{}: {field}", case.path.display()))?;
            Ok((file, text))
        })
        .collect()
}

/// Files read by [`policy_inputs`], as the policy loader takes them.
fn policy_files(files: Vec<(PathBuf, String)>) -> ivory_policy::PolicyFiles {
    ivory_policy::PolicyFiles {
        files: files
            .into_iter()
            .map(|(path, text)| (path, text.into_bytes()))
            .collect(),
        errors: Vec::new(),
    }
}

/// Records every policy document of `text` (the file `path`) that is not an image policy.
fn scan_other_policies(path: &Path, text: &str, others: &mut BTreeMap<String, OtherPolicy>) {
    // Syntax errors are the policy loader's to report, with its messages.
    let Ok(docs) = documents(text) else {
        return;
    };
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        let image_policy = matches!(
            kind,
            "ImageValidatingPolicy" | "NamespacedImageValidatingPolicy" | "ImageVerificationPolicy"
        ) || kind == "PolicyException";
        let Some(name) = doc["metadata"]["name"].as_str() else {
            continue;
        };
        if image_policy {
            continue;
        }
        let legacy = api_version.starts_with("kyverno.io/")
            && matches!(kind, "ClusterPolicy" | "Policy")
            && doc["spec"]["rules"]
                .as_array()
                .is_some_and(|rules| rules.iter().any(|r| r.get("verifyImages").is_some()));
        others.insert(
            name.to_owned(),
            OtherPolicy {
                kind: kind.to_owned(),
                file: path.to_owned(),
                legacy_verify_images: legacy,
            },
        );
    }
}

fn load_exceptions(case: &TestCase) -> anyhow::Result<Option<Exceptions>> {
    if case.test.exceptions.is_empty() {
        return Ok(None);
    }
    let mut report = ivory_policy::LoadReport::default();
    for file in &case.test.exceptions {
        report.merge(policy_files(policy_inputs(case, "exceptions", file)?).load());
    }
    if !report.errors.is_empty() {
        let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
        bail!(
            "{}: invalid exceptions: {}",
            case.path.display(),
            errors.join("; ")
        );
    }
    Ok(Some(Exceptions {
        exceptions: Arc::new(report.exceptions.into_iter().map(Arc::new).collect()),
        namespace: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_keys_match_names_as_kyverno_does() {
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "dev"}});
        let key = ResourceKey::of(&pod);
        assert!(key.named("p") && key.named("dev/p"));
        assert!(!key.named("default/p") && !key.named("q"));
        assert_eq!(key.display(), "v1/Pod/dev/p");
        let spec = suite::ResourceSpec {
            group: String::new(),
            version: "v1".into(),
            kind: "Pod".into(),
            namespace: "dev".into(),
            name: "p".into(),
            _subresource: String::new(),
        };
        assert!(key.specified(&spec));
    }
}
