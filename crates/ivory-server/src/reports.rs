//! Kyverno-compatible PolicyReports (`wgpolicyk8s.io/v1alpha2` PolicyReport for namespaced
//! objects, ClusterPolicyReport for cluster-scoped ones), written asynchronously.
//!
//! Admission handlers only queue an update ([`ReportSink::submit`] never waits; a full queue
//! drops the update and counts it). One writer task gathers updates for a short window,
//! merges those about the same object, and writes each report with bounded concurrency:
//! read the current report, replace the results of the policies in the update (keyed by
//! policy), recount the summary, and server-side apply it. Reports are named by the object's
//! UID, carry it as `scope` and as owner (so they go when the object goes), as Kyverno's do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::policy_results::{REPORT_SOURCE, ReportResult, ReportSink, ReportUpdate, Subject};

/// API group of the reports.
pub const REPORT_GROUP: &str = "wgpolicyk8s.io";
/// API version of the reports.
pub const REPORT_VERSION: &str = "v1alpha2";
/// Field manager of ivory's server-side applies.
const FIELD_MANAGER: &str = "ivory";
/// Label marking reports ivory wrote.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "ivory");
/// Updates waiting to be written; past this, updates are dropped (and counted).
const QUEUE: usize = 4096;
/// How long the writer gathers updates before writing them.
const BATCH_WINDOW: Duration = Duration::from_millis(500);
/// Most updates gathered into one batch.
const BATCH_MAX: usize = 512;
/// Reports written at the same time.
const WRITERS: usize = 4;

/// The PolicyReport resource.
pub fn policy_report_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk(REPORT_GROUP, REPORT_VERSION, "PolicyReport");
    ApiResource::from_gvk_with_plural(&gvk, "policyreports")
}

/// The ClusterPolicyReport resource.
pub fn cluster_policy_report_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk(REPORT_GROUP, REPORT_VERSION, "ClusterPolicyReport");
    ApiResource::from_gvk_with_plural(&gvk, "clusterpolicyreports")
}

/// The queue in front of the writer task.
pub struct KubeReports {
    queue: mpsc::Sender<ReportUpdate>,
    metrics: Arc<Metrics>,
}

impl KubeReports {
    /// Starts the writer task.
    pub fn start(client: Client, metrics: Arc<Metrics>) -> Arc<Self> {
        let (queue, updates) = mpsc::channel(QUEUE);
        tokio::spawn(write_loop(client, updates, metrics.clone()));
        Arc::new(Self { queue, metrics })
    }
}

impl ReportSink for KubeReports {
    fn submit(&self, update: ReportUpdate) {
        if self.queue.try_send(update).is_err() {
            self.metrics.report_dropped("queue_full");
            tracing::warn!("report queue full; a report update was dropped");
        }
    }
}

async fn write_loop(
    client: Client,
    mut updates: mpsc::Receiver<ReportUpdate>,
    metrics: Arc<Metrics>,
) {
    while let Some(first) = updates.recv().await {
        let mut batch: BTreeMap<String, ReportUpdate> = BTreeMap::new();
        merge(&mut batch, first);
        let until = ivory_clock::now() + BATCH_WINDOW;
        while batch.len() < BATCH_MAX {
            match tokio::time::timeout_at(until, updates.recv()).await {
                Ok(Some(update)) => merge(&mut batch, update),
                _ => break,
            }
        }
        futures::stream::iter(batch.into_values())
            .for_each_concurrent(WRITERS, |update| {
                let (client, metrics) = (client.clone(), metrics.clone());
                async move {
                    match write(&client, &update).await {
                        Ok(()) => metrics.report_written(),
                        Err(e) => {
                            metrics.report_dropped("api_error");
                            tracing::warn!(kind = %update.subject.kind, namespace = %update.subject.namespace, name = %update.subject.name, error = %e, "writing the policy report failed");
                        }
                    }
                }
            })
            .await;
    }
}

/// Adds `update` to the batch; a later result of the same policy replaces an earlier one.
fn merge(batch: &mut BTreeMap<String, ReportUpdate>, update: ReportUpdate) {
    match batch.get_mut(&update.subject.uid) {
        Some(pending) => {
            pending.results = merged_results(std::mem::take(&mut pending.results), update.results);
            pending.subject = update.subject;
        }
        None => {
            batch.insert(update.subject.uid.clone(), update);
        }
    }
}

fn merged_results(old: Vec<ReportResult>, new: Vec<ReportResult>) -> Vec<ReportResult> {
    let mut out: Vec<ReportResult> = old
        .into_iter()
        .filter(|o| !new.iter().any(|n| n.policy == o.policy))
        .collect();
    out.extend(new);
    out
}

