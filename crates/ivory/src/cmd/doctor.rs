//! `ivory doctor`: checks each layer between a policy and its enforcement, through the
//! Kubernetes API (KUBECONFIG or in-cluster). A policy that exists is not a webhook that is
//! registered, and a registered webhook is not one that answers: each gets its own row.
//!
//! Layers: `api` (reachable), `crds` (installed, v1 served, Established), `policy` (each
//! compiles), `registration` (a validating, and for digest pinning a mutating, webhook calls
//! ivory for each policy), `endpoint` (each ivory endpoint of those webhooks answers `/readyz`),
//! `reads` (ivory's service account may get, list and watch what each policy reads through
//! `resource.Get`/`List` and `globalContext.Get`: a SubjectAccessReview per verb).

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use ivory_policy::types::{FailurePolicy, PolicyKind};
use ivory_policy::{CompiledPolicy, ResourceRead};
use ivory_server::READYZ_POLICY_ERRORS;
use ivory_server::kube_source::{POLICY_VERSION, compile_policy_object, policy_resources};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status as ApiStatus;
use kube::api::{Api, DynamicObject, ListParams, PostParams};

/// CRDs ivory reads.
const CRDS: [&str; 2] = [
    "imagevalidatingpolicies.policies.kyverno.io",
    "namespacedimagevalidatingpolicies.policies.kyverno.io",
];
/// How long one endpoint probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(clap::Args)]
pub(crate) struct Args {
    /// ivory's service account, as NAMESPACE/NAME: whose permission to watch what the policies
    /// read (resource.Get/List, globalContext.Get) is checked.
    #[arg(
        long,
        value_name = "NAMESPACE/NAME",
        default_value = "ivory-system/ivory"
    )]
    service_account: String,
}

/// Result of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
        }
    }
}

/// One row of the report.
#[derive(Clone, Debug)]
pub(crate) struct Check {
    pub layer: &'static str,
    pub subject: String,
    pub status: Status,
    pub detail: String,
}

fn check(
    layer: &'static str,
    subject: impl Into<String>,
    status: Status,
    detail: impl Into<String>,
) -> Check {
    Check {
        layer,
        subject: subject.into(),
        status,
        detail: detail.into(),
    }
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Some((namespace, name)) = args.service_account.split_once('/') else {
        anyhow::bail!(
            "--service-account {:?}: expected NAMESPACE/NAME",
            args.service_account
        );
    };
    let user = format!("system:serviceaccount:{namespace}:{name}");
    let checks = collect(&user).await;
    print!("{}", render(&checks));
    let failed = checks.iter().any(|c| c.status == Status::Fail);
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

async fn collect(service_account: &str) -> Vec<Check> {
    let mut checks = Vec::new();
    let client = match connect().await {
        Ok((client, version)) => {
            checks.push(check("api", "kube-apiserver", Status::Ok, version));
            client
        }
        Err(e) => {
            checks.push(check(
                "api",
                "kube-apiserver",
                Status::Fail,
                format!("{e:#}"),
            ));
            return checks;
        }
    };
    checks.extend(crd_checks(&client).await);
    let (policies, policy_checks) = policy_checks(&client).await;
    checks.extend(policy_checks);
    checks.extend(read_checks(&client, service_account, &policies).await);
    match webhooks(&client).await {
        Ok(hooks) => {
            checks.extend(registration_checks(&policies, &hooks));
            checks.extend(endpoint_checks(&client, &hooks).await);
        }
        Err(e) => checks.push(check(
            "registration",
            "webhook configurations",
            Status::Fail,
            format!("{e:#}"),
        )),
    }
    checks
}

async fn connect() -> anyhow::Result<(kube::Client, String)> {
    let client = kube::Client::try_default()
        .await
        .context("connecting (KUBECONFIG or in-cluster config)")?;
    let version = client
        .apiserver_version()
        .await
        .context("reading /version")?;
    Ok((client, version.git_version))
}

async fn crd_checks(client: &kube::Client) -> Vec<Check> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut checks = Vec::new();
    for name in CRDS {
        let row = match api.get_opt(name).await {
            Ok(Some(crd)) => {
                let served = crd
                    .spec
                    .versions
                    .iter()
                    .any(|v| v.name == POLICY_VERSION && v.served);
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                match (served, established) {
                    (true, true) => check(
                        "crds",
                        name,
                        Status::Ok,
                        format!("{POLICY_VERSION} served, Established"),
                    ),
                    (false, _) => check(
                        "crds",
                        name,
                        Status::Fail,
                        format!("version {POLICY_VERSION} is not served"),
                    ),
                    (true, false) => check("crds", name, Status::Fail, "not Established"),
                }
            }
            Ok(None) => check(
                "crds",
                name,
                Status::Fail,
                "not installed (kubectl apply -k deploy/crds)",
            ),
            Err(e) => check("crds", name, Status::Fail, e.to_string()),
        };
        checks.push(row);
    }
    checks
}

