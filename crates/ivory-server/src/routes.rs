//! The HTTP surface: the four admission routes plus `/healthz`, `/readyz` and `/metrics`.
//!
//! Every admission answer is an `admission.k8s.io/v1` AdmissionReview with the request's uid,
//! except for requests ivory cannot judge: bodies that are not one (400 with the parse error;
//! 413 past the body limit, 503 while the bodies in flight hold the whole body budget, 408 for
//! a body slower than the body timeout: see [`crate::limits`]), paths that name no policy and objects that cannot hold what the
//! selected policies read (400 naming the field), so the API server applies the webhook's
//! failurePolicy. A panic while handling a request never drops the connection: it is answered
//! by the selected policies' failurePolicy (500 before any is selected) and counted.

use ivory_engine::resources::{NoResources, ResourceSource};
use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::future::FutureExt as _;
use ivory_engine::admission::shape::ShapeError;
use ivory_engine::admission::{
    AdmissionError, AdmissionRequest, AdmissionResponse, AdmissionReview, ResponseStatus,
    ReviewResponse, response_from_decision,
};
use ivory_engine::decision::{Decision, PolicyResult, Status};
use ivory_engine::exceptions::{EXCEPTIONS_PROPERTY, Exceptions};
use ivory_engine::matching::{Route, UnknownPolicies, select_policies};
use ivory_engine::pipeline::{Backstop, Judged, Namespaces, Pipeline, Stage};
use ivory_engine::validate::DecisionMemo;
use ivory_engine::verifier::ImageVerifier;
use ivory_policy::CompiledPolicy;
use ivory_policy::types::PolicyKind;
use tokio::time::Instant;

use crate::budget::{Budget, timeout_from_query};
use crate::limits::{BodyBudget, BodyError, HttpLimits, ReadBody, read_body};
use crate::metrics::Metrics;
use crate::policies::PolicyStore;
use crate::policy_results::{self, ReportSink, RequestFields};
use crate::sources::{CredentialSource, NamespaceSource};

/// Shared state of every handler; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Digests and signatures for the engine (the caching cosign verifier in production).
    pub verifier: Arc<dyn ImageVerifier>,
    /// The current compiled policy set, swapped whole on reload.
    pub policies: Arc<PolicyStore>,
    /// Counters and histograms served on `/metrics`.
    pub metrics: Arc<Metrics>,
    /// `None`: synthesize namespace objects from the request's namespace name.
    pub namespaces: Option<Arc<dyn NamespaceSource>>,
    /// `None`: policies' `credentials.secrets` are not read (the resolver decides alone).
    pub credentials: Option<Arc<dyn CredentialSource>>,
    /// Bounds on request bodies (size, time) and connections.
    pub limits: HttpLimits,
    /// The request-body bytes in flight, shared by every request (`limits.body_budget`).
    pub body_budget: BodyBudget,
    /// `--enable-policy-exceptions`: `None` leaves every PolicyException inert (Kyverno's
    /// default); `Some` holds Kyverno's `--exceptionNamespace` (`None` inside: any namespace).
    pub exceptions: Option<ExceptionSettings>,
    /// Where PolicyReport updates go (`--kube`); `None`: results are only logged and counted.
    pub reports: Option<Arc<dyn ReportSink>>,
    /// Cluster objects for the policies' `resource.*` / `globalContext.*` calls: watch caches
    /// (`--kube`), `--cluster-resources` files, or nothing ([`NoResources`]: such reads fail).
    pub resources: Arc<dyn ResourceSource>,
    /// Kept results of policies that read only their images and verification answers,
    /// shared by the admission routes and the background scan.
    pub memo: Arc<DecisionMemo>,
}

/// Where PolicyExceptions may come from once they are enabled.
#[derive(Clone, Debug, Default)]
pub struct ExceptionSettings {
    /// Only exceptions in this namespace count (`None`: every namespace).
    pub namespace: Option<String>,
}

impl AppState {
    /// State with the default [`HttpLimits`].
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
            credentials: None,
            body_budget: BodyBudget::new(HttpLimits::default().body_budget),
            limits: HttpLimits::default(),
            exceptions: None,
            reports: None,
            resources: Arc::new(NoResources),
            memo: Arc::new(DecisionMemo::default()),
        }
    }
}

impl AppState {
    /// Sets the bounds, with a body budget of `limits.body_budget`.
    pub fn with_limits(mut self, limits: HttpLimits) -> Self {
        self.body_budget = BodyBudget::new(limits.body_budget);
        self.limits = limits;
        self
    }
}

/// The router with all routes (bodies are read by the handlers, under [`HttpLimits`]).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(admission_route)
        .with_state(state)
}

