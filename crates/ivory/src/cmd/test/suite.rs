//! Kyverno CLI test suites as files: finding `kyverno-test.yaml` files under folders and
//! reading them strictly (`cli.kyverno.io/v1alpha1` `Test`, and the older form without
//! `apiVersion`/`kind`), with the files they name (`Values`, `UserInfo`, `ClusterResource`).
//! An unknown or mistyped field is an error naming the file and the field's path, as
//! Kyverno's strict decoding refuses it.
//!
//! A suite is data from wherever it came (a pull request in CI): the files it names must
//! resolve inside its root (the folder given to `ivory test`, or a given test file's folder)
//! unless `--allow-outside-root`, must be regular files (a FIFO would hang the run, a device
//! never end), are read under [`MAX_FILE_BYTES`], and errors name them, never quote them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::cmd::apply::documents;

/// Most bytes of one suite file (a test, values, user info or resource file) read.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Deepest folder level searched below a given folder.
const MAX_DEPTH: usize = 32;

/// One `Test` document and where it came from.
pub(crate) struct TestCase {
    /// The test file.
    pub path: PathBuf,
    /// The folder (links resolved) every file the test names must be in; `None` with
    /// `--allow-outside-root`.
    pub root: Option<PathBuf>,
    /// Its document number (from 1), for files holding several tests.
    pub document: usize,
    pub test: TestDoc,
}

impl TestCase {
    /// The folder the test's relative paths start from.
    pub(crate) fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// The test's name: `metadata.name`, else the deprecated `name`, else the file.
    pub(crate) fn name(&self) -> String {
        self.test
            .metadata
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| self.test.name.clone())
            .unwrap_or_else(|| self.path.display().to_string())
    }

    /// A path the test names in `field`, relative to its folder: the file it resolves to
    /// (links followed), refused when that is outside the suite's root.
    pub(crate) fn input(&self, field: &str, relative: &str) -> anyhow::Result<PathBuf> {
        self.confine(field, &self.dir().join(relative))
    }

    /// `path` resolved (links followed), refused when outside the suite's root.
    pub(crate) fn confine(&self, field: &str, path: &Path) -> anyhow::Result<PathBuf> {
        let resolved = std::fs::canonicalize(path).map_err(|e| {
            anyhow::anyhow!("{}: {field}: {}: {e}", self.path.display(), path.display())
        })?;
        if let Some(root) = &self.root
            && !resolved.starts_with(root)
        {
            bail!(
                "{}: {field}: {}: outside the suite's folder {} (not read; --allow-outside-root reads it)",
                self.path.display(),
                path.display(),
                root.display()
            );
        }
        Ok(resolved)
    }
}

/// `cli.kyverno.io/v1alpha1` `Test` (Kyverno 1.19's `apis/v1alpha1/test.go`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct TestDoc {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    #[serde(default)]
    pub metadata: serde_json::Map<String, Value>,
    /// Deprecated: `metadata.name`.
    pub name: Option<String>,
    #[serde(default)]
    pub policies: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    pub json_payload: Option<String>,
    #[serde(default)]
    pub json_payloads: Vec<String>,
    #[serde(default)]
    pub http_payloads: Vec<String>,
    #[serde(default)]
    pub envoy_payloads: Vec<String>,
    #[serde(default)]
    pub target_resources: Vec<String>,
    pub variables: Option<String>,
    #[serde(default)]
    pub param_resources: Vec<String>,
    pub userinfo: Option<String>,
    #[serde(default)]
    pub results: Vec<ResultRow>,
    pub values: Option<ValuesSpec>,
    #[serde(default)]
    pub exceptions: Vec<String>,
    pub context: Option<String>,
    #[serde(default)]
    pub cluster_resources: Vec<String>,
    #[serde(default)]
    pub api_call_responses: Vec<Value>,
    #[serde(default)]
    pub global_context_entries: Vec<Value>,
}

impl TestDoc {
    /// Fields naming inputs ivory cannot give an image policy (payloads, mocks, targets):
    /// refused rather than ignored, so a suite never passes without what it asked for.
    pub(crate) fn unsupported_fields(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut check = |used: bool, field: &'static str| {
            if used {
                out.push(field);
            }
        };
        check(
            self.json_payload.is_some() || !self.json_payloads.is_empty(),
            "jsonPayloads",
        );
        check(!self.http_payloads.is_empty(), "httpPayloads");
        check(!self.envoy_payloads.is_empty(), "envoyPayloads");
        check(!self.target_resources.is_empty(), "targetResources");
        check(!self.param_resources.is_empty(), "paramResources");
        check(self.context.is_some(), "context");
        check(!self.api_call_responses.is_empty(), "apiCallResponses");
        check(
            !self.global_context_entries.is_empty(),
            "globalContextEntries",
        );
        out
    }
}

