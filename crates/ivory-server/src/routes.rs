//! The HTTP surface: the four admission routes plus `/healthz`, `/readyz` and `/metrics`.
//!
//! Every admission answer is an `admission.k8s.io/v1` AdmissionReview with the request's uid,
//! except for bodies that are not one: those get 400 with the parse error (413 past the body
//! limit), so the API server applies the webhook's failurePolicy.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use ivory_engine::admission::{
    AdmissionError, AdmissionRequest, AdmissionResponse, AdmissionReview, ResponseStatus,
    response_from_decision, review_response,
};
use ivory_engine::decision::Decision;
use ivory_engine::matching::{Route, UnknownPolicies, select_policies};
use ivory_engine::verifier::ImageVerifier;
use ivory_engine::{mutate, validate};
use ivory_policy::CompiledPolicy;
use ivory_policy::types::FailurePolicy;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::budget::{Budget, timeout_from_query};
use crate::metrics::Metrics;
use crate::policies::PolicyStore;

/// Default request body limit: an UPDATE review carries `object` and `oldObject`, and etcd
/// caps one object at 1.5 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 3 * 1024 * 1024;

/// Where `namespaceObject` comes from (a Namespace informer, later). Without one the server
/// synthesizes it with [`namespace_object`].
pub trait NamespaceSource: Send + Sync {
    /// The Namespace object named `name`, or `None` when it is not known.
    fn namespace(&self, name: &str) -> Option<Value>;
}

/// Shared state of every handler; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub verifier: Arc<dyn ImageVerifier>,
    pub policies: Arc<PolicyStore>,
    pub metrics: Arc<Metrics>,
    /// `None`: synthesize namespace objects from the request's namespace name.
    pub namespaces: Option<Arc<dyn NamespaceSource>>,
    /// Largest accepted request body in bytes.
    pub body_limit: usize,
}

impl AppState {
    /// State with the default body limit.
    pub fn new(
        verifier: Arc<dyn ImageVerifier>,
        policies: Arc<PolicyStore>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            verifier,
            policies,
            metrics,
            namespaces: None,
            body_limit: DEFAULT_BODY_LIMIT,
        }
    }
}

/// Which of the two webhook stages a route serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Mutate,
    Validate,
}

