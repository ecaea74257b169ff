//! What happens to policy results after the answer: one structured log line per result
//! (target `ivory::audit`), the `policy_results_total` metric, and, with `--kube`, a
//! Kyverno-compatible PolicyReport (handed to a [`ReportSink`], which writes asynchronously so
//! admission latency does not move).
//!
//! Which admission requests are reported follows Kyverno (`docs/kyverno-semantics.md` §10):
//! only the validating stage; not when any evaluated policy has `Deny` among its actions
//! (background scans cover those); never for dry-run, DELETE or subresource requests.

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use ivory_engine::admission::{AdmissionRequest, Operation};
use ivory_engine::decision::{PolicyResult, Status};
use ivory_engine::exceptions::EXCEPTIONS_PROPERTY;

use crate::metrics::Metrics;

/// `source` of every result ivory reports (Kyverno's `SourceImageValidatingPolicy`).
pub const REPORT_SOURCE: &str = "KyvernoImageValidatingPolicy";
/// `properties.process` of admission results (Kyverno's wording).
pub const PROCESS_ADMISSION: &str = "admission review";
/// `properties.process` of background results (Kyverno's wording).
pub const PROCESS_BACKGROUND: &str = "background scan";

/// Why a policy ran: the `rule_execution_cause` metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The policy judged an AdmissionReview.
    Admission,
    /// The policy re-judged a running Pod's images in a background scan.
    Background,
}

impl Cause {
    fn label(self) -> &'static str {
        match self {
            Self::Admission => "admission_request",
            Self::Background => "background_scan",
        }
    }
}

/// The object a report is about (`scope` of a PolicyReport).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subject {
    /// `apiVersion` of the object (`group/version`, or `version` for the core group).
    pub api_version: String,
    /// `kind` of the object.
    pub kind: String,
    /// Empty for cluster-scoped objects (they get a ClusterPolicyReport).
    pub namespace: String,
    /// `metadata.name` of the object.
    pub name: String,
    /// `metadata.uid`: names the report and owns it, so the report goes with the object.
    pub uid: String,
}

impl Subject {
    /// The object of an AdmissionRequest (`None` when it has no UID to key a report by).
    pub fn of_request(req: &AdmissionRequest) -> Option<Self> {
        let object = req.subject()?;
        let uid = object.uid().unwrap_or_default().to_owned();
        if uid.is_empty() {
            return None;
        }
        let group = &req.kind.group;
        Some(Self {
            api_version: if group.is_empty() {
                req.kind.version.clone()
            } else {
                format!("{group}/{}", req.kind.version)
            },
            kind: req.kind.kind.clone(),
            namespace: req.namespace.clone(),
            name: if req.name.is_empty() {
                object.name().unwrap_or_default().to_owned()
            } else {
                req.name.clone()
            },
            uid,
        })
    }
}

/// One result as a PolicyReport holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportResult {
    /// `name`, or `namespace/name` for a NamespacedImageValidatingPolicy (Kyverno's key).
    pub policy: String,
    /// The policy name, or `exception` for a result an exception decided (Kyverno's rule name).
    pub rule: String,
    /// pass, fail, skip or error.
    pub result: Status,
    /// Why, in Kyverno's words.
    pub message: String,
    /// auditAnnotations, exceptions and `process` of the result.
    pub properties: BTreeMap<String, String>,
}

impl ReportResult {
    /// Kyverno's report result for `result` (`process` is [`PROCESS_ADMISSION`] or
    /// [`PROCESS_BACKGROUND`]).
    pub fn from_policy_result(result: &PolicyResult, process: &str) -> Self {
        let policy = match &result.namespace {
            Some(ns) => format!("{ns}/{}", result.policy),
            None => result.policy.clone(),
        };
        let excepted = result.properties.contains_key(EXCEPTIONS_PROPERTY);
        let mut properties = result.properties.clone();
        properties.insert("process".to_owned(), process.to_owned());
        Self {
            policy,
            rule: if excepted {
                "exception".to_owned()
            } else {
                result.policy.clone()
            },
            result: result.status,
            message: result.message.clone(),
            properties,
        }
    }
}

/// Everything reported about one object at one time.
#[derive(Clone, Debug)]
pub struct ReportUpdate {
    /// The object the results are about.
    pub subject: Subject,
    /// One result per policy; a policy's newer result replaces its older one.
    pub results: Vec<ReportResult>,
}

/// Takes report updates without blocking (the Kubernetes report writer).
pub trait ReportSink: Send + Sync {
    /// Queues `update`; never waits (a full queue drops it and counts the drop).
    fn submit(&self, update: ReportUpdate);
}