async fn policy_checks(client: &kube::Client) -> (Vec<CompiledPolicy>, Vec<Check>) {
    let mut policies = Vec::new();
    let mut checks = Vec::new();
    for resource in policy_resources() {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(e) => {
                checks.push(check(
                    "policy",
                    resource.kind.clone(),
                    Status::Fail,
                    format!("listing: {e}"),
                ));
                continue;
            }
        };
        for object in list.items {
            let subject = policy_subject(&resource.kind, &object);
            match compile_policy_object(&object) {
                Ok(policy) => {
                    checks.push(check("policy", subject, Status::Ok, "compiles"));
                    policies.push(policy);
                }
                Err(errors) => {
                    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
                    checks.push(check("policy", subject, Status::Fail, errors.join("; ")))
                }
            }
        }
    }
    if checks.is_empty() {
        checks.push(check(
            "policy",
            "(none)",
            Status::Warn,
            "no ImageValidatingPolicy or NamespacedImageValidatingPolicy exists",
        ));
    }
    (policies, checks)
}

/// Verbs ivory's watches need.
const WATCH_VERBS: [&str; 3] = ["get", "list", "watch"];

/// What each policy reads from the cluster (its `resource.*` calls, and GlobalContextEntries,
/// which ivory reads as `kyverno.io` `globalcontextentries`), by policy subject.
pub(crate) fn reads_needed(policies: &[CompiledPolicy]) -> Vec<(String, ResourceRead)> {
    let mut out = Vec::new();
    for p in policies {
        let subject = match &p.namespace {
            Some(ns) => format!("{:?}/{ns}/{}", p.kind, p.name),
            None => format!("{:?}/{}", p.kind, p.name),
        };
        for read in &p.cluster_reads.resources {
            out.push((subject.clone(), read.clone()));
        }
        if !p.cluster_reads.global_context.is_empty() {
            out.push((
                subject.clone(),
                ResourceRead {
                    group: "kyverno.io".into(),
                    version: "v2beta1".into(),
                    resource: "globalcontextentries".into(),
                    namespace: None,
                },
            ));
        }
    }
    out
}

/// One row per (policy, resource read): ok when every watch verb is allowed, else which are
/// not (the policy's reads fail, and its failurePolicy decides every request it judges).
pub(crate) fn read_check(
    subject: &str,
    read: &ResourceRead,
    service_account: &str,
    answers: &[(&str, Result<bool, kube::Error>)],
) -> Check {
    let denied: Vec<&str> = answers
        .iter()
        .filter(|(_, a)| matches!(a, Ok(false)))
        .map(|(verb, _)| *verb)
        .collect();
    if let Some((verb, Err(e))) = answers.iter().find(|(_, a)| a.is_err()) {
        return check(
            "reads",
            subject,
            Status::Warn,
            format!("reads {read}; could not ask whether {service_account} may {verb} it: {e}"),
        );
    }
    if denied.is_empty() {
        check(
            "reads",
            subject,
            Status::Ok,
            format!("reads {read}; {service_account} may get, list and watch it"),
        )
    } else {
        check(
            "reads",
            subject,
            Status::Fail,
            format!(
                "reads {read}, but {service_account} may not {} it: every read fails and the \
                 failurePolicy decides (Helm value clusterReads, or the ClusterRole \
                 ivory-cluster-reads)",
                denied.join(", ")
            ),
        )
    }
}

