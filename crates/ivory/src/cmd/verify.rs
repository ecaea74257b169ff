//! `ivory verify IMAGE…`: checks images against policies (or ad-hoc flags) and reports, per
//! image, the resolved digest, the policy results and which attestors verified or failed and
//! why. Exit 0 when every image passes, 1 when any does not, 2 on usage, configuration or
//! registry errors.
//!
//! Tags are resolved to digests first and verified by digest (`ivory_engine::report`), so policies with
//! `verifyDigest` accept tags here as the webhook does after its mutating stage pinned them.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ivory_engine::report::{ImageChecker, ImageReport};
use serde_json::json;

use super::output::{self, Counts, Format};
use super::quick_policy::{self, QuickPolicy};
use super::wiring::{RegistryOpts, duration};

#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 every image passed, 1 any image failed (not verified, or denied by a \
validation), 2 any image could not be checked (registry failure, time budget spent under \
failurePolicy Fail, CEL error) or a usage or configuration error. A time budget spent under \
failurePolicy Ignore passes with a warning. Tags are resolved to digests and verified by digest."
)]
pub(crate) struct Args {
    /// Images to verify (tags or digests).
    #[arg(value_name = "IMAGE", required = true)]
    images: Vec<String>,
    /// Policy file or folder (repeatable).
    #[arg(long = "policy", visible_alias = "policies", value_name = "FILE")]
    policies: Vec<PathBuf>,
    #[command(flatten)]
    quick: QuickPolicy,
    /// PolicyException file or folder (repeatable): an exception whose conditions hold for the
    /// synthetic Pod skips the policy it names (as Kyverno's CLI `--exception`).
    #[arg(long = "exception", value_name = "FILE")]
    exceptions: Vec<PathBuf>,
    /// Cluster objects (YAML/JSON files or folders, repeatable) the policies' `resource.Get`,
    /// `resource.List` and `globalContext.Get` read, as `kyverno apply --cluster-resources`;
    /// without it such calls fail and the policy's failurePolicy decides.
    #[arg(long = "cluster-resources", value_name = "FILE")]
    cluster_resources: Vec<PathBuf>,
    /// Output format. `json` is stable: {"summary": {images, pass, fail, error},
    /// "images": [{image, digest, verdict, policies, message}]}; each attestor's `looked` lists
    /// the signature layouts read and what each held.
    #[arg(long, short, value_enum, default_value_t = Format::Table)]
    output: Format,
    /// In the table, give each failed attestor's reason alone, then one row per signature
    /// layout read (`.sig`/`.att` tag, referrers API, fallback tag) and what it held.
    #[arg(long)]
    explain: bool,
    /// Namespace of the synthetic Pod the policies are evaluated on.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Time budget per image (Go duration).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration)]
    timeout: Duration,
    #[command(flatten)]
    registry: RegistryOpts,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let policies = quick_policy::policies(&args.policies, &args.quick)?;
    let checker = ImageChecker {
        verifier: Arc::new(args.registry.verifier()?),
        policies,
        timeout: args.timeout,
        namespace: args.namespace.clone(),
        exceptions: super::wiring::load_exceptions(&args.exceptions)?,
        resources: super::wiring::load_cluster_resources(&args.cluster_resources)?,
        namespace_object: None,
    };
    let mut reports = Vec::with_capacity(args.images.len());
    for image in &args.images {
        reports.push(checker.check(image).await);
    }
    print(&reports, args.output, args.explain)?;
    Ok(exit_code(&reports))
}

fn print(reports: &[ImageReport], format: Format, explain: bool) -> anyhow::Result<()> {
    let counts = Counts::of(reports);
    let text = match format {
        Format::Table => {
            let mut text = output::image_table_explained(reports, explain);
            text.push_str(&summary_line(&counts));
            text
        }
        Format::Json | Format::Yaml => {
            let doc = json!({
                "summary": {
                    "images": counts.total(),
                    "pass": counts.pass,
                    "fail": counts.fail,
                    "error": counts.error,
                },
                "images": reports.iter().map(output::image_json).collect::<Vec<_>>(),
            });
            output::render(&doc, format == Format::Yaml)?
        }
    };
    print!("{text}");
    Ok(())
}

fn summary_line(c: &Counts) -> String {
    format!(
        "{} images: {} pass, {} fail, {} error\n",
        c.total(),
        c.pass,
        c.fail,
        c.error
    )
}

/// 2 when anything could not be checked, else 1 when anything failed, else 0.
pub(crate) fn exit_code(reports: &[ImageReport]) -> ExitCode {
    let c = Counts::of(reports);
    if c.error > 0 {
        ExitCode::from(2)
    } else if c.fail > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