/// The admission routes, `POST /{ivpol,nivpol}/{mutate,validate}/<names>`, told apart here:
/// axum's wildcard routes built a parameter list and a matched path for every request, ~2.5 k
/// instructions of a warm admission (BENCHMARKS.md, issue 47), to hand over a prefix's rest.
/// Every other path is 404, another method 405 (`Allow: POST`), and names that are not UTF-8
/// once percent-decoded 400, as those routes answered
/// (`tests::paths_and_methods_are_answered_as_axums_routes_answered_them`).
async fn admission_route(
    state: State<AppState>,
    method: Method,
    uri: Uri,
    query: RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some((call, names)) = admission_call(uri.path()) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if method != Method::POST {
        return (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "POST")]).into_response();
    }
    let Ok(names) = percent_encoding::percent_decode_str(names).decode_utf8() else {
        let text = "Invalid URL: Invalid UTF-8 in `names`";
        return (StatusCode::BAD_REQUEST, text).into_response();
    };
    admit(state, call, &names, query, headers, body).await
}

/// The route `path` names and the rest of it after the route's prefix (not empty).
fn admission_call(path: &str) -> Option<(Call, &str)> {
    const ROUTES: [(&str, Stage, bool); 4] = [
        ("/ivpol/mutate/", Stage::Mutate, false),
        ("/ivpol/validate/", Stage::Validate, false),
        ("/nivpol/mutate/", Stage::Mutate, true),
        ("/nivpol/validate/", Stage::Validate, true),
    ];
    ROUTES.iter().find_map(|&(prefix, stage, namespaced)| {
        let names = path.strip_prefix(prefix).filter(|rest| !rest.is_empty())?;
        Some((Call::new(stage, namespaced), names))
    })
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
    names: &str,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let reading = ivory_clock::now();
    let body = match read_body(&headers, body, &state.limits, &state.body_budget).await {
        Ok(body) => body,
        Err(e) => return refuse_body(&state, call, e, reading),
    };
    // The budget starts once the body is read.
    let start = ivory_clock::now();
    let _guard = state.metrics.in_flight();
    // Boxed: the handling future is large, and axum and hyper move the handler's future several
    // times before it first runs (BENCHMARKS.md, issue 27's third round).
    let handling = Box::pin(handle(&state, call, names, query.as_deref(), body, start));
    let handled = AssertUnwindSafe(handling).catch_unwind().await;
    let (outcome, response) = handled.unwrap_or_else(|panic| {
        state.metrics.panicked(call.label);
        tracing::error!(route = call.label, panic = %panic_text(panic.as_ref()), "admission handling panicked before a policy was selected");
        let msg = "ivory: internal error handling the AdmissionReview";
        (
            "internal_error",
            (StatusCode::INTERNAL_SERVER_ERROR, msg).into_response(),
        )
    });
    state
        .metrics
        .observe_admission(call.label, outcome, start.elapsed());
    response
}

/// The answer to a body refused by its bounds; the API server then applies the webhook's
/// failurePolicy.
fn refuse_body(state: &AppState, call: Call, e: BodyError, reading: Instant) -> Response {
    state.metrics.request_refused(e.label());
    // An oversized or unreadable body is a bad request as before; the new bounds have their own
    // outcome labels.
    let outcome = match e {
        BodyError::TooLarge { .. } | BodyError::Unreadable => "bad_request",
        BodyError::BudgetExhausted { .. } | BodyError::TimedOut(_) => e.label(),
    };
    state
        .metrics
        .observe_admission(call.label, outcome, reading.elapsed());
    tracing::warn!(route = call.label, error = %e, "request body refused");
    e.into_response()
}

async fn handle(
    state: &AppState,
    call: Call,
    names: &str,
    query: Option<&str>,
    body: ReadBody,
    start: Instant,
) -> Answer {
    // The body's share of the budget is held until the answer is ready.
    match parse(&body) {
        Ok(req) => answer(state, call, names, query, req, start).await,
        Err(rejected) => rejected.into_answer(call),
    }
}

/// The text of a panic payload (`panic!` with a literal or a formatted message).
fn panic_text(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-text panic payload")
}

/// A body that is not a usable AdmissionReview.
enum Rejected {
    /// Not an `admission.k8s.io/v1` AdmissionReview (400 with the parse error).
    Review(AdmissionError),
    /// The path names no policy (400): nothing says what to judge the request by.
    NoPolicies,
    /// The object cannot hold what the selected policies read (400 naming the field).
    Shape(ShapeError),
}

impl Rejected {
    fn into_answer(self, call: Call) -> Answer {
        let response = match self {
            Self::Review(e) => {
                tracing::warn!(route = call.label, error = %e, "malformed AdmissionReview");
                (StatusCode::BAD_REQUEST, e.to_string()).into_response()
            }
            Self::NoPolicies => {
                let msg = format!(
                    "ivory: the webhook path names no policy (expected /{}/<policy>[/<policy>…])",
                    call.label.replace('_', "/")
                );
                tracing::warn!(route = call.label, "{msg}");
                (StatusCode::BAD_REQUEST, msg).into_response()
            }
            Self::Shape(e) => {
                tracing::warn!(route = call.label, error = %e, "AdmissionReview object of the wrong shape");
                (StatusCode::BAD_REQUEST, format!("ivory: {e}")).into_response()
            }
        };
        ("bad_request", response)
    }
}

