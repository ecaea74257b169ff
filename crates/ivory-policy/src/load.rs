//! Loading policies from files, directories and strings (multi-document YAML, JSON objects,
//! arrays and `kind: List`). One bad document never stops the others.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::compile::compile;
use crate::compiled::{CompiledPolicy, Origin};
use crate::error::{PolicyError, location};
use crate::exception::{CompiledException, compile_exception, is_exception};
use crate::types::{API_GROUP, PolicyDocument, PolicyKind};
use crate::unknown::unknown_fields;

mod stream;

pub use stream::{YamlDocument, yaml_documents};

/// Directory recursion limit (guards against symlink loops).
const MAX_DEPTH: usize = 16;

/// What a load produced: compiled policies, every error, and notes about skipped documents.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Policies that loaded without errors, autogen variants attached.
    pub policies: Vec<CompiledPolicy>,
    /// `PolicyException` objects found among the documents (used only when exceptions are
    /// enabled).
    pub exceptions: Vec<CompiledException>,
    /// Every problem of every document; a policy with errors is left out of `policies`.
    pub errors: Vec<PolicyError>,
    /// `<file> (doc <n>): skipped <apiVersion> <kind> "<name>": <why>` for non-policy documents.
    pub skipped: Vec<String>,
}

impl LoadReport {
    /// Appends another report, re-checking duplicate names across both.
    pub fn merge(&mut self, other: LoadReport) {
        self.errors.extend(other.errors);
        self.skipped.extend(other.skipped);
        for exception in other.exceptions {
            self.push_exception(exception);
        }
        for policy in other.policies {
            self.push_policy(policy);
        }
    }

    /// Adds a policy unless one with the same kind, namespace and name is already loaded.
    fn push_policy(&mut self, policy: CompiledPolicy) {
        let clash = self.policies.iter().find(|p| {
            p.kind == policy.kind && p.namespace == policy.namespace && p.name == policy.name
        });
        match clash {
            Some(first) => {
                let label = display_label(&policy);
                let reason = format!(
                    "Duplicate value: {:?}: {} is already defined by {}",
                    policy.name,
                    policy.kind.as_str(),
                    location(&first.origin, &display_label(first)),
                );
                self.errors.push(PolicyError::new(
                    location(&policy.origin, &label),
                    "metadata.name",
                    reason,
                ));
            }
            None => self.policies.push(policy),
        }
    }

    /// Adds an exception unless one with the same namespace and name is already loaded.
    fn push_exception(&mut self, exception: CompiledException) {
        match self.exceptions.iter().find(|e| e.key() == exception.key()) {
            Some(first) => {
                let reason = format!(
                    "Duplicate value: {:?}: PolicyException {} is already defined by {}",
                    exception.name,
                    exception.key(),
                    location(&first.origin, &first.key()),
                );
                self.errors.push(PolicyError::new(
                    location(&exception.origin, &exception.key()),
                    "metadata.name",
                    reason,
                ));
            }
            None => self.exceptions.push(exception),
        }
    }
}

fn display_label(p: &CompiledPolicy) -> String {
    match &p.namespace {
        Some(ns) => format!("{}/{ns}/{}", p.kind.as_str(), p.name),
        None => format!("{}/{}", p.kind.as_str(), p.name),
    }
}

/// Loads a file, or every `*.yaml`, `*.yml` and `*.json` file under a directory (recursively, in
/// sorted order). Entries whose name starts with `.` are skipped: Kubernetes ConfigMap volumes
/// hold each file a second time under `..data/` and `..<timestamp>/`.
pub fn load_path(path: impl AsRef<Path>) -> LoadReport {
    read_policy_files(path).load()
}

/// The bytes of policy files read in one pass, with the errors of entries that could not be
/// read: what a policy source compares between polls and then loads, so that what is loaded is
/// exactly what was compared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyFiles {
    /// Each file's path and bytes, in load order.
    pub files: Vec<(PathBuf, Vec<u8>)>,
    /// Entries that could not be listed or read.
    pub errors: Vec<PolicyError>,
}

impl PolicyFiles {
    /// Appends the files and errors of `other` (a later `--policies` path).
    pub fn merge(&mut self, other: PolicyFiles) {
        self.files.extend(other.files);
        self.errors.extend(other.errors);
    }

    /// Parses, validates and compiles every file (see [`load_path`]).
    pub fn load(&self) -> LoadReport {
        let mut report = LoadReport {
            errors: self.errors.clone(),
            ..LoadReport::default()
        };
        for (file, bytes) in &self.files {
            match std::str::from_utf8(bytes) {
                Ok(text) => {
                    let json = file.extension().is_some_and(|e| e == "json");
                    report.merge(load_text(text, file, json));
                }
                Err(_) => report.errors.push(PolicyError::new(
                    file.display().to_string(),
                    "",
                    "failed to read: stream did not contain valid UTF-8",
                )),
            }
        }
        report
    }
}

