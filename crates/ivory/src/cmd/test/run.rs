//! Running one Kyverno test case: its policies, exceptions and resources go through the
//! validating stage exactly as `ivory apply` and the webhook run it
//! (`wiring::run_routes`), and each `results` row is checked against what the engine
//! concluded, with Kyverno 1.19's matching rules (see docs/kyverno-semantics.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ivory_engine::admission::{AdmissionRequest, Operation, UserInfo};
use ivory_engine::decision::{PolicyResult, Status};
use ivory_engine::exceptions::Exceptions;
use ivory_engine::verifier::ImageVerifier;
use ivory_policy::CompiledPolicy;
use serde_json::Value;
use tokio::time::Instant;

use super::Console;
use super::suite::{self, Expected, ResultRow, RowOperation, TestCase, ValuesSpec};
use crate::cmd::apply::{CLUSTER_SCOPED, Op, documents, request};
use crate::cmd::wiring::{self, Stage};

/// How one row came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The engine's result is the expected one (or the policy does not apply and the row
    /// expected `pass` or `skip`).
    Pass,
    /// Anything else, a resource or policy that is not there included.
    Fail,
    /// The row is about a policy ivory does not run (not an image policy).
    NotRun,
}

/// One line of the results table (Kyverno's `table.Row`).
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub test: String,
    pub policy: String,
    pub rule: String,
    pub resource: String,
    pub outcome: Outcome,
    /// `Ok`, `Want fail, got pass`, `Not found`, `Excluded`, `Not run: …`.
    pub reason: String,
    pub message: String,
}

/// What the engine concluded for one resource under one operation.
struct Evaluated {
    key: ResourceKey,
    results: Vec<PolicyResult>,
}

/// `apiVersion, kind, namespace, name` of a test resource (Kyverno's resource key).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ResourceKey {
    api_version: String,
    kind: String,
    namespace: String,
    name: String,
}

impl ResourceKey {
    fn of(object: &Value) -> Self {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        Self {
            api_version: text(&object["apiVersion"]),
            kind: text(&object["kind"]),
            namespace: text(&object["metadata"]["namespace"]),
            name: text(&object["metadata"]["name"]),
        }
    }

    /// `v1/Pod/default/bad-pod`, as Kyverno's table shows a resource.
    fn display(&self) -> String {
        let mut parts = vec![self.api_version.as_str(), self.kind.as_str()];
        if !self.namespace.is_empty() {
            parts.push(&self.namespace);
        }
        parts.push(&self.name);
        parts.join("/")
    }

    /// A row's `resources` entry: `name` or `namespace/name`.
    fn named(&self, entry: &str) -> bool {
        match entry.split_once('/') {
            Some((ns, name)) => ns == self.namespace && name == self.name,
            None => entry == self.name,
        }
    }

