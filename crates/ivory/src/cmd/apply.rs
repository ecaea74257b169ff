//! `ivory apply --policy FILE… --resource FILE…`: runs the mutating then the validating stage
//! on each resource exactly as the webhook would (same engine calls, same per-route policy
//! selection, synthesized `namespaceObject`; the validating stage sees the mutated object),
//! then prints the patched resource and the decision. An AdmissionReview document is run as
//! the request it carries. Exit 0 when every resource is admitted,
//! 1 when any is denied, 2 on usage, configuration or registry errors.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ivory_engine::admission::{
    AdmissionRequest, AdmissionReview, GroupVersionKind, GroupVersionResource, Operation, UserInfo,
};
use ivory_engine::decision::{Decision, Status};
use ivory_engine::pipeline::{Routes, Stage, run_routes};
use serde_json::{Value, json};

use super::output::{self, Format};
use super::wiring::{self, RegistryOpts, duration};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "UPPER")]
pub(crate) enum Op {
    Create,
    Update,
}

#[derive(clap::Args)]
#[command(
    group(clap::ArgGroup::new("policy_input").required(true).multiple(true)),
    after_help = "Exit status: 0 every resource admitted, 1 any denied (not verified, or a validation \
failed), 2 any policy could not be evaluated (registry failure, time budget spent under \
failurePolicy Fail, CEL error) or a usage or configuration error. A time budget spent under \
failurePolicy Ignore admits with a warning."
)]
pub(crate) struct Args {
    /// Policy files or folders, as `kyverno apply <policy>…` takes them.
    #[arg(value_name = "POLICY", group = "policy_input")]
    positional_policies: Vec<PathBuf>,
    /// Policy file or folder (repeatable; `--policies` is the same flag, as `ivory serve` names
    /// it).
    #[arg(
        long = "policy",
        visible_alias = "policies",
        value_name = "FILE",
        group = "policy_input"
    )]
    policies: Vec<PathBuf>,
    /// PolicyException file or folder (repeatable): excepted policies are skipped for the
    /// resources their conditions select (as Kyverno's CLI `--exception`).
    #[arg(long = "exception", value_name = "FILE")]
    exceptions: Vec<PathBuf>,
    /// Cluster objects (YAML/JSON files or folders, repeatable) the policies' `resource.Get`,
    /// `resource.List` and `globalContext.Get` read, as `kyverno apply --cluster-resources`;
    /// without it such calls fail and the policy's failurePolicy decides.
    #[arg(long = "cluster-resources", value_name = "FILE")]
    cluster_resources: Vec<PathBuf>,
    /// Resource manifest or AdmissionReview (YAML or JSON, several documents allowed; `-` for
    /// stdin; repeatable). A review is run as the request it carries.
    #[arg(long = "resource", value_name = "FILE", required = true)]
    resources: Vec<PathBuf>,
    /// Admission operation. UPDATE sends the resource as both object and oldObject.
    #[arg(long, value_enum, default_value_t = Op::Create)]
    operation: Op,
    /// Namespace for namespaced resources without `metadata.namespace`.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Output format. `json` is stable: {"summary": {resources, allowed, denied, error},
    /// "resources": [{resource, allowed, message, warnings, patch, policies, object}]}.
    #[arg(long, short, value_enum, default_value_t = Format::Table)]
    output: Format,
    /// Time budget per resource and stage (Go duration), like the webhook's timeout.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    timeout: Duration,
    #[command(flatten)]
    registry: RegistryOpts,
}

/// What happened to one resource.
struct Applied {
    id: String,
    object: Value,
    mutate: Decision,
    validate: Decision,
}

impl Applied {
    fn allowed(&self) -> bool {
        self.mutate.allowed && self.validate.allowed
    }

    fn errored(&self) -> bool {
        self.mutate
            .results
            .iter()
            .chain(&self.validate.results)
            .any(|r| r.status == Status::Error)
    }

