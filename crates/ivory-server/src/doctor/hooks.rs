//! The `registration` layer: which registered webhooks call an ivory route ([`Hook`]), and
//! whether each policy has the webhooks it needs.

use ivory_policy::CompiledPolicy;
use ivory_policy::types::{FailurePolicy, PolicyKind};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::api::{Api, ListParams};

use super::check::{Check, Finding};

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

/// Every webhook, mutating and validating, that calls an ivory route.
pub(super) async fn webhooks(client: &kube::Client) -> Result<Vec<Hook>, kube::Error> {
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    // (configuration, webhook, clientConfig, failurePolicy) of both kinds, read alike.
    let mut rows = Vec::new();
    for config in mutating.list(&ListParams::default()).await?.items {
        let config_name = config.metadata.name.unwrap_or_default();
        for w in config.webhooks.unwrap_or_default() {
            rows.push((
                config_name.clone(),
                w.name,
                w.client_config,
                w.failure_policy,
            ));
        }
    }
    for config in validating.list(&ListParams::default()).await?.items {
        let config_name = config.metadata.name.unwrap_or_default();
        for w in config.webhooks.unwrap_or_default() {
            rows.push((
                config_name.clone(),
                w.name,
                w.client_config,
                w.failure_policy,
            ));
        }
    }
    let hooks = rows
        .iter()
        .filter_map(|(config, name, client_config, failure_policy)| {
            hook(config, name, client_config, failure_policy.as_deref())
        })
        .collect();
    Ok(hooks)
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
    })
}

/// For every policy: a validating webhook naming it, a mutating one when it pins digests
/// (`mutateDigest`, and not `ivory.dev/digest-pinning: no-patch`), and
/// a failurePolicy on the webhook that matches the policy's.
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
            let found = hooks.iter().find(|h| {
                h.prefix == prefix && h.stage == stage && h.policies.contains(&policy.name)
            });
            let policy_says = failure_text(policy.failure_policy);
            let finding = match found {
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
                },
            };
            checks.push(Check::new(format!("{subject} ({stage})"), finding));
        }
    }
    checks
}

/// A failurePolicy as the webhook configuration spells it.
fn failure_text(policy: FailurePolicy) -> &'static str {
    match policy {
        FailurePolicy::Fail => "Fail",
        FailurePolicy::Ignore => "Ignore",
    }
}