/// Logs and counts every result of a validating decision, and hands a report update to
/// `sink` when Kyverno would report the request.
pub fn after_validation(
    metrics: &Metrics,
    sink: Option<&Arc<dyn ReportSink>>,
    req: &RequestFields<'_>,
    results: &[PolicyResult],
) {
    log_results_of(req, results, Cause::Admission);
    let req = req.request;
    for result in results {
        metrics.policy_result(
            &result.policy,
            result.namespace.as_deref().unwrap_or_default(),
            result.status,
            Cause::Admission.label(),
        );
    }
    let Some(sink) = sink else { return };
    if results.is_empty() || !reportable(req, results) {
        return;
    }
    let Some(subject) = Subject::of_request(req) else {
        return;
    };
    sink.submit(ReportUpdate {
        subject,
        results: results
            .iter()
            .map(|r| ReportResult::from_policy_result(r, PROCESS_ADMISSION))
            .collect(),
    });
}

/// Logs, counts and reports (always: background results are reported whatever the policies'
/// actions, as Kyverno's background scans do) the results of a background scan of one object.
pub fn after_background(
    metrics: &Metrics,
    sink: Option<&Arc<dyn ReportSink>>,
    req: &AdmissionRequest,
    results: &[PolicyResult],
) {
    log_results(req, results, Cause::Background);
    for result in results {
        metrics.policy_result(
            &result.policy,
            result.namespace.as_deref().unwrap_or_default(),
            result.status,
            Cause::Background.label(),
        );
    }
    let (Some(sink), Some(subject)) = (sink, Subject::of_request(req)) else {
        return;
    };
    if results.is_empty() {
        return;
    }
    sink.submit(ReportUpdate {
        subject,
        results: results
            .iter()
            .map(|r| ReportResult::from_policy_result(r, PROCESS_BACKGROUND))
            .collect(),
    });
}

/// Kyverno's rules for admission reports. Only the policies that produced a result count
/// (Kyverno's `response.Policies`): one on the route that did not match, or whose
/// matchConditions were false, suppresses nothing (docs/kyverno-semantics.md §10).
fn reportable(req: &AdmissionRequest, results: &[PolicyResult]) -> bool {
    !results.iter().any(|r| r.deny)
        && !req.dry_run.unwrap_or(false)
        && req.operation != Operation::Delete
        && req.sub_resource().is_empty()
}

/// One structured line per result: the audit log without `--kube` (and beside the reports).
/// The line's fields are written here, the request's once for all its results, and handed over as one field of JSON members
/// ([`LOG_MEMBERS_FIELD`](ivory_plumbing::json_text::LOG_MEMBERS_FIELD)) that ivory's log format
/// puts in the line as they are: visiting twelve fields per result cost more than writing them
/// (BENCHMARKS.md, issue 47). The result's own message is `policy_message`: as `message` it was
/// a second `message` key beside the line's own ("policy result"), which JSON readers resolve
/// differently (most keep the last, so the line's own was lost).
pub fn log_results(req: &AdmissionRequest, results: &[PolicyResult], cause: Cause) {
    log_results_of(&RequestFields::new(req), results, cause);
}

/// [`log_results`] with the request's fields written once for every line about it.
pub fn log_results_of(req: &RequestFields<'_>, results: &[PolicyResult], cause: Cause) {
    use ivory_plumbing::json_text::push_member;
    if results.is_empty() || !tracing::enabled!(target: "ivory::audit", tracing::Level::INFO) {
        return;
    }
    let request = req.members();
    let mut line = String::with_capacity(request.len() + 512);
    for result in results {
        line.clear();
        push_member(&mut line, true, "cause", cause.label());
        line.push_str(request);
        result_members(&mut line, result);
        match ivory_plumbing::json_text::members_log() {
            Some(log) => log.info("ivory::audit", "policy result", &line),
            // The message as a string field: written as a format string's would be, without
            // formatting it (~400 instructions a line, issue 47).
            None => tracing::info!(
                target: "ivory::audit",
                message = "policy result",
                json_members = line.as_str()
            ),
        }
    }
}

/// A request and its fields as every line the server writes about it has them (its results
/// here, the admission line in `routes`): written on first use, once for all the lines.
pub struct RequestFields<'r> {
    /// The request.
    pub request: &'r AdmissionRequest,
    members: OnceCell<String>,
}

impl<'r> RequestFields<'r> {
    /// `request`'s fields, not written yet.
    pub fn new(request: &'r AdmissionRequest) -> Self {
        Self {
            request,
            members: OnceCell::new(),
        }
    }