    fn message(&self) -> Option<String> {
        let parts: Vec<&str> = [&self.mutate.message, &self.validate.message]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    fn to_json(&self) -> Value {
        let policies: Vec<Value> = self
            .mutate
            .results
            .iter()
            .map(|r| (r, "mutate"))
            .chain(self.validate.results.iter().map(|r| (r, "validate")))
            .map(|(r, stage)| {
                json!({
                    "policy": r.policy,
                    "namespace": r.namespace,
                    "stage": stage,
                    "result": r.status.as_str(),
                    "message": r.message,
                })
            })
            .collect();
        let warnings: Vec<&String> = self
            .mutate
            .warnings
            .iter()
            .chain(&self.validate.warnings)
            .collect();
        json!({
            "resource": self.id,
            "allowed": self.allowed(),
            "message": self.message(),
            "warnings": warnings,
            "patch": ivory_engine::admission::patch_json(&self.mutate.patch),
            "policies": policies,
            "object": self.object,
        })
    }
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let files: Vec<PathBuf> = args
        .positional_policies
        .iter()
        .chain(&args.policies)
        .cloned()
        .collect();
    let policies = wiring::load_policies(&files)?;
    let exceptions = wiring::load_exceptions(&args.exceptions)?;
    let cluster = wiring::load_cluster_resources(&args.cluster_resources)?;
    let mut objects = Vec::new();
    for path in &args.resources {
        let text = wiring::read_input(path, "--resource")?;
        objects.extend(documents(&text).with_context(|| format!("--resource {}", path.display()))?);
    }
    if objects.is_empty() {
        bail!("--resource: no Kubernetes object found");
    }
    let verifier = args.registry.verifier()?;
    let mut applied = Vec::new();
    for object in objects {
        let req = match review_request(&object)? {
            Some(req) => req,
            None => request(object, args.operation, &args.namespace)?,
        };
        let routes = Routes {
            verifier: &verifier,
            resources: cluster.as_ref(),
            policies: &policies,
            exceptions: exceptions.as_ref(),
        };
        applied.push(apply(&routes, req, args.timeout).await?);
    }
    print(&applied, args.output)?;
    Ok(if applied.iter().any(Applied::errored) {
        ExitCode::from(2)
    } else if applied.iter().all(Applied::allowed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

async fn apply(
    routes: &Routes<'_>,
    mut req: AdmissionRequest,
    timeout: Duration,
) -> anyhow::Result<Applied> {
    let id = format!("{}/{}", req.kind.kind, qualified_name(&req));
    let mutate = run_routes(
        routes,
        Stage::Mutate,
        &mut req,
        None,
        ivory_clock::now() + timeout,
    )
    .await
    .with_context(|| format!("resource {id}"))?;
    let mut object = req
        .object
        .as_ref()
        .map_or(Value::Null, |o| o.value().clone());
    if mutate.allowed {
        wiring::apply_patch(&mut object, &mutate).with_context(|| format!("patching {id}"))?;
    }
    let validate = if mutate.allowed {
        // The API server sends the validating webhooks the object as mutated.
        req.object = Some(object.clone().into());
        run_routes(
            routes,
            Stage::Validate,
            &mut req,
            None,
            ivory_clock::now() + timeout,
        )
        .await
        .with_context(|| format!("resource {id}"))?
    } else {
        Decision {
            allowed: true,
            ..Decision::default()
        }
    };
    Ok(Applied {
        id,
        object,
        mutate,
        validate,
    })
}

fn qualified_name(req: &AdmissionRequest) -> String {
    if req.namespace.is_empty() {
        req.name.clone()
    } else {
        format!("{}/{}", req.namespace, req.name)
    }
}

/// Every non-empty document of a YAML/JSON stream (`ivory_policy::yaml_documents`, the one
/// reader); `kind: List` is flattened. A document that does not parse is the error, as an
/// [`ivory_policy::DocumentError`] naming its number and line.
pub(crate) fn documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for doc in ivory_policy::yaml_documents(text) {
        let number = doc.number;
        let value = doc
            .value
            .map_err(|syntax| ivory_policy::DocumentError::Yaml { number, syntax })?;
        match value {
            Value::Null => {}
            Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                let items = map.get("items").and_then(Value::as_array).cloned();
                out.extend(items.unwrap_or_default());
            }
            Value::Object(_) => out.push(value),
            _ => bail!("document {number} is not a Kubernetes object"),
        }
    }
    Ok(out)
}

/// The request of an `admission.k8s.io/v1` AdmissionReview document, used as the API server
/// sent it (operation, namespace, user and all); `None` for any other document.
fn review_request(document: &Value) -> anyhow::Result<Option<AdmissionRequest>> {
    if document.get("kind").and_then(Value::as_str) != Some("AdmissionReview") {
        return Ok(None);
    }
    let bytes = serde_json::to_vec(document).context("re-encoding the AdmissionReview")?;
    let review = AdmissionReview::parse(&bytes).context("AdmissionReview")?;
    if review.request.object.is_none() {
        bail!(
            "AdmissionReview {:?}: request has no object to apply the policies to",
            review.request.uid
        );
    }
    Ok(Some(review.request))
}

/// Cluster-scoped kinds an image policy could plausibly name; everything else is namespaced.
pub(crate) const CLUSTER_SCOPED: &[&str] =
    &["Namespace", "Node", "PersistentVolume", "ClusterRole"];

/// The AdmissionRequest the API server would send for `object`.
pub(crate) fn request(
    object: Value,
    op: Op,
    default_namespace: &str,
) -> anyhow::Result<AdmissionRequest> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    if api_version.is_empty() || kind.is_empty() {
        bail!("resource {name:?} has no apiVersion/kind");
    }
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let namespace = if CLUSTER_SCOPED.contains(&kind.as_str()) {
        String::new()
    } else {
        object["metadata"]["namespace"]
            .as_str()
            .unwrap_or(default_namespace)
            .to_owned()
    };
    let operation = match op {
        Op::Create => Operation::Create,
        Op::Update => Operation::Update,
    };
    Ok(AdmissionRequest {
        uid: format!("ivory-apply-{name}"),
        resource: GroupVersionResource::new(group, version, &plural(&kind)),
        kind: GroupVersionKind {
            group: group.to_owned(),
            version: version.to_owned(),
            kind,
        },
        name: name.to_owned(),
        namespace,
        operation,
        user_info: UserInfo {
            username: "ivory-cli".to_owned(),
            ..UserInfo::default()
        },
        old_object: (op == Op::Update).then(|| object.clone().into()),
        object: Some(object.into()),
        ..AdmissionRequest::default()
    })
}

/// The resource name of a kind (`Deployment` → `deployments`, `NetworkPolicy` → `networkpolicies`).
fn plural(kind: &str) -> String {
    let lower = kind.to_lowercase();
    if let Some(stem) = lower.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        return format!("{stem}ies");
    }
    if lower.ends_with('s') {
        return format!("{lower}es");
    }
    format!("{lower}s")
}