async fn read_checks(
    client: &kube::Client,
    service_account: &str,
    policies: &[CompiledPolicy],
) -> Vec<Check> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let mut checks = Vec::new();
    for (subject, read) in reads_needed(policies) {
        let mut answers = Vec::new();
        for verb in WATCH_VERBS {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(service_account.to_owned()),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(read.group.clone()),
                        version: Some(read.version.clone()),
                        resource: Some(read.resource.clone()),
                        namespace: read.namespace.clone(),
                        verb: Some(verb.to_owned()),
                        ..ResourceAttributes::default()
                    }),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            let answer = api
                .create(&PostParams::default(), &review)
                .await
                .map(|r| r.status.is_some_and(|s| s.allowed));
            answers.push((verb, answer));
        }
        checks.push(read_check(&subject, &read, service_account, &answers));
    }
    checks
}

fn policy_subject(kind: &str, object: &DynamicObject) -> String {
    let name = object.metadata.name.as_deref().unwrap_or("");
    match object.metadata.namespace.as_deref() {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// One registered webhook that calls an ivory route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hook {
    pub config: String,
    pub name: String,
    /// `mutate` or `validate`.
    pub stage: String,
    /// `ivpol` or `nivpol`.
    pub prefix: String,
    /// Policy names in the path.
    pub policies: Vec<String>,
    pub failure_policy: String,
    pub endpoint: Endpoint,
}

/// Where a webhook sends its calls.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Endpoint {
    /// `https://host:port` with the caBundle (PEM) to trust.
    Url { base: String, ca: Vec<u8> },
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
}

impl Endpoint {
    fn describe(&self) -> String {
        match self {
            Self::Url { base, .. } => base.clone(),
            Self::Service {
                namespace,
                name,
                port,
            } => format!("service {namespace}/{name}:{port}"),
        }
    }
}

async fn webhooks(client: &kube::Client) -> anyhow::Result<Vec<Hook>> {
    let mut hooks = Vec::new();
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    for config in mutating.list(&ListParams::default()).await?.items {
        let config_name = config.metadata.name.clone().unwrap_or_default();
        for w in config.webhooks.unwrap_or_default() {
            hooks.extend(hook(
                &config_name,
                &w.name,
                &w.client_config,
                w.failure_policy.as_deref(),
            ));
        }
    }
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    for config in validating.list(&ListParams::default()).await?.items {
        let config_name = config.metadata.name.clone().unwrap_or_default();
        for w in config.webhooks.unwrap_or_default() {
            hooks.extend(hook(
                &config_name,
                &w.name,
                &w.client_config,
                w.failure_policy.as_deref(),
            ));
        }
    }
    Ok(hooks)
}