/// Reads the files [`policy_files`] lists for `path`.
pub fn read_policy_files(path: impl AsRef<Path>) -> PolicyFiles {
    let (paths, mut errors) = policy_files(path);
    let mut files = Vec::with_capacity(paths.len());
    for file in paths {
        match fs::read(&file) {
            Ok(bytes) => files.push((file, bytes)),
            Err(e) => errors.push(read_error(&file, &e)),
        }
    }
    PolicyFiles { files, errors }
}

/// The files [`load_path`] reads for `path`: the path itself when it is a file, else every
/// `*.yaml`, `*.yml` and `*.json` below it (sorted, dot entries skipped, bounded depth), plus an
/// error for each entry that could not be read. Policy sources watch exactly these files.
pub fn policy_files(path: impl AsRef<Path>) -> (Vec<PathBuf>, Vec<PolicyError>) {
    let path = path.as_ref();
    let mut report = LoadReport::default();
    let mut files = Vec::new();
    match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => collect_files(path, 0, &mut files, &mut report),
        Ok(_) => files.push(path.to_path_buf()),
        Err(e) => report.errors.push(read_error(path, &e)),
    }
    (files, report.errors)
}

/// Loads policies from text; `origin` names the source in messages (like a file name). Text
/// starting with `{` or `[` is read as JSON, anything else as (multi-document) YAML.
pub fn load_str(text: &str, origin: &str) -> LoadReport {
    let json = text.trim_start().starts_with(['{', '[']);
    load_text(text, Path::new(origin), json)
}

/// The documents of a YAML stream (or one JSON value when `text` starts with `{` or `[`), as
/// JSON values, in order; the first that does not parse is the error, naming its number and line.
/// For files that hold other objects than policies (cluster resources given on the command
/// line).
pub fn documents(text: &str) -> std::result::Result<Vec<Value>, DocumentError> {
    if text.trim_start().starts_with(['{', '[']) {
        return serde_json::from_str(text)
            .map(|v| vec![v])
            .map_err(|e| DocumentError::Json(SyntaxError::from(e)));
    }
    yaml_documents(text)
        .into_iter()
        .map(|doc| {
            doc.value.map_err(|syntax| DocumentError::Yaml {
                number: doc.number,
                syntax,
            })
        })
        .collect()
}

/// The document of a stream given to [`documents`] that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// The text starts with `{` or `[` and is not JSON.
    #[error(transparent)]
    Json(SyntaxError),
    /// A document of the YAML stream: `document <number>: <syntax error>`.
    #[error("document {number}: {syntax}")]
    Yaml {
        /// 1-based position of the document in the stream.
        number: usize,
        /// What does not parse, with its line in the whole text.
        syntax: SyntaxError,
    },
}

fn read_error(path: &Path, err: &std::io::Error) -> PolicyError {
    PolicyError::new(
        path.display().to_string(),
        "",
        format!("failed to read: {err}"),
    )
}

fn collect_files(dir: &Path, depth: usize, files: &mut Vec<PathBuf>, report: &mut LoadReport) {
    if depth > MAX_DEPTH {
        report.errors.push(PolicyError::new(
            dir.display().to_string(),
            "",
            format!("directory nesting deeper than {MAX_DEPTH} levels (symlink loop?)"),
        ));
        return;
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            report.errors.push(read_error(dir, &e));
            return;
        }
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.'))
        })
        .collect();
    paths.sort();
    for p in paths {
        match fs::metadata(&p) {
            Ok(meta) if meta.is_dir() => collect_files(&p, depth + 1, files, report),
            Ok(_) if has_policy_extension(&p) => files.push(p),
            Ok(_) => {}
            Err(e) => report.errors.push(read_error(&p, &e)),
        }
    }
}

fn has_policy_extension(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
}