    fn specified(&self, spec: &suite::ResourceSpec) -> bool {
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
struct OtherPolicy {
    kind: String,
    file: PathBuf,
    /// A legacy `kyverno.io` ClusterPolicy/Policy with `verifyImages` rules.
    legacy_verify_images: bool,
}

impl Loaded {
    /// True when an image policy of the test has the row's policy name.
    fn knows(&self, row: &ResultRow) -> bool {
        self.policies.iter().any(|p| p.name == row.policy_name())
    }

    /// The kind of policy the row is about when ivory does not run it: the kind the row
    /// declares, else that of the policy document of its name. A name both an image policy
    /// and another kind carry is the image policy's unless the row says otherwise.
    fn other_kind(&self, row: &ResultRow) -> Option<String> {
        if let Some(kind) = row.declared_other_kind() {
            return Some(kind.to_owned());
        }
        if self.knows(row) || row.is_image_validating_policy {
            return None;
        }
        self.others.get(row.policy_name()).map(|o| o.kind.clone())
    }

    /// True when ivory judges the row (it is not about another kind of policy).
    fn is_image_row(&self, row: &ResultRow) -> bool {
        self.other_kind(row).is_none()
    }
}

/// Policy documents ivory does not run, by name.
type OtherPolicies = BTreeMap<String, OtherPolicy>;

/// Everything a test case loads.
struct Loaded {
    policies: Vec<Arc<CompiledPolicy>>,
    others: BTreeMap<String, OtherPolicy>,
    exceptions: Option<Exceptions>,
    resources: Vec<Value>,
    namespaces: BTreeMap<String, Value>,
    user: Option<UserInfo>,
    operation: RowOperation,
}

/// Runs one test case's selected `rows`; an error means the test could not be run.
pub(crate) async fn run_case(
    case: &TestCase,
    rows: &[ResultRow],
    verifier: &dyn ImageVerifier,
    timeout: Duration,
    console: &Console,
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<Row>> {
    let loaded = load(case, notes)?;
    check_inputs(case, rows, &loaded)?;
    console.line(&format!(
        "  Applying {} policies to {} resources with {} exceptions ...",
        loaded.policies.len() + loaded.others.len(),
        loaded.resources.len(),
        loaded.exceptions.as_ref().map_or(0, |e| e.exceptions.len())
    ));
    refuse_legacy(case, rows, &loaded)?;
    let mut operations: BTreeSet<RowOperation> = rows.iter().filter_map(|r| r.operation).collect();
    operations.insert(loaded.operation);
    let mut evaluated = BTreeMap::new();
    for op in operations {
        evaluated.insert(op, evaluate(&loaded, op, verifier, timeout).await?);
    }
    let name = suite_name(case);
    let mut out = Vec::new();
    for row in rows {
        let op = row.operation.unwrap_or(loaded.operation);
        let results = evaluated.get(&op).map_or(&[][..], Vec::as_slice);
        let checked = check_row(&name, row, &loaded, results);
        if checked.is_empty() {
            // Kyverno prints nothing for a row with nothing to check; a row that checks
            // nothing must not pass unseen.
            out.push(Row {
                test: name.clone(),
                policy: row.policy.clone(),
                rule: row.rule.clone(),
                resource: "-".into(),
                outcome: Outcome::Fail,
                reason: "Not found".into(),
                message: "the test has no resources".into(),
            });
        }
        out.extend(checked);
    }
    Ok(out)
}

/// A test's name in reports: its name and file (Kyverno's suites all call themselves
/// `kyverno-test`).
pub(crate) fn suite_name(case: &TestCase) -> String {
    format!("{} ({})", case.name(), case.path.display())
}

/// Inputs ivory cannot give an image policy (payloads, mocks, targets, expected patched or
/// generated resources) are refused, naming the field, when a row is about an image policy;
/// a test whose rows are all about other kinds is only reported as not run.
fn check_inputs(case: &TestCase, rows: &[ResultRow], loaded: &Loaded) -> anyhow::Result<()> {
    if !rows.iter().any(|r| loaded.is_image_row(r)) {
        return Ok(());
    }
    let unsupported = case.test.unsupported_fields();
    if !unsupported.is_empty() {
        bail!(
            "{}: field {}: not supported by ivory test (ivory runs image policies on Kubernetes resources)",
            case.path.display(),
            unsupported.join(", ")
        );
    }
    for (i, row) in case.test.results.iter().enumerate() {
        if !loaded.is_image_row(row) {
            continue;
        }
        let field = [
            (row.patched_resources.is_some(), "patchedResources"),
            (row.generated_resource.is_some(), "generatedResource"),
            (!row.generated_resources.is_empty(), "generatedResources"),
            (row.clone_source_resource.is_some(), "cloneSourceResource"),
        ]
        .into_iter()
        .find_map(|(set, f)| set.then_some(f));
        if let Some(field) = field {
            bail!(
                "{}: field results[{i}].{field}: not supported for image policies by ivory test",
                case.path.display()
            );
        }
    }
    Ok(())
}

fn load(case: &TestCase, notes: &mut Vec<String>) -> anyhow::Result<Loaded> {
    let t = &case.test;
    let where_ = case.path.display();
    let values = match &t.variables {
        Some(file) => suite::load_values(&case.file(file))?,
        None => t.values.clone().unwrap_or_default(),
    };
    let operation = operation_of(&values).with_context(|| format!("{where_}: values"))?;
    if !values.policies.is_empty() || !values.subresources.is_empty() {
        notes.push(format!(
            "{where_}: values policies/subresources are not used: image policies read no Kyverno variables"
        ));
    }
    let user = match &t.userinfo {
        Some(file) => Some(suite::load_user_info(&case.file(file))?),
        None => None,
    };
    let (policies, others) = load_policies(case)?;
    for p in &policies {
        let notary: Vec<&str> = p
            .attestors
            .iter()
            .filter(|a| a.attestor.notary.is_some())
            .map(|a| a.attestor.name.as_str())
            .collect();
        if !notary.is_empty() {
            notes.push(format!(
                "{where_}: policy {:?}: notary attestors ({}) are not verified by ivory: no image verifies through them",
                p.name,
                notary.join(", ")
            ));
        }
    }
    let exceptions = load_exceptions(case)?;
    let mut resources = Vec::new();
    let mut seen = BTreeSet::new();
    for file in &t.resources {
        let path = case.file(file);
        let text = suite::read(&path).with_context(|| format!("{where_}: resources"))?;
        for mut object in
            documents(&text).with_context(|| format!("resources {}", path.display()))?
        {
            default_namespace(&mut object);
            // A resource given twice is evaluated once, as Kyverno removes duplicates.
            if seen.insert(ResourceKey::of(&object)) {
                resources.push(object);
            }
        }
    }
    let mut namespaces = BTreeMap::new();
    for file in &t.cluster_resources {
        for object in suite::load_cluster_resources(&case.file(file))? {
            if object["kind"] == "Namespace" {
                add_namespace(&mut namespaces, object);
            }
        }
    }
    for object in &values.namespaces {
        add_namespace(&mut namespaces, object.clone());
    }
    for selector in &values.namespace_selector {
        let ns = namespaces
            .entry(selector.name.clone())
            .or_insert_with(|| ivory_server::namespace_object(&selector.name));
        for (k, v) in &selector.labels {
            ns["metadata"]["labels"][k] = Value::String(v.clone());
        }
    }
    Ok(Loaded {
        policies,
        others,
        exceptions,
        resources,
        namespaces,
        user,
        operation,
    })
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
        let path = case.file(file);
        if !path.exists() {
            bail!(
                "{}: policies: {}: no such file or directory",
                case.path.display(),
                path.display()
            );
        }
        scan_other_policies(&path, &mut others)?;
        report.merge(ivory_policy::load_path(&path));
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

/// Records every policy document that is not an image policy (files of a folder included).
fn scan_other_policies(
    path: &Path,
    others: &mut BTreeMap<String, OtherPolicy>,
) -> anyhow::Result<()> {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .with_context(|| format!("reading folder {}", path.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        entries.sort();
        for entry in entries {
            let policy_file = entry
                .extension()
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json");
            if policy_file && entry.is_file() {
                scan_other_policies(&entry, others)?;
            }
        }
        return Ok(());
    }
    let text = suite::read(path)?;
    // Syntax errors are the policy loader's to report, with its messages.
    let Ok(docs) = documents(&text) else {
        return Ok(());
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
    Ok(())
}

/// A row about a legacy `verifyImages` policy cannot be answered until it is converted.
fn refuse_legacy(case: &TestCase, rows: &[ResultRow], loaded: &Loaded) -> anyhow::Result<()> {
    for row in rows {
        if let Some(other) = loaded.others.get(row.policy_name())
            && other.legacy_verify_images
            && !row.is_image_validating_policy
            && !loaded.knows(row)
        {
            bail!(
                "{}: legacy {} {:?} ({}) has verifyImages rules, which ivory runs only as ImageValidatingPolicies: \
                 run `ivory convert {}` first and point the test's policies at the converted file",
                case.path.display(),
                other.kind,
                row.policy_name(),
                other.file.display(),
                other.file.display()
            );
        }
    }
    Ok(())
}

fn load_exceptions(case: &TestCase) -> anyhow::Result<Option<Exceptions>> {
    if case.test.exceptions.is_empty() {
        return Ok(None);
    }
    let mut report = ivory_policy::LoadReport::default();
    for file in &case.test.exceptions {
        let path = case.file(file);
        if !path.exists() {
            bail!(
                "{}: exceptions: {}: no such file or directory",
                case.path.display(),
                path.display()
            );
        }
        report.merge(ivory_policy::load_path(&path));
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

/// The validating stage for every resource under `op`, as the webhook runs it.
async fn evaluate(
    loaded: &Loaded,
    op: RowOperation,
    verifier: &dyn ImageVerifier,
    timeout: Duration,
) -> anyhow::Result<Vec<Evaluated>> {
    let mut out = Vec::new();
    for object in &loaded.resources {
        let key = ResourceKey::of(object);
        let req = admission_request(object, op, loaded.user.as_ref())
            .with_context(|| format!("resource {}", key.display()))?;
        let decision = wiring::run_routes(
            verifier,
            &loaded.policies,
            loaded.exceptions.as_ref(),
            Stage::Validate,
            &req,
            loaded.namespaces.get(&key.namespace),
            Instant::now() + timeout,
        )
        .await;
        out.push(Evaluated {
            key,
            results: decision.results,
        });
    }
    Ok(out)
}

/// The request the API server would send for `object` (namespace as written, as Kyverno's
/// CLI sends it); DELETE carries the object as `oldObject` only.
fn admission_request(
    object: &Value,
    op: RowOperation,
    user: Option<&UserInfo>,
) -> anyhow::Result<AdmissionRequest> {
    let base = match op {
        RowOperation::Update => Op::Update,
        RowOperation::Create | RowOperation::Delete => Op::Create,
    };
    let mut req = request(object.clone(), base, "")?;
    if op == RowOperation::Delete {
        req.operation = Operation::Delete;
        req.old_object = req.object.take();
    }
    if let Some(user) = user {
        req.user_info = user.clone();
    }
    Ok(req)
}

/// The Kyverno report result and rule name of an engine result: an IVP's rule is named
/// after the policy; an exception's skip is rule `exception`; an error, or a failure
/// `failurePolicy: Ignore` let through, is Kyverno's `error` of rule `evaluation`.
fn actual(result: &PolicyResult) -> (&'static str, String) {
    match result.status {
        Status::Pass => ("pass", result.policy.clone()),
        Status::Fail => ("fail", result.policy.clone()),
        Status::Skip if result.properties.contains_key("exceptions") => {
            ("skip", "exception".to_owned())
        }
        Status::Skip | Status::Error => ("error", "evaluation".to_owned()),
    }
}

fn check_row(test: &str, row: &ResultRow, loaded: &Loaded, evaluated: &[Evaluated]) -> Vec<Row> {
    let make = |resource: String, outcome, reason: String, message: String, rule: &str| Row {
        test: test.to_owned(),
        policy: row.policy.clone(),
        rule: rule.to_owned(),
        resource,
        outcome,
        reason,
        message,
    };
    let known = loaded.knows(row);
    let other_kind = loaded.other_kind(row);
    let (matched, missing) = select_resources(row, evaluated);
    if let Some(kind) = other_kind {
        let mut resources: Vec<String> = matched.iter().map(|e| e.key.display()).collect();
        resources.extend(missing);
        if resources.is_empty() {
            resources.push("-".to_owned());
        }
        return resources
            .into_iter()
            .map(|r| {
                make(
                    r,
                    Outcome::NotRun,
                    format!("Not run: {kind} is not an image policy"),
                    String::new(),
                    &row.rule,
                )
            })
            .collect();
    }
    let mut rows: Vec<Row> = missing
        .into_iter()
        .map(|name| {
            make(
                name,
                Outcome::Fail,
                "Not found".into(),
                "no such resource in the test's resources".into(),
                &row.rule,
            )
        })
        .collect();
    for e in matched {
        let resource = e.key.display();
        if !known {
            rows.push(make(
                resource,
                Outcome::Fail,
                "Not found".into(),
                format!("no policy {:?} among the test's policies", row.policy),
                &row.rule,
            ));
            continue;
        }
        let results: Vec<&PolicyResult> = e
            .results
            .iter()
            .filter(|r| r.policy == row.policy_name() && namespace_fits(row, r))
            .collect();
        if results.is_empty() {
            rows.push(excluded(
                row,
                make(
                    resource,
                    Outcome::Pass,
                    String::new(),
                    String::new(),
                    &row.rule,
                ),
            ));
            continue;
        }
        for r in results {
            let (got, rule) = actual(r);
            let ok = got == row.result.as_str();
            let message = if r.message.is_empty() && got == "pass" {
                "success".to_owned()
            } else {
                r.message.clone()
            };
            rows.push(make(
                resource.clone(),
                if ok { Outcome::Pass } else { Outcome::Fail },
                if ok {
                    "Ok".into()
                } else {
                    format!("Want {}, got {got}", row.result.as_str())
                },
                message,
                &rule,
            ));
        }
    }
    rows
}

/// A policy that does not apply to the resource (match rules, matchConditions): Kyverno
/// shows such a ClusterPolicy row as passed, "Excluded". ivory does so only when the row
/// expected `pass` or `skip`; a row expecting `fail`, `warn` or `error` fails, since the
/// policy never judged the resource.
fn excluded(row: &ResultRow, mut line: Row) -> Row {
    line.reason = "Excluded".into();
    line.message = "the policy does not apply to this resource".into();
    if matches!(row.result, Expected::Pass | Expected::Skip) {
        line.outcome = Outcome::Pass;
    } else {
        line.outcome = Outcome::Fail;
        line.reason = format!("Want {}, got excluded", row.result.as_str());
    }
    line
}

fn namespace_fits(row: &ResultRow, r: &PolicyResult) -> bool {
    match row.policy.rsplit_once('/') {
        Some((ns, _)) => r.namespace.as_deref() == Some(ns),
        None => true,
    }
}

/// The resources a row names (`resources`, `resourceSpecs`), and the names that match none;
/// a row naming none is about every resource.
fn select_resources<'a>(
    row: &ResultRow,
    evaluated: &'a [Evaluated],
) -> (Vec<&'a Evaluated>, Vec<String>) {
    if row.resources.is_empty() && row.resource_specs.is_empty() {
        return (evaluated.iter().collect(), Vec::new());
    }
    let mut matched: Vec<&Evaluated> = Vec::new();
    let mut missing = Vec::new();
    for name in &row.resources {
        let found: Vec<&Evaluated> = evaluated.iter().filter(|e| e.key.named(name)).collect();
        if found.is_empty() {
            missing.push(name.clone());
        }
        matched.extend(found);
    }
    for spec in &row.resource_specs {
        let found: Vec<&Evaluated> = evaluated.iter().filter(|e| e.key.specified(spec)).collect();
        if found.is_empty() {
            missing.push(format!("{}/{}", spec.namespace, spec.name));
        }
        matched.extend(found);
    }
    matched.dedup_by(|a, b| a.key == b.key);
    (matched, missing)
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

    #[test]
    fn engine_results_read_as_kyverno_report_results() {
        let mut r = PolicyResult {
            policy: "ivpol".into(),
            namespace: None,
            status: Status::Pass,
            message: String::new(),
            properties: BTreeMap::new(),
            images: Vec::new(),
            deny: true,
            warn: false,
            audit: false,
        };
        assert_eq!(actual(&r), ("pass", "ivpol".to_owned()));
        r.status = Status::Skip;
        assert_eq!(actual(&r), ("error", "evaluation".to_owned()));
        r.properties.insert("exceptions".into(), "e".into());
        assert_eq!(actual(&r), ("skip", "exception".to_owned()));
    }
}