/// The ivory route of a webhook's client config, if it calls one.
pub(crate) fn hook(
    config: &str,
    name: &str,
    client: &WebhookClientConfig,
    failure: Option<&str>,
) -> Option<Hook> {
    let ca = client
        .ca_bundle
        .as_ref()
        .map(|b| b.0.clone())
        .unwrap_or_default();
    let (path, endpoint) = match (&client.url, &client.service) {
        (Some(url), _) => {
            let rest = url.strip_prefix("https://")?;
            let slash = rest.find('/')?;
            let base = format!("https://{}", &rest[..slash]);
            (rest[slash..].to_owned(), Endpoint::Url { base, ca })
        }
        (None, Some(svc)) => (
            svc.path.clone().unwrap_or_default(),
            Endpoint::Service {
                namespace: svc.namespace.clone(),
                name: svc.name.clone(),
                port: svc.port.unwrap_or(443),
            },
        ),
        (None, None) => return None,
    };
    let path = path.split('?').next().unwrap_or("");
    let mut segments = path.split('/').filter(|s| !s.is_empty());
    let prefix = segments
        .next()
        .filter(|p| *p == "ivpol" || *p == "nivpol")?;
    let stage = segments
        .next()
        .filter(|s| *s == "mutate" || *s == "validate")?;
    Some(Hook {
        config: config.to_owned(),
        name: name.to_owned(),
        stage: stage.to_owned(),
        prefix: prefix.to_owned(),
        policies: segments.map(str::to_owned).collect(),
        // The API server's default.
        failure_policy: failure.unwrap_or("Fail").to_owned(),
        endpoint,
    })
}

/// For every policy: a validating webhook naming it, a mutating one when it pins digests
/// (`mutateDigest`, and not `ivory.dev/digest-pinning: no-patch`), and
/// a failurePolicy on the webhook that matches the policy's.
pub(crate) fn registration_checks(policies: &[CompiledPolicy], hooks: &[Hook]) -> Vec<Check> {
    let mut checks = Vec::new();
    for policy in policies.iter().filter(|p| p.admission_enabled()) {
        let prefix = match policy.kind {
            PolicyKind::ImageValidatingPolicy => "ivpol",
            PolicyKind::NamespacedImageValidatingPolicy => "nivpol",
        };
        let subject = match &policy.namespace {
            Some(ns) if prefix == "nivpol" => format!("{ns}/{}", policy.name),
            _ => policy.name.clone(),
        };
        let mut stages = vec!["validate"];
        if policy.pins_digests() {
            stages.push("mutate");
        }
        for stage in stages {
            let found = hooks.iter().find(|h| {
                h.prefix == prefix && h.stage == stage && h.policies.contains(&policy.name)
            });
            let row = match found {
                None => check(
                    "registration",
                    format!("{subject} ({stage})"),
                    Status::Fail,
                    format!(
                        "no {stage} webhook calls ivory for this policy: it exists but is not enforced (register `ivory webhooks`)"
                    ),
                ),
                Some(h) if h.failure_policy != failure_text(policy.failure_policy) => check(
                    "registration",
                    format!("{subject} ({stage})"),
                    Status::Warn,
                    format!(
                        "webhook {} has failurePolicy {}, the policy says {}",
                        h.name,
                        h.failure_policy,
                        failure_text(policy.failure_policy)
                    ),
                ),
                Some(h) => check(
                    "registration",
                    format!("{subject} ({stage})"),
                    Status::Ok,
                    format!(
                        "webhook {} in {} (failurePolicy {})",
                        h.name, h.config, h.failure_policy
                    ),
                ),
            };
            checks.push(row);
        }
    }
    checks
}

fn failure_text(policy: FailurePolicy) -> &'static str {
    match policy {
        FailurePolicy::Fail => "Fail",
        FailurePolicy::Ignore => "Ignore",
    }
}

async fn endpoint_checks(client: &kube::Client, hooks: &[Hook]) -> Vec<Check> {
    let endpoints: BTreeSet<&Endpoint> = hooks.iter().map(|h| &h.endpoint).collect();
    let mut checks = Vec::new();
    for endpoint in endpoints {
        let subject = endpoint.describe();
        let probed = tokio::time::timeout(PROBE_TIMEOUT, probe(client, endpoint)).await;
        let row = match probed {
            Ok(Ok(ready)) => {
                // Policy errors keep the last good version serving, so they warn, not fail.
                let status = if ready.policy_errors > 0 {
                    Status::Warn
                } else {
                    Status::Ok
                };
                let lines: Vec<&str> = ready.text.lines().map(str::trim).collect();
                check(
                    "endpoint",
                    subject,
                    status,
                    format!("/readyz: {}", lines.join(" | ")),
                )
            }
            Ok(Err(e)) => check("endpoint", subject, Status::Fail, format!("{e:#}")),
            Err(_) => check(
                "endpoint",
                subject,
                Status::Fail,
                format!(
                    "no answer within {}s (the API server will time out too)",
                    PROBE_TIMEOUT.as_secs()
                ),
            ),
        };
        checks.push(row);
    }
    checks
}

