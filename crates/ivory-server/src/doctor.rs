//! `ivory doctor`'s checks: each layer between a policy and its enforcement, through the
//! Kubernetes API (KUBECONFIG or in-cluster). A policy that exists is not a webhook that is
//! registered, and a registered webhook is not one that answers: each gets its own row.
//!
//! Layers ([`Layer`]): `api` (reachable), `crds` (installed, v1 served, Established), `policy`
//! (each compiles), `registration` (a validating, and for digest pinning a mutating, webhook
//! calls ivory for each policy; from the API's configuration objects or from the static
//! manifests the API server reads, reported apart, with whether the API server applies the
//! static ones and where the two disagree), `endpoint` (each ivory endpoint of those webhooks answers
//! `/readyz`), `reads` (ivory's service account may get, list and watch what each policy reads
//! through `resource.Get`/`List` and `globalContext.Get`: a SubjectAccessReview per verb).
//!
//! [`examine`] returns one [`Check`] per row: the subject and a [`Finding`] with the facts
//! found, whose kind decides the [`Status`]. The wording of the report is the caller's.

mod check;
mod hooks;
mod probe;
mod reads;
mod static_files;

#[cfg(test)]
mod tests;

use std::path::Path;

use ivory_policy::CompiledPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams};

pub use self::check::{
    Check, ConnectError, Finding, Layer, ProbeError, Source, StaticReadError, Status,
};
pub use self::hooks::{Endpoint, Hook, hook, registration_checks};
pub use self::probe::PROBE_TIMEOUT;
pub use self::reads::{read_check, reads_needed};
pub use self::static_files::{StaticFolder, applied, loaded_hashes, read_static, static_checks};
use crate::kube_source::{POLICY_VERSION, compile_policy_object, policy_resources};

/// CRDs ivory reads.
pub const CRDS: [&str; 2] = [
    "imagevalidatingpolicies.policies.kyverno.io",
    "namespacedimagevalidatingpolicies.policies.kyverno.io",
];

/// Every check, in the report's order: `api` (and nothing more when it fails), `crds`,
/// `policy`, `reads`, `registration`, `endpoint`. `service_account` is the user whose reads
/// are checked (`system:serviceaccount:NS:NAME`); `static_manifests` the folder `ivory
/// webhooks --static` wrote, when ivory is registered that way too.
pub async fn examine(service_account: &str, static_manifests: Option<&Path>) -> Vec<Check> {
    const API: &str = "kube-apiserver";
    let mut checks = Vec::new();
    let client = match connect().await {
        Ok((client, version)) => {
            checks.push(Check::new(API, Finding::ApiReached { version }));
            client
        }
        Err(e) => {
            checks.push(Check::new(API, Finding::ApiUnreachable(e)));
            return checks;
        }
    };
    checks.extend(crd_checks(&client).await);
    let (policies, policy_checks) = policy_checks(&client).await;
    checks.extend(policy_checks);
    checks.extend(reads::read_checks(&client, service_account, &policies).await);
    let static_hooks = static_registration(&client, static_manifests, &mut checks).await;
    match hooks::webhooks(&client).await {
        Ok(mut hooks) => {
            hooks.extend(static_hooks);
            checks.extend(registration_checks(&policies, &hooks));
            checks.extend(probe::endpoint_checks(&client, &hooks).await);
        }
        Err(e) => checks.push(Check::new(
            "webhook configurations",
            Finding::WebhooksUnlisted(e),
        )),
    }
    checks
}

/// The static registration's rows, and the webhooks of the static manifests the API server
/// applies.
async fn static_registration(
    client: &kube::Client,
    folder: Option<&Path>,
    checks: &mut Vec<Check>,
) -> Vec<Hook> {
    let folders = match folder.map(read_static).transpose() {
        Ok(folders) => folders.unwrap_or_default(),
        Err(e) => {
            let subject = folder.map(|f| f.display().to_string()).unwrap_or_default();
            checks.push(Check::new(subject, Finding::StaticUnreadable(e)));
            Vec::new()
        }
    };
    let loaded = static_files::read_metrics(client)
        .await
        .map(|text| loaded_hashes(&text));
    checks.extend(static_checks(&folders, &loaded));
    folders
        .into_iter()
        .filter(|f| applied(f, &loaded))
        .flat_map(|f| f.hooks)
        .collect()
}

/// A client from KUBECONFIG or the in-cluster config, and the API server's `gitVersion`.
async fn connect() -> Result<(kube::Client, String), ConnectError> {
    let client = kube::Client::try_default()
        .await
        .map_err(ConnectError::Config)?;
    let version = client
        .apiserver_version()
        .await
        .map_err(ConnectError::Version)?;
    Ok((client, version.git_version))
}

/// One row per CRD of [`CRDS`].
async fn crd_checks(client: &kube::Client) -> Vec<Check> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut checks = Vec::new();
    for name in CRDS {
        let finding = match api.get_opt(name).await {
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
                    (true, true) => Finding::CrdReady,
                    (false, _) => Finding::CrdVersionNotServed,
                    (true, false) => Finding::CrdNotEstablished,
                }
            }
            Ok(None) => Finding::CrdNotInstalled,
            Err(e) => Finding::CrdUnreadable(e),
        };
        checks.push(Check::new(name, finding));
    }
    checks
}

/// One row per policy object (or per kind that could not be listed, or one when there are
/// none), and the policies that compile.
async fn policy_checks(client: &kube::Client) -> (Vec<CompiledPolicy>, Vec<Check>) {
    let mut policies = Vec::new();
    let mut checks = Vec::new();
    for resource in policy_resources() {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(e) => {
                checks.push(Check::new(
                    resource.kind.clone(),
                    Finding::PoliciesUnlisted(e),
                ));
                continue;
            }
        };
        for object in list.items {
            let subject = policy_subject(&resource.kind, &object);
            match compile_policy_object(&object) {
                Ok(policy) => {
                    checks.push(Check::new(subject, Finding::PolicyCompiles));
                    policies.push(policy);
                }
                Err(errors) => checks.push(Check::new(subject, Finding::PolicyInvalid(errors))),
            }
        }
    }
    if checks.is_empty() {
        checks.push(Check::new("(none)", Finding::NoPolicies));
    }
    (policies, checks)
}

/// `Kind/name`, or `Kind/namespace/name` for a namespaced policy.
fn policy_subject(kind: &str, object: &DynamicObject) -> String {
    let name = object.metadata.name.as_deref().unwrap_or("");
    match object.metadata.namespace.as_deref() {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}