/// A policy-report result a row expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Expected {
    Pass,
    Fail,
    Warn,
    Error,
    Skip,
}

impl Expected {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::Warn => "warn",
            Self::Error => "error",
            Self::Skip => "skip",
        }
    }
}

/// The admission operation a row asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub(crate) enum RowOperation {
    #[serde(rename = "CREATE")]
    Create,
    #[serde(rename = "UPDATE")]
    Update,
    #[serde(rename = "DELETE")]
    Delete,
}

/// One entry of `results` (`TestResultBase` + `TestResultData`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ResultRow {
    pub policy: String,
    #[serde(default)]
    pub rule: String,
    #[serde(default)]
    pub is_validating_admission_policy: bool,
    #[serde(default)]
    pub is_mutating_admission_policy: bool,
    #[serde(default)]
    pub is_validating_policy: bool,
    #[serde(default)]
    pub is_deleting_policy: bool,
    /// Says the row is about an image policy when another kind shares its name.
    #[serde(default)]
    pub is_image_validating_policy: bool,
    #[serde(default)]
    pub is_generating_policy: bool,
    #[serde(default)]
    pub is_mutating_policy: bool,
    pub result: Expected,
    /// Kyverno matches rows to resources by name only, and so does ivory.
    #[serde(default, rename = "kind")]
    pub _kind: String,
    pub operation: Option<RowOperation>,
    pub patched_resources: Option<String>,
    pub generated_resource: Option<String>,
    pub clone_source_resource: Option<String>,
    /// About patched/generated resources, which image policy rows cannot have.
    #[serde(default, rename = "failOnMissingResources")]
    pub _fail_on_missing_resources: bool,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub resource_specs: Vec<ResourceSpec>,
    #[serde(default)]
    pub generated_resources: Vec<String>,
}

impl ResultRow {
    /// The kind of a policy the row declares that is not an image policy, if any.
    pub(crate) fn declared_other_kind(&self) -> Option<&'static str> {
        [
            (
                self.is_validating_admission_policy,
                "ValidatingAdmissionPolicy",
            ),
            (self.is_mutating_admission_policy, "MutatingAdmissionPolicy"),
            (self.is_validating_policy, "ValidatingPolicy"),
            (self.is_deleting_policy, "DeletingPolicy"),
            (self.is_generating_policy, "GeneratingPolicy"),
            (self.is_mutating_policy, "MutatingPolicy"),
        ]
        .into_iter()
        .find_map(|(set, kind)| set.then_some(kind))
    }

    /// The policy's name (a row may name it `namespace/name`).
    pub(crate) fn policy_name(&self) -> &str {
        self.policy.rsplit('/').next().unwrap_or(&self.policy)
    }
}

/// `resourceSpecs` entry: a resource by group, version, namespace and name.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ResourceSpec {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
    /// Kyverno does not compare it either.
    #[serde(default, rename = "subresource")]
    pub _subresource: String,
    #[serde(default)]
    pub name: String,
}

/// `Values` / the test's inline `values` (`apis/v1alpha1/values_spec.go`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ValuesSpec {
    /// Set in a `Values` file (`cli.kyverno.io/v1alpha1`); absent inline.
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default, rename = "metadata")]
    pub _metadata: serde_json::Map<String, Value>,
    #[serde(default)]
    pub global_values: serde_json::Map<String, Value>,
    #[serde(default)]
    pub policies: Vec<Value>,
    #[serde(default)]
    pub namespace_selector: Vec<NamespaceSelector>,
    #[serde(default)]
    pub namespaces: Vec<Value>,
    #[serde(default)]
    pub subresources: Vec<Value>,
}

/// Labels of one namespace (`namespaceSelector` of a values file).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NamespaceSelector {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// A user info file: `cli.kyverno.io/v1alpha1` `UserInfo` (Kyverno's `RequestInfo`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct UserInfoDoc {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: serde_json::Map<String, Value>,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    cluster_roles: Vec<String>,
    #[serde(default)]
    user_info: Option<ivory_engine::admission::UserInfo>,
}

/// A cluster resources file: `cli.kyverno.io/v1alpha1` `ClusterResource`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClusterResourceDoc {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: serde_json::Map<String, Value>,
    #[serde(default)]
    spec: ClusterResourceSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClusterResourceSpec {
    #[serde(default)]
    resources: Vec<Value>,
    #[serde(default)]
    crds: Vec<String>,
}

/// A test file found, with the root its inputs must stay in.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Found {
    /// The test file.
    pub file: PathBuf,
    /// The folder given (links resolved), or the given test file's folder.
    pub root: PathBuf,
}