fn parse(body: &ReadBody) -> Result<AdmissionRequest, Rejected> {
    let review = AdmissionReview::parse(&body.bytes).map_err(Rejected::Review)?;
    Ok(review.request)
}

/// Selects the path's policies, has the engine's pipeline judge the request within the
/// budget, and encodes its decision as the review.
async fn answer(
    state: &AppState,
    call: Call,
    names: &str,
    query: Option<&str>,
    mut req: AdmissionRequest,
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
    if names.is_empty() {
        return Rejected::NoPolicies.into_answer(call);
    }
    let selected = match select_policies(snapshot.policies(), call.route, &names, req.namespace()) {
        Ok(selected) => selected,
        Err(unknown) => {
            tracing::warn!(route = call.label, uid = %req.uid, error = %unknown, "unknown policy names");
            let hint = other_kind_hint(snapshot.policies(), call.route, &unknown);
            return (
                "unknown_policy",
                review_json(&unknown_response(&req, &unknown, &hint)),
            );
        }
    };
    let budget = Budget::new(start, timeout_from_query(query), policy_timeout(&selected));
    let exceptions = state.exceptions.as_ref().map(|settings| Exceptions {
        exceptions: snapshot.exceptions.clone(),
        namespace: settings.namespace.clone(),
    });
    let judged = pipeline(state, exceptions.as_ref(), budget)
        .judge(call.stage, &selected, &mut req, budget.deadline)
        .await;
    let Judged { decision, panic } = match judged {
        Ok(judged) => judged,
        Err(e) => return Rejected::Shape(e).into_answer(call),
    };
    if let Some(panic) = panic {
        state.metrics.panicked(call.label);
        tracing::error!(route = call.label, uid = %req.uid, %panic, "policy evaluation panicked");
    }
    let fields = RequestFields::new(&req);
    match call.stage {
        Stage::Validate => policy_results::after_validation(
            &state.metrics,
            state.reports.as_ref(),
            &fields,
            &decision.results,
        ),
        Stage::Mutate => policy_results::log_results_of(
            &fields,
            &decision.results,
            policy_results::Cause::Admission,
        ),
    }
    if ivory_clock::now() >= budget.deadline || decision.budget_exhausted {
        state.metrics.deadline_expired(call.label);
    }
    let resp = response_from_decision(&req, &decision);
    let outcome = outcome(&decision, resp.patch.is_some());
    log_admission(call, &fields, outcome, &decision, start, budget);
    (outcome, review_json(&resp))
}

/// The `outcome` label of an answered admission: `failed_closed` when it was denied only
/// because policies could not be judged, `denied` when a policy failed on the image's merits,
/// `failed_open` when it was let through although a policy could not be judged (failurePolicy
/// Ignore, or an Audit/Warn action), `warned` when it was let through with warnings, else
/// `patched` or `allowed`.
fn outcome(decision: &Decision, patched: bool) -> &'static str {
    // A skip a PolicyException made is a judgement (the exemption), not a failure to judge.
    let unjudged = |r: &&PolicyResult| {
        r.status == Status::Error
            || (r.status == Status::Skip && !r.properties.contains_key(EXCEPTIONS_PROPERTY))
    };
    let failed = decision.results.iter().any(|r| r.status == Status::Fail);
    let unjudged = decision.results.iter().any(|r| unjudged(&r));
    match (decision.allowed, failed, unjudged) {
        (false, false, true) => "failed_closed",
        (false, _, _) => "denied",
        (true, _, true) => "failed_open",
        (true, _, false) if !decision.warnings.is_empty() => "warned",
        (true, _, false) if patched => "patched",
        (true, _, false) => "allowed",
    }
}

/// The engine's pipeline as the webhook runs it: Namespaces from the watch (labels unknown
/// without one), the policies' Secrets prepared, and a backstop halfway between ivory's
/// deadline and the API server's timeout, so the API server always gets ivory's answer (a
/// budget exhausted by `budget.deadline` comes from the engine; by the backstop, from the
/// pipeline).
fn pipeline<'a>(
    state: &'a AppState,
    exceptions: Option<&'a Exceptions>,
    budget: Budget,
) -> Pipeline<'a> {
    Pipeline {
        verifier: state.verifier.as_ref(),
        resources: state.resources.as_ref(),
        namespaces: match &state.namespaces {
            Some(source) => Namespaces::Source(source.as_ref()),
            None => Namespaces::Unknown,
        },
        credentials: state.credentials.as_deref(),
        exceptions,
        backstop: Some(Backstop {
            at: budget.deadline + (budget.timeout - budget.budget) / 2,
            budget: budget.budget,
        }),
        memo: Some(state.memo.as_ref()),
    }
}

