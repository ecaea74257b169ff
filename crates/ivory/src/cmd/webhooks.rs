//! `ivory webhooks`: print the webhook configurations for the loaded policies as YAML, or
//! write them as the API server's static manifests (`--static DIR`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use ivory_policy::types::{LabelSelector, LabelSelectorRequirement};
use ivory_policy::{LoadReport, default_policy, load_path};
use ivory_server::webhooks::static_manifests::{
    self, ADMISSION_CONFIGURATION_FILE, MANIFEST_FILE, MUTATING_DIR, VALIDATING_DIR,
};
use ivory_server::webhooks::{Options, Target, generate};
use serde_json::Value;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Policy file or folder (repeatable). Without it: the embedded default policy.
    #[arg(long = "policies", value_name = "PATH")]
    policies: Vec<PathBuf>,
    /// Namespace of ivory's Service. With --static: the namespace ivory runs in, which the
    /// webhooks always exclude (a static registration cannot be deleted to let ivory's own
    /// Pods start).
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
    /// Write the configurations as the API server's static manifests into DIR instead of
    /// printing them (Kubernetes 1.37+, ManifestBasedAdmissionControlConfig): DIR/validating/ivory.yaml,
    /// DIR/mutating/ivory.yaml (names ending in .static.k8s.io) and
    /// DIR/admission-configuration.yaml for the API server's --admission-control-config-file.
    /// Needs --url: static webhooks cannot call a Service. Files are replaced atomically, so
    /// the API server, which watches the folders, never reads half a file. See deploy/README.md.
    #[arg(long = "static", value_name = "DIR", requires = "url")]
    static_dir: Option<PathBuf>,
    /// With --static: DIR as the API server sees it (absolute), written into the
    /// AdmissionConfiguration, when the files are copied to the control-plane node; default
    /// DIR itself.
    #[arg(long, value_name = "PATH", requires = "static_dir")]
    static_apiserver_dir: Option<String>,
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
    if let Some(dir) = &args.static_dir {
        static_manifests::static_names(&mut opts);
        let (mutating, validating) = generate(&report.policies, &opts);
        write_static(
            dir,
            args.static_apiserver_dir.as_deref(),
            &mutating,
            &validating,
        )?;
        return Ok(ExitCode::SUCCESS);
    }
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
    if args.url.is_none() || args.static_dir.is_some() {
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

/// Writes the static manifests and the AdmissionConfiguration under `dir`, each checked against
/// the API server's static-manifest rules first, so nothing is written when one would be refused.
fn write_static(
    dir: &Path,
    apiserver_dir: Option<&str>,
    mutating: &Value,
    validating: &Value,
) -> anyhow::Result<()> {
    static_manifests::check(mutating)?;
    static_manifests::check(validating)?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating --static {}", dir.display()))?;
    let absolute = std::fs::canonicalize(dir)
        .with_context(|| format!("resolving --static {}", dir.display()))?;
    let apiserver_dir = match apiserver_dir {
        Some(path) => path.to_owned(),
        None => absolute.to_string_lossy().into_owned(),
    };
    let admission = static_manifests::admission_configuration(&apiserver_dir)?;
    let files = [
        (absolute.join(VALIDATING_DIR), MANIFEST_FILE, validating),
        (absolute.join(MUTATING_DIR), MANIFEST_FILE, mutating),
        (absolute.clone(), ADMISSION_CONFIGURATION_FILE, &admission),
    ];
    for (folder, name, value) in files {
        let text = ivory_policy::yaml::to_string(value)?;
        std::fs::create_dir_all(&folder)
            .with_context(|| format!("creating {}", folder.display()))?;
        // Staged under a `.tmp` name the API server does not read, then renamed: it never
        // loads half a file.
        super::files::write_replacing(&folder.join(name), text.as_bytes())?;
        eprintln!("wrote {}", folder.join(name).display());
    }
    let copy = if Path::new(&apiserver_dir) == absolute {
        String::new()
    } else {
        format!(
            "copy {} to {apiserver_dir} on every control-plane node, then ",
            absolute.display()
        )
    };
    eprintln!(
        "next: {copy}start each API server with \
         --admission-control-config-file={apiserver_dir}/{ADMISSION_CONFIGURATION_FILE} (or add \
         its two plugins to the AdmissionConfiguration it already reads); it watches the folders, \
         so later edits apply without a restart (deploy/README.md, \"Static registration\")"
    );
    Ok(())
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