/// Every file named `file_name` at or below each path (a path that is a file is taken as
/// is), each folder's entries in name order, hidden folders included, as Kyverno walks them.
pub(crate) fn discover(paths: &[PathBuf], file_name: &str) -> anyhow::Result<Vec<Found>> {
    let mut found = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path)
            .with_context(|| format!("{}: no such file or directory", path.display()))?;
        let (folder, files) = if meta.is_file() {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            (parent, vec![path.clone()])
        } else {
            let mut files = Vec::new();
            walk(path, file_name, 0, &mut files)?;
            (path.as_path(), files)
        };
        let root = std::fs::canonicalize(folder)
            .with_context(|| format!("{}: resolving the folder", folder.display()))?;
        found.extend(files.into_iter().map(|file| Found {
            file,
            root: root.clone(),
        }));
    }
    Ok(found)
}

fn walk(dir: &Path, file_name: &str, depth: usize, found: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if depth > MAX_DEPTH {
        bail!(
            "{}: folders nested deeper than {MAX_DEPTH} levels",
            dir.display()
        );
    }
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading folder {}", dir.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading folder {}", dir.display()))?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        // Symbolic links are not followed: a link cycle must not loop the walk.
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk(&entry.path(), file_name, depth + 1, found)?;
        } else if kind.is_file() && entry.file_name() == file_name {
            found.push(entry.path());
        }
    }
    Ok(())
}

/// Reads a suite file: a regular file (a link as the last part of `path` is not followed,
/// a FIFO does not block), at most [`MAX_FILE_BYTES`].
pub(crate) fn read(path: &Path) -> anyhow::Result<String> {
    let file = crate::cmd::files::open_regular(path)?;
    crate::cmd::wiring::read_bounded(file, &path.display().to_string(), MAX_FILE_BYTES)
}

/// Reads a file a test names, resolved and checked by [`TestCase::confine`]: opened along
/// that very path without following any link (one swapped in since is refused), a regular
/// file, at most [`MAX_FILE_BYTES`].
pub(crate) fn read_input(path: &Path) -> anyhow::Result<String> {
    let file = crate::cmd::files::open_resolved(path)?;
    crate::cmd::wiring::read_bounded(file, &path.display().to_string(), MAX_FILE_BYTES)
}

/// The tests of one file, one per YAML document; `confined`: their inputs must be under the
/// root they were found in.
pub(crate) fn load(found: &Found, confined: bool) -> anyhow::Result<Vec<TestCase>> {
    let path = found.file.as_path();
    let text = read(path)?;
    let docs = documents(&text).with_context(|| path.display().to_string())?;
    if docs.is_empty() {
        bail!("{}: no test found", path.display());
    }
    let mut tests = Vec::new();
    let count = docs.len();
    for (i, doc) in docs.into_iter().enumerate() {
        let test: TestDoc = strict(doc).with_context(|| at(path, i + 1, count))?;
        check_kind(&test, path)?;
        tests.push(TestCase {
            path: path.to_owned(),
            root: confined.then(|| found.root.clone()),
            document: i + 1,
            test,
        });
    }
    Ok(tests)
}

fn at(path: &Path, document: usize, documents: usize) -> String {
    if documents > 1 {
        format!("{} (document {document})", path.display())
    } else {
        path.display().to_string()
    }
}

fn check_kind(test: &TestDoc, path: &Path) -> anyhow::Result<()> {
    match (test.api_version.as_deref(), test.kind.as_deref()) {
        (Some("cli.kyverno.io/v1alpha1"), Some("Test")) | (None, None) => Ok(()),
        (version, kind) => bail!(
            "{}: apiVersion/kind: expected cli.kyverno.io/v1alpha1 Test, found {} {}",
            path.display(),
            version.unwrap_or("(none)"),
            kind.unwrap_or("(none)")
        ),
    }
}

/// Decodes `value`, refusing unknown fields; the error names the field's path.
pub(crate) fn strict<T: DeserializeOwned>(value: Value) -> anyhow::Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            anyhow::anyhow!("{inner}")
        } else {
            anyhow::anyhow!("field {path}: {inner}")
        }
    })
}

/// The objects of a file the test names. A syntax error names the file, the document, the
/// line and the column, never the text there: the parser's own message quotes the line, and
/// a file named by mistake (or on purpose) may hold a secret.
pub(crate) fn objects(path: &Path, text: &str) -> anyhow::Result<Vec<Value>> {
    documents(text).map_err(|e| match e.downcast_ref::<ivory_policy::DocumentError>() {
        // The parser's own message quotes the line: only its place is said.
        Some(ivory_policy::DocumentError::Yaml { number, syntax }) => {
            let location = match syntax {
                ivory_policy::SyntaxError::Yaml {
                    line: Some(line),
                    column: Some(column),
                    ..
                } => format!(" at line {line} column {column}"),
                _ => String::new(),
            };
            anyhow::anyhow!(
                "{}: document {number}: not valid YAML{location}",
                path.display()
            )
        }
        _ => anyhow::anyhow!("{}: {e}", path.display()),
    })
}