fn print(applied: &[Applied], format: Format) -> anyhow::Result<()> {
    let allowed = applied.iter().filter(|a| a.allowed()).count();
    let errored = applied.iter().filter(|a| a.errored()).count();
    let text = match format {
        Format::Json | Format::Yaml => {
            let doc = json!({
                "summary": {
                    "resources": applied.len(),
                    "allowed": allowed,
                    "denied": applied.len() - allowed,
                    "error": errored,
                },
                "resources": applied.iter().map(Applied::to_json).collect::<Vec<_>>(),
            });
            output::render(&doc, format == Format::Yaml)?
        }
        Format::Table => {
            let mut text = String::new();
            for a in applied {
                text.push_str(&table(a)?);
            }
            text.push_str(&format!(
                "{} resources: {allowed} allowed, {} denied\n",
                applied.len(),
                applied.len() - allowed
            ));
            text
        }
    };
    print!("{text}");
    Ok(())
}

/// The patched resource as YAML, then the decision as comments.
/// One resource's table entry: the object (YAML quotes control characters), then `#` lines
/// whose texts go through [`output::terminal`].
fn table(a: &Applied) -> anyhow::Result<String> {
    let t = output::terminal;
    let mut text = String::from("---\n");
    text.push_str(&ivory_policy::yaml::to_string(&a.object)?);
    let verdict = if a.allowed() { "ALLOWED" } else { "DENIED" };
    text.push_str(&format!("# {verdict} {}\n", t(&a.id)));
    for op in &a.mutate.patch {
        text.push_str(&format!(
            "#   patched {} = {}\n",
            t(&op.path),
            t(&op.value.to_string())
        ));
    }
    for r in a.mutate.results.iter().chain(&a.validate.results) {
        let detail = if r.message.is_empty() {
            String::new()
        } else {
            format!(": {}", t(&r.message))
        };
        text.push_str(&format!(
            "#   policy {} {}{detail}\n",
            t(&r.policy),
            r.status.as_str()
        ));
    }
    for w in a.mutate.warnings.iter().chain(&a.validate.warnings) {
        text.push_str(&format!("#   warning: {}\n", t(w)));
    }
    if let Some(m) = a.message() {
        text.push_str(&format!("#   message: {}\n", t(&m)));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals_of_workload_kinds() {
        for (kind, resource) in [
            ("Pod", "pods"),
            ("Deployment", "deployments"),
            ("CronJob", "cronjobs"),
            ("NetworkPolicy", "networkpolicies"),
            ("Gateway", "gateways"),
            ("Ingress", "ingresses"),
        ] {
            assert_eq!(plural(kind), resource);
        }
    }

    #[test]
    fn requests_look_like_the_api_servers() {
        let docs = documents(
            "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n---\n\
             apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: p, namespace: x}}\n",
        )
        .unwrap();
        assert_eq!(docs.len(), 2);
        let req = request(docs[0].clone(), Op::Update, "team").unwrap();
        assert_eq!(
            req.resource,
            GroupVersionResource::new("apps", "v1", "deployments")
        );
        assert_eq!(req.kind.group, "apps");
        assert_eq!(req.namespace, "team");
        assert_eq!(req.operation, Operation::Update);
        assert_eq!(req.old_object, req.object);
        let pod = request(docs[1].clone(), Op::Create, "team").unwrap();
        assert_eq!(pod.namespace, "x");
        assert!(pod.old_object.is_none());
        assert!(request(json!({"metadata": {"name": "n"}}), Op::Create, "d").is_err());
        assert!(documents("- a\n- b\n").is_err());
    }
}
