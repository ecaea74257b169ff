//! `ivory convert FILE…`: Kyverno's legacy `verifyImages` rules as ImageValidatingPolicies
//! (`ivory_convert`). Every file is converted and checked (the output must load in ivory)
//! before anything is written; with any refused rule or error, nothing is written.
//!
//! Exit codes: 0 converted (possibly with documented differences), 1 a rule was refused,
//! 2 a file could not be read or parsed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use ivory_convert::{Conversion, MAX_INPUT_BYTES, Options, convert_str_with};

use super::files::OutputDir;
use super::output;
use super::wiring::read_bounded;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// ClusterPolicy / Policy files (multi-document YAML or JSON; `-` reads standard input).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Write one `<policy>.yaml` per converted policy into this folder (created if missing;
    /// files are created new under temporary names and renamed once all are written, so a
    /// link planted in the folder is replaced, never written through) instead of printing one
    /// YAML stream on standard output.
    #[arg(long, short = 'o', value_name = "DIR")]
    output: Option<PathBuf>,
    /// Print the per-rule report as JSON on standard error instead of text.
    #[arg(long)]
    report_json: bool,
    /// Apply the fixes Kyverno's own policy validation asks for instead of refusing the rule
    /// (as `kyverno fix` would), each reported as "fixed (--fix)": `mutateDigest` on under the
    /// `Audit` failure action becomes `false`.
    #[arg(long)]
    fix: bool,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut conversions = Vec::new();
    for file in &args.files {
        let (text, origin) = read(file)?;
        let options = Options { fix: args.fix };
        let conversion =
            convert_str_with(&text, &origin, options).map_err(|e| anyhow::anyhow!("{e}"))?;
        conversions.push(conversion);
    }
    print_report(&conversions, args.report_json)?;
    if conversions.iter().any(Conversion::refused) {
        eprintln!("error: some rules were refused; nothing written");
        return Ok(ExitCode::from(1));
    }
    check_loads(&conversions)?;
    check_unique(&conversions)?;
    match &args.output {
        Some(dir) => write_dir(dir, &conversions)?,
        None => {
            let stream: String = conversions.iter().map(|c| c.yaml.as_str()).collect();
            print!("{stream}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Reads a file (or standard input for `-`) with a size cap, as UTF-8.
fn read(file: &Path) -> anyhow::Result<(String, String)> {
    let limit = u64::try_from(MAX_INPUT_BYTES).unwrap_or(u64::MAX);
    let (origin, text) = if file == Path::new("-") {
        let origin = "<stdin>".to_owned();
        let text = read_bounded(std::io::stdin(), &origin, limit)?;
        (origin, text)
    } else {
        let origin = file.display().to_string();
        let opened =
            std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
        let text = read_bounded(opened, &origin, limit)?;
        (origin, text)
    };
    Ok((text, origin))
}

fn print_report(conversions: &[Conversion], json: bool) -> anyhow::Result<()> {
    if json {
        let reports: Vec<_> = conversions.iter().flat_map(|c| c.reports.iter()).collect();
        eprintln!(
            "{}",
            output::json_for_terminal(serde_json::to_string_pretty(&reports)?)
        );
        return Ok(());
    }
    // Policy and rule names are the input's: every line shown with its control characters
    // visible (no escape sequence reaches the terminal).
    for c in conversions {
        for line in &c.skipped {
            eprintln!("{}", output::terminal(line));
        }
        for r in &c.reports {
            for line in r.to_string().lines() {
                eprintln!("{}", output::terminal(line));
            }
        }
    }
    Ok(())
}

/// The converted policies must load in ivory: a defect of the converter never reaches a file.
fn check_loads(conversions: &[Conversion]) -> anyhow::Result<()> {
    for c in conversions {
        let report = ivory_policy::load_str(&c.yaml, "converted policies");
        if let Some(e) = report.errors.first() {
            bail!(
                "a converted policy does not load in ivory (a converter bug; nothing written): {e}"
            );
        }
    }
    Ok(())
}

/// Two files must not convert to policies of one name: one would replace the other.
fn check_unique(conversions: &[Conversion]) -> anyhow::Result<()> {
    let mut seen = std::collections::BTreeMap::new();
    for c in conversions {
        for r in c.reports.iter() {
            let Some(name) = &r.converted_to else {
                continue;
            };
            let namespace = c
                .policies
                .iter()
                .find(|p| &p.metadata.name == name)
                .and_then(|p| p.metadata.namespace.clone());
            if let Some(first) = seen.insert((namespace, name.clone()), r.location.clone()) {
                bail!(
                    "{} and {first} both convert to a policy named {name:?}; rename a policy or rule (nothing written)",
                    r.location
                );
            }
        }
    }
    Ok(())
}

/// Writes every policy into `dir`: each file created new under a temporary name beside its
/// target (never through a link planted in the folder), then all renamed over their targets.
fn write_dir(dir: &Path, conversions: &[Conversion]) -> anyhow::Result<()> {
    let mut staged = OutputDir::open(dir, true)?;
    for c in conversions {
        for policy in &c.policies {
            let text = ivory_policy::yaml::to_string(policy).context("writing YAML")?;
            let name = match &policy.metadata.namespace {
                Some(ns) => format!("{ns}-{}.yaml", policy.metadata.name),
                None => format!("{}.yaml", policy.metadata.name),
            };
            staged.stage(&name, text.as_bytes())?;
        }
    }
    for target in staged.commit()? {
        eprintln!("wrote {}", output::terminal(&target.display().to_string()));
    }
    Ok(())
}
