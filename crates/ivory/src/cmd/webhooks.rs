//! `ivory webhooks`: print the webhook configurations for the loaded policies as YAML.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use ivory_policy::types::{LabelSelector, LabelSelectorRequirement};
use ivory_policy::{LoadReport, default_policy, load_path};
use ivory_server::webhooks::{Options, Target, generate};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Policy file or folder (repeatable). Without it: the embedded default policy.
    #[arg(long = "policies", value_name = "PATH")]
    policies: Vec<PathBuf>,
    /// Namespace of ivory's Service.
    #[arg(long, default_value = "ivory")]
    service_namespace: String,
    /// Name of ivory's Service.
    #[arg(long, default_value = "ivory")]
    service_name: String,
    /// Port of ivory's Service.
    #[arg(long, default_value_t = 443)]
    service_port: u16,
    /// Call ivory at this base URL (`https://host:port`) instead of through a Service.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// PEM CA bundle written (base64) as every webhook's `clientConfig.caBundle`.
    #[arg(long, value_name = "FILE")]
    ca_bundle: Option<PathBuf>,
    /// Domain part of webhook names (`ivpol.validate.<DOMAIN>-fail`).
    #[arg(long, default_value = "ivory.svc")]
    domain: String,
    /// Namespace no webhook applies to (repeatable). With a Service target, the Service's
    /// namespace is always excluded too, so ivory never gates its own pods. The default,
    /// `kube-system`, is Kyverno's chart default; `--exclude-namespace=` (empty) removes it, so
    /// that Pods in kube-system are verified too.
    #[arg(long = "exclude-namespace", value_name = "NS", default_values = ["kube-system"])]
    exclude_namespaces: Vec<String>,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let report = load(&args.policies);
    if !report.errors.is_empty() {
        for e in &report.errors {
            eprintln!("error: {e}");
        }
        bail!(
            "{} policy error(s); no webhooks printed",
            report.errors.len()
        );
    }
    let mut opts = Options::for_service(
        &args.service_namespace,
        &args.service_name,
        args.service_port,
    );
    if let Some(url) = &args.url {
        if !url.starts_with("https://") {
            bail!("--url must start with https:// (the API server only calls HTTPS webhooks)");
        }
        opts.target = Target::Url(url.clone());
    }
    if let Some(path) = &args.ca_bundle {
        let pem = std::fs::read(path)
            .with_context(|| format!("reading --ca-bundle {}", path.display()))?;
        opts.ca_bundle_pem = Some(pem);
    }
    opts.domain = args.domain.clone();
    opts.namespace_selector = exclusions(&args);
    warn_unjudged(&args, &report);
    let (mutating, validating) = generate(&report.policies, &opts);
    let text = format!(
        "{}---\n{}",
        ivory_policy::yaml::to_string(&mutating)?,
        ivory_policy::yaml::to_string(&validating)?
    );
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// Says on stderr what the printed webhooks will never send to ivory: the namespaces excluded
/// beyond ivory's own (the policies do not state them), and the policies' own blind spots.
fn warn_unjudged(args: &Args, report: &LoadReport) {
    let excluded: Vec<&str> = args
        .exclude_namespaces
        .iter()
        .map(String::as_str)
        .filter(|n| !n.is_empty())
        .collect();
    if !excluded.is_empty() {
        eprintln!(
            "note: the webhooks exclude namespace(s) {}: no policy applies there and Pods there \
             are not verified (--exclude-namespace= removes the default kube-system)",
            excluded.join(", ")
        );
    }
    for warning in report.policies.iter().flat_map(ivory_policy::blind_spots) {
        eprintln!("warning: {warning}");
    }
}

/// One `NotIn` per excluded namespace, as Kyverno writes its own exclusions.
fn exclusions(args: &Args) -> Option<LabelSelector> {
    let mut names: Vec<&str> = args.exclude_namespaces.iter().map(String::as_str).collect();
    if args.url.is_none() {
        names.push(&args.service_namespace);
    }
    names.retain(|n| !n.is_empty());
    names.dedup();
    let match_expressions: Vec<LabelSelectorRequirement> = names
        .into_iter()
        .map(|n| LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".to_owned(),
            operator: "NotIn".to_owned(),
            values: vec![n.to_owned()],
        })
        .collect();
    (!match_expressions.is_empty()).then(|| LabelSelector {
        match_expressions,
        ..LabelSelector::default()
    })
}

fn load(paths: &[PathBuf]) -> LoadReport {
    let mut report = LoadReport::default();
    if paths.is_empty() {
        report.policies.push(default_policy());
    }
    for path in paths {
        report.merge(load_path(path));
    }
    report
}