/// A document that does not parse; its text is the policy error's reason.
#[derive(Debug, thiserror::Error)]
pub enum SyntaxError {
    /// A `.json` file that is not JSON.
    #[error("JSON syntax error: {0}")]
    Json(#[from] serde_json::Error),
    /// A YAML document that does not parse.
    #[error("YAML syntax error: {message}")]
    Yaml {
        /// The parser's error as `yaml::describe` words it (with the line in the whole text).
        message: String,
        /// 1-based line of the error in the whole text, when the parser knows it.
        line: Option<usize>,
        /// 1-based column of the error, when the parser knows it.
        column: Option<usize>,
    },
}

fn load_text(text: &str, file: &Path, json: bool) -> LoadReport {
    let mut report = LoadReport::default();
    let docs = if json {
        vec![YamlDocument {
            number: 1,
            value: serde_json::from_str(text).map_err(SyntaxError::from),
        }]
    } else {
        yaml_documents(text)
    };
    for doc in docs {
        let origin = Origin {
            file: Some(file.to_path_buf()),
            document: doc.number,
        };
        match doc.value {
            Ok(value) => load_value(value, "", &origin, &mut report),
            Err(reason) => report.errors.push(PolicyError::new(
                location(&origin, ""),
                "",
                reason.to_string(),
            )),
        }
    }
    report
}

/// Handles one document, expanding arrays and `kind: List`; `prefix` locates list items.
fn load_value(value: Value, prefix: &str, origin: &Origin, report: &mut LoadReport) {
    match value {
        Value::Null => {}
        Value::Array(items) => {
            for (i, item) in items.into_iter().enumerate() {
                load_value(item, &format!("{prefix}[{i}]."), origin, report);
            }
        }
        Value::Object(obj) => load_object(obj, prefix, origin, report),
        other => report.errors.push(PolicyError::new(
            location(origin, ""),
            prefix.trim_end_matches('.'),
            format!(
                "Invalid value: a document must be an object, found {}",
                json_type(&other)
            ),
        )),
    }
}

fn str_at<'v>(obj: &'v Map<String, Value>, pointer: &str) -> &'v str {
    let mut value = None;
    for (i, key) in pointer.split('/').enumerate() {
        value = if i == 0 {
            obj.get(key)
        } else {
            value.and_then(|v| v.get(key))
        };
    }
    value.and_then(Value::as_str).unwrap_or_default()
}

/// Expands `kind: List`, skips non-policies with a note and loads policies.
fn load_object(
    mut obj: Map<String, Value>,
    prefix: &str,
    origin: &Origin,
    report: &mut LoadReport,
) {
    let loc = location(origin, "");
    let api_version = str_at(&obj, "apiVersion");
    let kind = str_at(&obj, "kind");
    if kind == "List" {
        match obj.remove("items") {
            Some(Value::Array(items)) => {
                for (i, item) in items.into_iter().enumerate() {
                    load_value(item, &format!("{prefix}items[{i}]."), origin, report);
                }
            }
            _ => report
                .skipped
                .push(format!("{loc}: skipped a List without items")),
        }
        return;
    }
    if is_exception(api_version, kind) {
        match compile_exception(Value::Object(obj), origin) {
            Ok(exception) => report.push_exception(exception),
            Err(errors) => report
                .errors
                .extend(errors.into_iter().map(|e| with_prefix(e, prefix))),
        }
        return;
    }
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    if group != API_GROUP || PolicyKind::from_kind(kind).is_none() {
        let at = if prefix.is_empty() {
            String::new()
        } else {
            format!(" ({})", prefix.trim_end_matches('.'))
        };
        let name = str_at(&obj, "metadata/name");
        report.skipped.push(format!(
            "{loc}{at}: skipped {api_version} {kind} {name:?}: not an image validating policy"
        ));
        return;
    }
    load_policy(obj, prefix, origin, report);
}

/// Deserializes, checks for unknown fields and compiles one policy object.
fn load_policy(obj: Map<String, Value>, prefix: &str, origin: &Origin, report: &mut LoadReport) {
    let loc = location(origin, "");
    let input_spec = obj.get("spec").cloned().unwrap_or_default();
    let doc = match parse_document(Value::Object(obj)) {
        Ok(doc) => doc,
        Err((field, reason)) => {
            report
                .errors
                .push(PolicyError::new(loc, format!("{prefix}{field}"), reason));
            return;
        }
    };
    let unknown = unknown_spec_fields(&input_spec, &doc);
    match compile(&doc, origin.clone()) {
        Ok(policy) if unknown.is_empty() => report.push_policy(policy),
        Ok(_) => {}
        Err(errors) => report
            .errors
            .extend(errors.into_iter().map(|e| with_prefix(e, prefix))),
    }
    report.errors.extend(
        unknown
            .into_iter()
            .map(|field| PolicyError::new(&loc, format!("{prefix}{field}"), "unknown field")),
    );
}

fn unknown_spec_fields(input: &Value, doc: &PolicyDocument) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(parsed) = serde_json::to_value(&doc.spec) {
        unknown_fields(input, &parsed, "spec", &mut out);
    }
    // Sorted so the order does not depend on serde_json's map implementation.
    out.sort();
    out
}

fn with_prefix(mut err: PolicyError, prefix: &str) -> PolicyError {
    if !prefix.is_empty() {
        err.field = format!("{prefix}{}", err.field);
    }
    err
}

/// Deserializes a policy object, reporting type errors with their field path.
fn parse_document(value: Value) -> Result<PolicyDocument, (String, String)> {
    if value.get("spec").is_none_or(Value::is_null) {
        return Err(("spec".to_owned(), "Required value".to_owned()));
    }
    serde_path_to_error::deserialize::<_, PolicyDocument>(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        (field, e.into_inner().to_string())
    })
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `kind/[namespace/]name` of every loaded policy, in load order (for tests).
#[cfg(test)]
pub(crate) fn names(report: &LoadReport) -> Vec<String> {
    report.policies.iter().map(display_label).collect()
}

#[cfg(test)]
mod tests;
