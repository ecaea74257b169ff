//! Running one Kyverno test case: its policies, exceptions and resources go through the
//! validating stage exactly as `ivory apply` and the webhook run it
//! (`ivory_engine::pipeline::run_routes`), and each `results` row is checked against what the engine
//! concluded, with Kyverno 1.19's matching rules (see docs/kyverno-semantics.md).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, bail};
use ivory_engine::admission::{AdmissionRequest, Operation, UserInfo};
use ivory_engine::decision::{PolicyResult, Status};
use ivory_engine::pipeline::{Routes, Stage, run_routes};
use ivory_engine::verifier::ImageVerifier;
use serde_json::Value;
use tokio::time::Instant;

use super::Console;
use super::load::{Loaded, ResourceKey, load};
use super::suite::{Expected, ResultRow, RowOperation, TestCase};
use crate::cmd::apply::{Op, request};
use crate::cmd::wiring;

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
        let mut req = admission_request(object, op, loaded.user.as_ref())
            .with_context(|| format!("resource {}", key.display()))?;
        let namespace = loaded.namespaces.get(&key.namespace);
        let deadline = ivory_clock::now() + timeout;
        pin_for_legacy_rules(loaded, verifier, &mut req, namespace, deadline)
            .await
            .with_context(|| format!("resource {}", key.display()))?;
        let routes = Routes {
            verifier,
            resources: &loaded.cluster,
            policies: &loaded.policies,
            exceptions: loaded.exceptions.as_ref(),
        };
        let decision = run_routes(&routes, Stage::Validate, &mut req, namespace, deadline)
            .await
            .with_context(|| format!("resource {}", key.display()))?;
        out.push(Evaluated {
            key,
            results: decision.results,
        });
    }
    Ok(out)
}

/// Kyverno runs a legacy `verifyImages` rule as one step that pins tags to digests and then
/// verifies: the converted policies' mutating stage runs first and the validating stage sees
/// the pinned object, as the API server would send it (a tag the registry cannot resolve stays
/// a tag, and the policies' `verifyDigest` then says so).
async fn pin_for_legacy_rules(
    loaded: &Loaded,
    verifier: &dyn ImageVerifier,
    req: &mut AdmissionRequest,
    namespace: Option<&Value>,
    deadline: Instant,
) -> anyhow::Result<()> {
    if loaded.legacy.policies.is_empty() || req.object.is_none() {
        return Ok(());
    }
    let routes = Routes {
        verifier,
        resources: &loaded.cluster,
        policies: &loaded.legacy.policies,
        exceptions: loaded.exceptions.as_ref(),
    };
    let mutate = run_routes(&routes, Stage::Mutate, req, namespace, deadline).await?;
    if mutate.allowed
        && let Some(object) = req.object.as_mut()
    {
        let mut patched = object.value().clone();
        wiring::apply_patch(&mut patched, &mutate)?;
        *object = patched.into();
    }
    Ok(())
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
            .filter(|r| r.policy == loaded.engine_policy(row) && namespace_fits(row, r))
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
        let legacy = loaded.legacy.has_policy(row.policy_name());
        for r in results {
            let (got, rule) = actual(r);
            // A converted legacy rule keeps the name the row gave it.
            let rule = if legacy { row.rule.clone() } else { rule };
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
