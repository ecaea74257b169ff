//! The `registration` layer: which registered webhooks call an ivory route ([`Hook`]), and
//! whether each policy has the webhooks it needs.

use ivory_policy::CompiledPolicy;
use ivory_policy::types::{FailurePolicy, PolicyKind};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use super::check::{Check, Finding, Source};

/// One registered webhook that calls an ivory route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    /// The webhook configuration holding it.
    pub config: String,
    /// The webhook's name.
    pub name: String,
    /// `mutate` or `validate`.
    pub stage: String,
    /// `ivpol` or `nivpol`.
    pub prefix: String,
    /// Policy names in the path.
    pub policies: Vec<String>,
    /// Its failurePolicy (the API server's default, `Fail`, when unset).
    pub failure_policy: String,
    /// Where it sends its calls.
    pub endpoint: Endpoint,
    /// Where the API server got it from.
    pub source: Source,
    /// What it sends (rules, selectors, matchPolicy, matchConditions, timeout, reinvocation),
    /// with the API server's defaults filled in, as canonical JSON: two registrations of one
    /// policy disagree when these differ.
    pub scope: String,
}

/// Where a webhook sends its calls.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Endpoint {
    /// `https://host:port` with the caBundle (PEM) to trust.
    Url {
        /// `https://host:port`, without the path.
        base: String,
        /// The caBundle, PEM; empty when unset.
        ca: Vec<u8>,
    },
    /// A Service, reached through the API server's service proxy.
    Service {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
        /// Its port (443 when unset).
        port: i32,
    },
}

impl Endpoint {
    /// The endpoint as the report names it: the URL base, or `service NS/NAME:PORT`.
    pub fn describe(&self) -> String {
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

/// Every webhook of the API's configuration objects, mutating and validating, that calls an
/// ivory route.
pub(super) async fn webhooks(client: &kube::Client) -> Result<Vec<Hook>, kube::Error> {
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let params = ListParams::default();
    Ok(hooks_of(
        mutating.list(&params).await?.items,
        validating.list(&params).await?.items,
        Source::Api,
    ))
}

/// The webhooks of these configurations that call an ivory route, from `source`.
pub(super) fn hooks_of(
    mutating: Vec<MutatingWebhookConfiguration>,
    validating: Vec<ValidatingWebhookConfiguration>,
    source: Source,
) -> Vec<Hook> {
    // (configuration, webhook as JSON) of both kinds, read alike.
    let mut rows: Vec<(String, Value)> = Vec::new();
    for config in mutating {
        let name = config.metadata.name.unwrap_or_default();
        for w in config.webhooks.unwrap_or_default() {
            let mut value = serde_json::to_value(w).unwrap_or_default();
            default_field(&mut value, "reinvocationPolicy", json!("Never"));
            rows.push((name.clone(), value));
        }
    }
    for config in validating {
        let name = config.metadata.name.unwrap_or_default();
        for w in config.webhooks.unwrap_or_default() {
            rows.push((name.clone(), serde_json::to_value(w).unwrap_or_default()));
        }
    }
    rows.into_iter()
        .filter_map(|(config, webhook)| {
            let client: WebhookClientConfig =
                serde_json::from_value(webhook["clientConfig"].clone()).ok()?;
            let mut found = hook(
                &config,
                webhook["name"].as_str().unwrap_or(""),
                &client,
                webhook["failurePolicy"].as_str(),
            )?;
            found.source = source;
            found.scope = scope(webhook);
            Some(found)
        })
        .collect()
}

/// A webhook's scope (see [`Hook::scope`]): its fields but name, client and failurePolicy,
/// with the API server's defaults where unset.
fn scope(mut webhook: Value) -> String {
    if let Some(fields) = webhook.as_object_mut() {
        for field in ["name", "clientConfig", "failurePolicy"] {
            fields.remove(field);
        }
    }
    default_field(&mut webhook, "matchPolicy", json!("Equivalent"));
    default_field(&mut webhook, "namespaceSelector", json!({}));
    default_field(&mut webhook, "objectSelector", json!({}));
    default_field(&mut webhook, "timeoutSeconds", json!(10));
    if let Some(rules) = webhook["rules"].as_array_mut() {
        for rule in rules {
            default_field(rule, "scope", json!("*"));
        }
    }
    webhook.to_string()
}

fn default_field(object: &mut Value, field: &str, default: Value) {
    if let Some(fields) = object.as_object_mut() {
        fields.entry(field).or_insert(default);
    }
}

/// The ivory route of a webhook's client config, if it calls one.
pub fn hook(
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
        source: Source::Api,
        scope: String::new(),
    })
}

/// For every policy: a validating webhook naming it, a mutating one when it pins digests
/// (`mutateDigest`, and not `ivory.dev/digest-pinning: no-patch`), and
/// a failurePolicy on the webhook that matches the policy's. A static registration is named
/// first (the API cannot remove it); when a policy has both, a row says whether they differ.
pub fn registration_checks(policies: &[CompiledPolicy], hooks: &[Hook]) -> Vec<Check> {
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
            let from = |source: Source| {
                hooks.iter().find(|h| {
                    h.source == source
                        && h.prefix == prefix
                        && h.stage == stage
                        && h.policies.contains(&policy.name)
                })
            };
            let (fixed, api) = (from(Source::Static), from(Source::Api));
            let subject = format!("{subject} ({stage})");
            checks.push(Check::new(
                subject.clone(),
                registration(policy, stage, fixed.or(api), fixed.and(api)),
            ));
            if let (Some(fixed), Some(api)) = (fixed, api) {
                let differences = differences(fixed, api);
                if !differences.is_empty() {
                    let finding = Finding::SourcesDisagree {
                        static_webhook: fixed.name.clone(),
                        api_webhook: api.name.clone(),
                        differences,
                    };
                    checks.push(Check::new(subject, finding));
                }
            }
        }
    }
    checks
}

/// The finding for the webhook that registers a policy at a stage (`also_api`: an API webhook
/// besides the static one).
fn registration(
    policy: &CompiledPolicy,
    stage: &'static str,
    found: Option<&Hook>,
    also_api: Option<&Hook>,
) -> Finding {
    let policy_says = failure_text(policy.failure_policy);
    match found {
        None => Finding::Unregistered { stage },
        Some(h) if h.failure_policy != policy_says => Finding::FailurePolicyDiffers {
            webhook: h.name.clone(),
            webhook_says: h.failure_policy.clone(),
            policy_says,
        },
        Some(h) => Finding::Registered {
            webhook: h.name.clone(),
            config: h.config.clone(),
            failure_policy: h.failure_policy.clone(),
            source: h.source,
            also_api: also_api.map(|a| format!("{} in {}", a.name, a.config)),
        },
    }
}

/// What differs between a static and an API registration of one policy at one stage.
fn differences(fixed: &Hook, api: &Hook) -> Vec<&'static str> {
    let mut out = Vec::new();
    if fixed.failure_policy != api.failure_policy {
        out.push("failurePolicy");
    }
    if fixed.policies != api.policies {
        out.push("the policies in the path");
    }
    if fixed.scope != api.scope {
        out.push("rules, selectors, conditions or timeout");
    }
    out
}

/// A failurePolicy as the webhook configuration spells it.
fn failure_text(policy: FailurePolicy) -> &'static str {
    match policy {
        FailurePolicy::Fail => "Fail",
        FailurePolicy::Ignore => "Ignore",
    }
}