    /// `,"uid":…,"kind":…,"namespace":…,"name":…,"operation":…`.
    pub(crate) fn members(&self) -> &str {
        self.members.get_or_init(|| {
            let mut out = String::with_capacity(256);
            push_request_members(&mut out, self.request);
            out
        })
    }
}

/// `,"uid":…,"kind":…,"namespace":…,"name":…,"operation":…` of `req`.
fn push_request_members(out: &mut String, req: &AdmissionRequest) {
    use ivory_plumbing::json_text::push_member;
    push_member(out, false, "uid", &req.uid);
    push_member(out, false, "kind", &req.kind.kind);
    push_member(out, false, "namespace", &req.namespace);
    push_member(out, false, "name", &req.name);
    push_member(out, false, "operation", req.operation.as_str());
}

/// `,"policy":…,"policy_namespace":…,"result":…,"policy_message":…,"properties":…,"images":…`
/// (properties as `k=v` pairs and images joined by commas, as before).
fn result_members(out: &mut String, result: &PolicyResult) {
    use ivory_plumbing::json_text::{push_joined, push_key, push_member};
    push_member(out, false, "policy", &result.policy);
    let policy_namespace = result.namespace.as_deref().unwrap_or_default();
    push_member(out, false, "policy_namespace", policy_namespace);
    push_member(out, false, "result", result.status.as_str());
    push_member(out, false, "policy_message", &result.message);
    push_key(out, false, "properties");
    let pairs = result
        .properties
        .iter()
        .flat_map(|(k, v)| [k.as_str(), "=", v.as_str(), ","]);
    // `k=v` pairs joined by commas: the pairs' pieces with the last comma left off.
    let pieces = 4 * result.properties.len();
    push_joined(out, pairs.take(pieces.saturating_sub(1)), "");
    push_key(out, false, "images");
    push_joined(out, result.images.iter().map(String::as_str), ",");
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivory_engine::admission::AdmissionReview;

    fn request(dry_run: bool, operation: &str) -> AdmissionRequest {
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "name": "web", "namespace": "team", "operation": operation, "dryRun": dry_run,
                "object": {"metadata": {"name": "web", "uid": "1234"}}
            }
        });
        AdmissionReview::parse(review.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{e}"))
            .request
    }

    #[test]
    fn subject_and_result_follow_kyvernos_report_shape() {
        let req = request(false, "CREATE");
        let subject = Subject::of_request(&req).unwrap_or_default();
        assert_eq!(
            (
                subject.api_version.as_str(),
                subject.kind.as_str(),
                subject.uid.as_str()
            ),
            ("v1", "Pod", "1234")
        );
        let skipped = PolicyResult {
            policy: "check".into(),
            namespace: Some("team".into()),
            status: Status::Skip,
            message: "rule is skipped due to policy exception: team/allow".into(),
            properties: BTreeMap::from([(EXCEPTIONS_PROPERTY.to_owned(), "allow".to_owned())]),
            images: vec![],
            deny: false,
            warn: false,
            audit: true,
        };
        let r = ReportResult::from_policy_result(&skipped, PROCESS_ADMISSION);
        assert_eq!(r.policy, "team/check");
        assert_eq!(r.rule, "exception");
        assert_eq!(r.properties["process"], "admission review");
        assert_eq!(r.properties["exceptions"], "allow");
    }

    fn result_of(policy: &str, deny: bool) -> PolicyResult {
        PolicyResult {
            policy: policy.into(),
            namespace: None,
            status: Status::Pass,
            message: String::new(),
            properties: BTreeMap::new(),
            images: vec![],
            deny,
            warn: false,
            audit: !deny,
        }
    }

    #[test]
    fn a_deny_policy_among_the_evaluated_suppresses_the_admission_report() {
        let req = request(false, "CREATE");
        assert!(reportable(&req, &[result_of("audit", false)]));
        assert!(
            !reportable(&req, &[result_of("audit", false), result_of("deny", true)]),
            "Kyverno: a Deny policy suppresses the admission report, even one that passed"
        );
    }

    #[test]
    fn dry_run_delete_and_subresources_are_not_reported() {
        let audited = [result_of("audit", false)];
        assert!(reportable(&request(false, "CREATE"), &audited));
        assert!(!reportable(&request(true, "CREATE"), &audited));
        assert!(!reportable(&request(false, "DELETE"), &audited));
        let mut sub = request(false, "UPDATE");
        sub.sub_resource = Some("ephemeralcontainers".into());
        assert!(!reportable(&sub, &audited));
    }
}