/// The router with all routes and the body limit.
pub fn router(state: AppState) -> Router {
    let limit = state.body_limit;
    Router::new()
        .route("/ivpol/mutate/{*names}", post(ivpol_mutate))
        .route("/ivpol/validate/{*names}", post(ivpol_validate))
        .route("/nivpol/mutate/{*names}", post(nivpol_mutate))
        .route("/nivpol/validate/{*names}", post(nivpol_validate))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

type Body = Result<Bytes, BytesRejection>;

async fn ivpol_mutate(s: State<AppState>, p: Path<String>, q: RawQuery, b: Body) -> Response {
    admit(s, Call::new(Stage::Mutate, false), p, q, b).await
}
async fn ivpol_validate(s: State<AppState>, p: Path<String>, q: RawQuery, b: Body) -> Response {
    admit(s, Call::new(Stage::Validate, false), p, q, b).await
}
async fn nivpol_mutate(s: State<AppState>, p: Path<String>, q: RawQuery, b: Body) -> Response {
    admit(s, Call::new(Stage::Mutate, true), p, q, b).await
}
async fn nivpol_validate(s: State<AppState>, p: Path<String>, q: RawQuery, b: Body) -> Response {
    admit(s, Call::new(Stage::Validate, true), p, q, b).await
}

/// Which route a request came in on.
#[derive(Clone, Copy, Debug)]
struct Call {
    stage: Stage,
    route: Route,
    /// Metrics and log label: `ivpol_mutate`, `nivpol_validate`, …
    label: &'static str,
}

impl Call {
    fn new(stage: Stage, namespaced: bool) -> Self {
        let label = match (namespaced, stage) {
            (false, Stage::Mutate) => "ivpol_mutate",
            (false, Stage::Validate) => "ivpol_validate",
            (true, Stage::Mutate) => "nivpol_mutate",
            (true, Stage::Validate) => "nivpol_validate",
        };
        Self {
            stage,
            route: Route { namespaced },
            label,
        }
    }
}

/// A finished request: the metrics outcome label and the HTTP response.
type Answer = (&'static str, Response);

async fn admit(
    State(state): State<AppState>,
    call: Call,
    Path(names): Path<String>,
    RawQuery(query): RawQuery,
    body: Body,
) -> Response {
    // The budget starts once the body is read (axum extracts it before the handler runs).
    let start = Instant::now();
    let _guard = state.metrics.in_flight();
    let (outcome, response) = match parse(body) {
        Ok(req) => answer(&state, call, &names, query.as_deref(), &req, start).await,
        Err(rejected) => rejected.into_answer(call),
    };
    state
        .metrics
        .observe_admission(call.label, outcome, start.elapsed());
    response
}

/// A body that is not a usable AdmissionReview.
enum Rejected {
    /// Unreadable or over the body limit (413).
    Body(BytesRejection),
    /// Not an `admission.k8s.io/v1` AdmissionReview (400 with the parse error).
    Review(AdmissionError),
}

impl Rejected {
    fn into_answer(self, call: Call) -> Answer {
        let response = match self {
            Self::Body(rejection) => {
                tracing::warn!(route = call.label, error = %rejection.body_text(), "rejected request body");
                rejection.into_response()
            }
            Self::Review(e) => {
                tracing::warn!(route = call.label, error = %e, "malformed AdmissionReview");
                (StatusCode::BAD_REQUEST, e.to_string()).into_response()
            }
        };
        ("bad_request", response)
    }
}

fn parse(body: Body) -> Result<AdmissionRequest, Rejected> {
    let bytes = body.map_err(Rejected::Body)?;
    let review = AdmissionReview::parse(&bytes).map_err(Rejected::Review)?;
    Ok(review.request)
}

/// Selects the path's policies, runs the engine within the budget and builds the review.
async fn answer(
    state: &AppState,
    call: Call,
    names: &str,
    query: Option<&str>,
    req: &AdmissionRequest,
    start: Instant,
) -> Answer {
    let snapshot = state.policies.snapshot();
    if !snapshot.is_ready() {
        let msg = "ivory has no policy set loaded yet";
        return (
            "not_ready",
            (StatusCode::SERVICE_UNAVAILABLE, msg).into_response(),
        );
    }
    let names: Vec<String> = names
        .split('/')
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    let selected = match select_policies(snapshot.policies(), call.route, &names, req.namespace()) {
        Ok(selected) => selected,
        Err(unknown) => {
            tracing::warn!(route = call.label, uid = %req.uid, error = %unknown, "unknown policy names");
            return (
                "unknown_policy",
                review_json(&unknown_response(req, &unknown)),
            );
        }
    };
    let budget = Budget::new(start, timeout_from_query(query), policy_timeout(&selected));
    let ns_object = req.namespace().and_then(|ns| match &state.namespaces {
        Some(source) => source.namespace(ns),
        None => Some(namespace_object(ns)),
    });
    let decision = run_engine(
        state,
        call.stage,
        &selected,
        req,
        ns_object.as_ref(),
        budget,
    )
    .await;
    if Instant::now() >= budget.deadline || budget_exhausted(&decision) {
        state.metrics.deadline_expired(call.label);
    }
    let resp = response_from_decision(req, &decision);
    let outcome = if !resp.allowed {
        "denied"
    } else if resp.patch.is_some() {
        "patched"
    } else {
        "allowed"
    };
    log_admission(call, req, outcome, &decision, start, budget);
    (outcome, review_json(&resp))
}

fn log_admission(
    call: Call,
    req: &AdmissionRequest,
    outcome: &str,
    decision: &Decision,
    start: Instant,
    budget: Budget,
) {
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    tracing::info!(
        route = call.label,
        uid = %req.uid,
        kind = %req.kind.kind,
        namespace = %req.namespace,
        name = %req.name,
        operation = req.operation.as_str(),
        dry_run = req.dry_run.unwrap_or(false),
        outcome,
        elapsed_ms = millis(start.elapsed()),
        budget_ms = millis(budget.budget),
        warnings = decision.warnings.len(),
        denial = decision.message.as_deref().unwrap_or(""),
        "admission"
    );
}

/// Runs the engine under a backstop: the engine promises to return by the deadline, and if it
/// ever does not, the request is still answered (by the policies' failure policy) before the
/// API server gives up.
async fn run_engine(
    state: &AppState,
    stage: Stage,
    selected: &[&CompiledPolicy],
    req: &AdmissionRequest,
    ns_object: Option<&Value>,
    budget: Budget,
) -> Decision {
    let verifier = state.verifier.as_ref();
    let engine = async {
        match stage {
            Stage::Mutate => {
                mutate::mutate(verifier, selected, req, ns_object, budget.deadline).await
            }
            Stage::Validate => {
                validate::validate(verifier, selected, req, ns_object, budget.deadline).await
            }
        }
    };
    let backstop = budget.deadline + (budget.timeout - budget.budget) / 2;
    match tokio::time::timeout_at(backstop, engine).await {
        Ok(decision) => decision,
        Err(_) => backstop_decision(selected, budget.budget),
    }
}

fn backstop_decision(selected: &[&CompiledPolicy], budget: Duration) -> Decision {
    let mut names: Vec<&str> = selected.iter().map(|p| p.name.as_str()).collect();
    names.dedup();
    let message = format!(
        "ivory: time budget of {}ms exhausted before policies {} finished",
        budget.as_millis(),
        names.join(", ")
    );
    if selected
        .iter()
        .any(|p| p.failure_policy == FailurePolicy::Fail)
    {
        Decision {
            allowed: false,
            message: Some(message),
            budget_exhausted: true,
            ..Decision::default()
        }
    } else {
        let mut d = Decision {
            allowed: true,
            warnings: vec![message.clone()],
            budget_exhausted: true,
            ..Decision::default()
        };
        d.audit_annotations
            .insert(validate::SKIPPED_ANNOTATION.to_owned(), message);
        d
    }
}

/// True when the engine applied a failure policy because the budget ran out. A registry lookup
/// shared between concurrent requests can end before this request's own deadline, so the clock
/// alone is not enough: the engine classifies its errors by type and says so in the decision.
fn budget_exhausted(d: &Decision) -> bool {
    d.budget_exhausted
}

/// The tightest `webhookConfiguration.timeoutSeconds` of the selected policies.
fn policy_timeout(selected: &[&CompiledPolicy]) -> Option<Duration> {
    selected
        .iter()
        .filter_map(|p| p.spec.timeout_seconds())
        .filter_map(|s| u64::try_from(s).ok())
        .min()
        .map(Duration::from_secs)
}

/// Without a Namespace informer, `namespaceObject` is synthesized from the request's namespace
/// with the one label the API server guarantees on every Namespace
/// (`kubernetes.io/metadata.name`). Selectors on other namespace labels therefore do not match.
pub fn namespace_object(namespace: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace,
            "labels": {"kubernetes.io/metadata.name": namespace},
        },
    })
}