/// The single object document of a file.
fn single(path: &Path, what: &str) -> anyhow::Result<Value> {
    let text = read_input(path)?;
    let mut docs = objects(path, &text)?;
    match docs.len() {
        1 => Ok(docs.remove(0)),
        n => bail!(
            "{what} {}: expected one document, found {n}",
            path.display()
        ),
    }
}

/// The values of a `variables` file.
pub(crate) fn load_values(path: &Path) -> anyhow::Result<ValuesSpec> {
    let values: ValuesSpec = strict(single(path, "variables")?)
        .with_context(|| format!("variables {}", path.display()))?;
    match (values.api_version.as_deref(), values.kind.as_deref()) {
        (Some("cli.kyverno.io/v1alpha1"), Some("Values")) | (None, None) => Ok(values),
        (v, k) => bail!(
            "variables {}: apiVersion/kind: expected cli.kyverno.io/v1alpha1 Values, found {} {}",
            path.display(),
            v.unwrap_or("(none)"),
            k.unwrap_or("(none)")
        ),
    }
}

/// The requesting user of a `userinfo` file.
pub(crate) fn load_user_info(path: &Path) -> anyhow::Result<ivory_engine::admission::UserInfo> {
    let doc: UserInfoDoc = strict(single(path, "userinfo")?)
        .with_context(|| format!("userinfo {}", path.display()))?;
    let _ = (
        doc.api_version,
        doc.kind,
        doc.metadata,
        doc.roles,
        doc.cluster_roles,
    );
    Ok(doc.user_info.unwrap_or_default())
}

/// The objects of a `clusterResources` file.
pub(crate) fn load_cluster_resources(path: &Path) -> anyhow::Result<Vec<Value>> {
    let doc: ClusterResourceDoc = strict(single(path, "clusterResources")?)
        .with_context(|| format!("clusterResources {}", path.display()))?;
    let _ = (doc.api_version, doc.kind, doc.metadata);
    if !doc.spec.crds.is_empty() {
        bail!(
            "clusterResources {}: field spec.crds: not supported by ivory test (image policies match built-in kinds by resource rules)",
            path.display()
        );
    }
    Ok(doc.spec.resources)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<TestDoc> {
        let mut docs = documents(text)?;
        strict(docs.remove(0))
    }

    #[test]
    fn kyverno_test_files_read_strictly_with_the_field_named() {
        let t = parse(
            "apiVersion: cli.kyverno.io/v1alpha1\nkind: Test\nmetadata: {name: t}\npolicies: [p.yaml]\n\
             resources: [r.yaml]\nresults:\n- {policy: p, kind: Pod, resources: [a], result: fail, isImageValidatingPolicy: true}\n",
        )
        .unwrap();
        assert_eq!(t.results[0].result, Expected::Fail);
        assert_eq!(t.results[0].declared_other_kind(), None);
        let err = parse("results:\n- {policy: p, kind: Pod, reslt: pass, result: pass}\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("results[0]") && err.contains("reslt"), "{err}");
        let err = parse("results:\n- {policy: p, result: passed}\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("results[0].result"), "{err}");
        let err = parse("policies: p.yaml\n").unwrap_err().to_string();
        assert!(err.contains("policies"), "{err}");
    }

    #[test]
    fn discovery_skips_links_and_reads_are_capped() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/.hidden");
        std::fs::create_dir_all(&nested).unwrap();
        std::fs::write(nested.join("kyverno-test.yaml"), "results: []\n").unwrap();
        std::fs::write(dir.path().join("kyverno-test.yaml"), "results: []\n").unwrap();
        // A link back to the root would loop a walk that followed links.
        std::os::unix::fs::symlink(dir.path(), dir.path().join("a/loop")).unwrap();
        let found = discover(&[dir.path().to_owned()], "kyverno-test.yaml").unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(
            found,
            vec![
                Found {
                    file: dir.path().join("a/.hidden/kyverno-test.yaml"),
                    root: root.clone()
                },
                Found {
                    file: dir.path().join("kyverno-test.yaml"),
                    root
                }
            ]
        );
        let big = dir.path().join("big.yaml");
        let file = std::fs::File::create(&big).unwrap();
        file.set_len(MAX_FILE_BYTES + 1).unwrap();
        let err = read(&big).unwrap_err().to_string();
        assert!(err.contains("larger than"), "{err}");
        let err = discover(&[dir.path().join("missing")], "kyverno-test.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing"), "{err}");
    }

    #[test]
    fn unsupported_inputs_are_named() {
        let t = parse("jsonPayload: a.json\ncontext: c.yaml\n").unwrap();
        assert_eq!(t.unsupported_fields(), vec!["jsonPayloads", "context"]);
    }
}