fn log_admission(
    call: Call,
    fields: &RequestFields<'_>,
    outcome: &str,
    decision: &Decision,
    start: Instant,
    budget: Budget,
) {
    use ivory_plumbing::json_text::{push_key, push_member, push_u64};
    if !tracing::enabled!(tracing::Level::INFO) {
        return;
    }
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    // Written here and put in the line as they are (as the policy-result lines, see
    // `policy_results::log_results`): the same fields in the same order.
    let mut line = String::with_capacity(320);
    push_member(&mut line, true, "route", call.label);
    line.push_str(fields.members());
    let req = fields.request;
    push_key(&mut line, false, "dry_run");
    line.push_str(if req.dry_run.unwrap_or(false) {
        "true"
    } else {
        "false"
    });
    push_member(&mut line, false, "outcome", outcome);
    for (key, value) in [
        ("elapsed_ms", millis(start.elapsed())),
        ("budget_ms", millis(budget.budget)),
        ("warnings", decision.warnings.len() as u64),
    ] {
        push_key(&mut line, false, key);
        push_u64(&mut line, value);
    }
    let denial = decision.message.as_deref().unwrap_or("");
    push_member(&mut line, false, "denial", denial);
    // The message as a string field (see `policy_results::log_results`).
    match ivory_plumbing::json_text::members_log() {
        Some(log) => log.info(module_path!(), "admission", &line),
        None => tracing::info!(message = "admission", json_members = line.as_str()),
    }
}

/// The tightest `webhookConfiguration.timeoutSeconds` of the selected policies.
fn policy_timeout(selected: &[&CompiledPolicy]) -> Option<Duration> {
    selected
        .iter()
        .filter_map(|p| p.timeout_seconds())
        .filter_map(|s| u64::try_from(s).ok())
        .min()
        .map(Duration::from_secs)
}

/// Says which unknown names are policies of the other kind, and where that kind is served: a
/// cluster policy named on `/nivpol/...` (Kyverno ignores it and allows; see docs/SECURITY.md
/// for why ivory denies) or a namespaced one on `/ivpol/...`.
fn other_kind_hint(
    policies: &[Arc<CompiledPolicy>],
    route: Route,
    unknown: &UnknownPolicies,
) -> String {
    let (other, served) = if route.namespaced {
        (PolicyKind::ImageValidatingPolicy, "/ivpol/...")
    } else {
        (PolicyKind::NamespacedImageValidatingPolicy, "/nivpol/...")
    };
    let named: Vec<&str> = unknown
        .names
        .iter()
        .filter(|n| policies.iter().any(|p| p.kind == other && &p.name == *n))
        .map(String::as_str)
        .collect();
    if named.is_empty() {
        return String::new();
    }
    format!(
        "; loaded as {}: {}, which {served} serves",
        other.as_str(),
        named.join(", ")
    )
}

/// Names that match no loaded policy mean the webhook configuration and the loaded set
/// disagree. ivory fails closed and says so, instead of silently admitting unverified images.
fn unknown_response(
    req: &AdmissionRequest,
    unknown: &UnknownPolicies,
    hint: &str,
) -> AdmissionResponse {
    AdmissionResponse {
        uid: req.uid.clone(),
        allowed: false,
        status: Some(ResponseStatus {
            status: "Failure".to_owned(),
            message: format!(
                "ivory: {unknown} (the webhook configuration names policies that are not loaded{hint})"
            ),
            code: Some(404),
            reason: Some("NotFound".to_owned()),
        }),
        ..AdmissionResponse::default()
    }
}

fn review_json(resp: &AdmissionResponse) -> Response {
    let body = ReviewResponse::new(resp).to_json();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Response header of `/readyz`: how many policy files or objects failed to load (`0` when none),
/// the machine-readable form of the text's "policy errors" lines (`ivory doctor` warns on it).
/// The status cannot say it: the last good set keeps serving, so the server stays ready.
pub const READYZ_POLICY_ERRORS: &str = "ivory-policy-errors";

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
    if !snapshot.exception_errors.is_empty() {
        text.push_str("PolicyException errors (those exceptions exempt nothing):\n");
        for e in &snapshot.exception_errors {
            text.push_str(&format!("  {e}\n"));
        }
    }
    for root in state.metrics.trust_roots() {
        text.push_str(&root.describe());
        text.push('\n');
    }
    let status = if snapshot.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let errors = snapshot.errors.len().to_string();
    (status, [(READYZ_POLICY_ERRORS, errors)], text).into_response()
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