/// Reads the report of `update.subject`, replaces the results of the updated policies and
/// applies it.
async fn write(client: &Client, update: &ReportUpdate) -> Result<(), kube::Error> {
    let subject = &update.subject;
    let (api, kind) = if subject.namespace.is_empty() {
        (
            Api::<DynamicObject>::all_with(client.clone(), &cluster_policy_report_resource()),
            "ClusterPolicyReport",
        )
    } else {
        (
            Api::<DynamicObject>::namespaced_with(
                client.clone(),
                &subject.namespace,
                &policy_report_resource(),
            ),
            "PolicyReport",
        )
    };
    let kept: Vec<Value> = match api.get_opt(&subject.uid).await? {
        Some(existing) => existing
            .data
            .get("results")
            .and_then(Value::as_array)
            .map(|results| {
                results
                    .iter()
                    .filter(|r| {
                        let policy = r.get("policy").and_then(Value::as_str).unwrap_or_default();
                        !update.results.iter().any(|n| n.policy == policy)
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let now = ivory_clock::unix_seconds();
    let mut results = kept;
    results.extend(update.results.iter().map(|r| result_json(r, now)));
    let report = report_json(kind, subject, results);
    api.patch(
        &subject.uid,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&report),
    )
    .await?;
    Ok(())
}

fn result_json(r: &ReportResult, now: u64) -> Value {
    let mut result = json!({
        "source": REPORT_SOURCE,
        "policy": r.policy,
        "rule": r.rule,
        "result": r.result.as_str(),
        "message": r.message,
        "scored": true,
        "timestamp": {"seconds": now, "nanos": 0},
    });
    if !r.properties.is_empty()
        && let Some(obj) = result.as_object_mut()
    {
        obj.insert("properties".to_owned(), json!(r.properties));
    }
    result
}

/// The whole report object for `subject` with `results`, summary recounted.
fn report_json(kind: &str, subject: &Subject, results: Vec<Value>) -> Value {
    let mut summary: BTreeMap<&str, u64> = ["pass", "fail", "warn", "error", "skip"]
        .map(|k| (k, 0))
        .into();
    for r in &results {
        if let Some(n) = r
            .get("result")
            .and_then(Value::as_str)
            .and_then(|k| summary.get_mut(k))
        {
            *n += 1;
        }
    }
    let mut metadata = Map::new();
    metadata.insert("name".to_owned(), json!(subject.uid));
    if !subject.namespace.is_empty() {
        metadata.insert("namespace".to_owned(), json!(subject.namespace));
    }
    metadata.insert("labels".to_owned(), json!({MANAGED_BY.0: MANAGED_BY.1}));
    metadata.insert(
        "ownerReferences".to_owned(),
        json!([{
            "apiVersion": subject.api_version,
            "kind": subject.kind,
            "name": subject.name,
            "uid": subject.uid,
        }]),
    );
    let mut scope = json!({
        "apiVersion": subject.api_version,
        "kind": subject.kind,
        "name": subject.name,
        "uid": subject.uid,
    });
    if !subject.namespace.is_empty()
        && let Some(obj) = scope.as_object_mut()
    {
        obj.insert("namespace".to_owned(), json!(subject.namespace));
    }
    json!({
        "apiVersion": format!("{REPORT_GROUP}/{REPORT_VERSION}"),
        "kind": kind,
        "metadata": metadata,
        "scope": scope,
        "summary": summary,
        "results": results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_engine::decision::Status;

    fn result(policy: &str, status: Status) -> ReportResult {
        ReportResult {
            policy: policy.into(),
            rule: policy.into(),
            result: status,
            message: String::new(),
            properties: BTreeMap::from([("process".into(), "admission review".into())]),
        }
    }

    #[test]
    fn later_results_of_a_policy_replace_earlier_ones_and_the_summary_counts_them() {
        let subject = Subject {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: "team".into(),
            name: "web".into(),
            uid: "u-1".into(),
        };
        let mut batch = BTreeMap::new();
        merge(
            &mut batch,
            ReportUpdate {
                subject: subject.clone(),
                results: vec![result("a", Status::Fail), result("b", Status::Pass)],
            },
        );
        merge(
            &mut batch,
            ReportUpdate {
                subject: subject.clone(),
                results: vec![result("a", Status::Pass)],
            },
        );
        let update = &batch["u-1"];
        let statuses: Vec<(&str, Status)> = update
            .results
            .iter()
            .map(|r| (r.policy.as_str(), r.result))
            .collect();
        assert_eq!(statuses, [("b", Status::Pass), ("a", Status::Pass)]);
        let results = update.results.iter().map(|r| result_json(r, 7)).collect();
        let report = report_json("PolicyReport", &subject, results);
        assert_eq!(report["summary"]["pass"], 2);
        assert_eq!(report["summary"]["fail"], 0);
        assert_eq!(report["scope"]["uid"], "u-1");
        assert_eq!(report["metadata"]["name"], "u-1");
        assert_eq!(
            report["results"][0]["source"],
            "KyvernoImageValidatingPolicy"
        );
        assert_eq!(report["results"][0]["timestamp"]["seconds"], 7);
    }
}