/// A ready endpoint's `/readyz` answer.
struct Ready {
    /// The text, for people.
    text: String,
    /// How many policy files or objects failed to load (the server's
    /// [`READYZ_POLICY_ERRORS`] header).
    policy_errors: usize,
}

/// GET `/readyz`: directly for URL webhooks (trusting only their caBundle), through the API
/// server's service proxy for Service webhooks.
async fn probe(client: &kube::Client, endpoint: &Endpoint) -> anyhow::Result<Ready> {
    match endpoint {
        Endpoint::Url { base, ca } => {
            let mut builder = reqwest::Client::builder().timeout(PROBE_TIMEOUT);
            if !ca.is_empty() {
                let cert =
                    reqwest::Certificate::from_pem(ca).context("reading the webhook's caBundle")?;
                builder = builder.tls_certs_only([cert]);
            }
            let response = builder
                .build()?
                .get(format!("{base}/readyz"))
                .send()
                .await?;
            let status = response.status();
            let policy_errors = policy_errors(response.headers());
            let text = response.text().await?;
            anyhow::ensure!(
                status.is_success(),
                "/readyz answered {status}: {}",
                text.trim()
            );
            Ok(Ready {
                text,
                policy_errors,
            })
        }
        Endpoint::Service {
            namespace,
            name,
            port,
        } => {
            let path =
                format!("/api/v1/namespaces/{namespace}/services/https:{name}:{port}/proxy/readyz");
            let request = http::Request::get(path).body(kube::client::Body::empty())?;
            let response = client.send(request).await?;
            let status = response.status();
            let policy_errors = policy_errors(response.headers());
            let body = response.into_body().collect_bytes().await?;
            let text = String::from_utf8_lossy(&body).into_owned();
            if !status.is_success() {
                // The API server's own refusals (no endpoints, forbidden) are Status objects.
                let status_message = serde_json::from_str::<ApiStatus>(&text)
                    .ok()
                    .and_then(|s| s.message)
                    .filter(|m| !m.is_empty());
                match status_message {
                    Some(message) => anyhow::bail!("{message} ({status})"),
                    None => anyhow::bail!("/readyz answered {status}: {}", text.trim()),
                }
            }
            Ok(Ready {
                text,
                policy_errors,
            })
        }
    }
}

/// The server's count of policy load errors; absent or unreadable counts as none.
fn policy_errors(headers: &http::HeaderMap) -> usize {
    headers
        .get(READYZ_POLICY_ERRORS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The report as an aligned table.
pub(crate) fn render(checks: &[Check]) -> String {
    let header = ["LAYER", "SUBJECT", "STATUS", "DETAIL"];
    let rows: Vec<[String; 4]> = checks
        .iter()
        .map(|c| {
            [
                c.layer.to_owned(),
                c.subject.clone(),
                c.status.as_str().to_owned(),
                c.detail.clone(),
            ]
        })
        .collect();
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].len())
            .chain([header[i].len()])
            .max()
            .unwrap_or(0)
    };
    let (w0, w1, w2) = (width(0), width(1), width(2));
    let mut out = format!(
        "{:w0$}  {:w1$}  {:w2$}  {}\n",
        header[0], header[1], header[2], header[3]
    );
    for r in &rows {
        out.push_str(&format!(
            "{:w0$}  {:w1$}  {:w2$}  {}\n",
            r[0], r[1], r[2], r[3]
        ));
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    out.push_str(&match failed {
        0 => "all layers ok\n".to_owned(),
        n => format!("{n} check(s) failed\n"),
    });
    out
}

#[cfg(test)]
mod tests;