/// Names that match no loaded policy mean the webhook configuration and the loaded set
/// disagree. ivory fails closed and says so, instead of silently admitting unverified images.
fn unknown_response(req: &AdmissionRequest, unknown: &UnknownPolicies) -> AdmissionResponse {
    AdmissionResponse {
        uid: req.uid.clone(),
        allowed: false,
        status: Some(ResponseStatus {
            status: "Failure".to_owned(),
            message: format!(
                "ivory: {unknown} (the webhook configuration names policies that are not loaded)"
            ),
            code: Some(404),
            reason: Some("NotFound".to_owned()),
        }),
        ..AdmissionResponse::default()
    }
}

fn review_json(resp: &AdmissionResponse) -> Response {
    Json(review_response(resp)).into_response()
}

async fn readyz(State(state): State<AppState>) -> Response {
    let snapshot = state.policies.snapshot();
    let mut text = if snapshot.is_ready() {
        format!("ready: {} policies loaded\n", snapshot.policies().len())
    } else {
        "not ready: no policy set loaded\n".to_owned()
    };
    if !snapshot.errors.is_empty() {
        text.push_str("policy errors (the last good set stays active):\n");
        for e in &snapshot.errors {
            text.push_str(&format!("  {e}\n"));
        }
    }
    let status = if snapshot.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, text).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

#[cfg(test)]
mod tests;
