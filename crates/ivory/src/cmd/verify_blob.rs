//! `ivory verify-blob BLOB --bundle FILE`: a file, or a `sha256:` digest, checked against a
//! Sigstore bundle with a key or a keyless identity, as `cosign verify-blob --bundle` does (its
//! flag names), with the webhook's trust: the embedded public-good trusted root unless
//! `--trusted-root` names another, and `ivory_verify::blob`'s checks (certificate chain, SCT,
//! Rekor v1 and v2 entries bound to this signature, RFC 3161 timestamps).
//!
//! Exit 0 verified, 1 not verified (the reason is printed), 2 usage, unreadable file or a key
//! or trusted root that cannot be used; the same meaning as `ivory verify`'s.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use ivory_policy::types::Attestor;
use ivory_verify::blob::{Blob, BlobVerified, MAX_BUNDLE_BYTES, verify_blob};
use ivory_verify::{Plan, Rejection};
use serde_json::{Value, json};

use super::output::{self, Format};

#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 the bundle verifies the blob, 1 it does not (the reason \
is printed), 2 a usage error, a file that cannot be read, or a key or trusted root that cannot \
be used. BLOB is a file, or `sha256:<64 hex digits>` when no file has that name."
)]
#[command(group(clap::ArgGroup::new("signer").required(true).args(["key", "certificate_identity", "certificate_identity_regexp"])))]
pub(crate) struct Args {
    /// The artifact: a file, or its digest as `sha256:<hex>` (when no file has that name).
    #[arg(value_name = "BLOB")]
    blob: String,
    /// The Sigstore bundle (cosign `sign-blob --bundle`, any bundle version 0.1 to 0.3).
    #[arg(long, value_name = "FILE")]
    bundle: PathBuf,
    /// Public key (PEM) the signature must verify with.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["certificate_identity", "certificate_identity_regexp"])]
    key: Option<PathBuf>,
    /// Keyless: the identity (SAN) the signing certificate must name exactly.
    #[arg(
        long,
        value_name = "IDENTITY",
        conflicts_with = "certificate_identity_regexp"
    )]
    certificate_identity: Option<String>,
    /// Keyless: a regexp (unanchored, as cosign) the signing certificate's identity must match.
    #[arg(long, value_name = "REGEXP")]
    certificate_identity_regexp: Option<String>,
    /// Keyless: the OIDC issuer the signing certificate must name exactly.
    #[arg(
        long,
        value_name = "URL",
        conflicts_with = "certificate_oidc_issuer_regexp"
    )]
    certificate_oidc_issuer: Option<String>,
    /// Keyless: a regexp (unanchored) the signing certificate's OIDC issuer must match.
    #[arg(long, value_name = "REGEXP")]
    certificate_oidc_issuer_regexp: Option<String>,
    /// Sigstore trusted_root.json (default: the embedded public-good root, as the webhook's).
    #[arg(long, value_name = "FILE")]
    trusted_root: Option<PathBuf>,
    /// Accept a bundle without a verified transparency-log entry (cosign's flag).
    #[arg(long)]
    insecure_ignore_tlog: bool,
    /// Accept a keyless certificate without a verified SCT (cosign's flag).
    #[arg(long)]
    insecure_ignore_sct: bool,
    /// Output format. `json`: {blob, verified, signer, evidence, statement, message}.
    #[arg(long, short, value_enum, default_value_t = Format::Table)]
    output: Format,
}

/// Largest `--key` file: a PEM public key or certificate chain is a few KiB.
const MAX_KEY_FILE_BYTES: u64 = 1024 * 1024;
/// Largest `--trusted-root` file: the public-good trusted root is about 20 KiB.
const MAX_TRUSTED_ROOT_BYTES: u64 = 4 * 1024 * 1024;

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let plan = plan(&args)?;
    let bundle = read_flag_file(&args.bundle, "--bundle", MAX_BUNDLE_BYTES as u64)?;
    let path = Path::new(&args.blob);
    let blob = match Blob::sha256_digest(&args.blob) {
        Some(digest) if !path.exists() => Blob::Sha256(digest),
        _ => {
            // Said here, so an unreadable file is a usage error and not a verdict.
            std::fs::File::open(path).with_context(|| format!("reading {}", args.blob))?;
            if !path.is_file() {
                bail!("{} is not a file", args.blob);
            }
            Blob::File(path)
        }
    };
    let verdict = verify_blob(&plan, blob, bundle.as_bytes());
    print(&args, &verdict)?;
    Ok(match verdict {
        Ok(_) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    })
}

/// The attestor the flags describe, made ready with the trust root.
fn plan(args: &Args) -> anyhow::Result<Plan> {
    let mut cosign = json!({});
    if let Some(path) = &args.key {
        let pem = read_flag_file(path, "--key", MAX_KEY_FILE_BYTES)?;
        cosign["key"] = json!({ "data": pem });
    } else {
        if args.certificate_oidc_issuer.is_none() && args.certificate_oidc_issuer_regexp.is_none() {
            bail!(
                "keyless verification needs --certificate-oidc-issuer or --certificate-oidc-issuer-regexp"
            );
        }
        cosign["keyless"] = json!({ "identities": [{
            "subject": args.certificate_identity,
            "subjectRegExp": args.certificate_identity_regexp,
            "issuer": args.certificate_oidc_issuer,
            "issuerRegExp": args.certificate_oidc_issuer_regexp,
        }]});
    }
    if let Some(path) = &args.trusted_root {
        let root = read_flag_file(path, "--trusted-root", MAX_TRUSTED_ROOT_BYTES)?;
        cosign["trustedRoot"] = json!({ "value": root });
    }
    if args.insecure_ignore_tlog || args.insecure_ignore_sct {
        cosign["ctlog"] = json!({
            "insecureIgnoreTlog": args.insecure_ignore_tlog,
            "insecureIgnoreSCT": args.insecure_ignore_sct,
        });
    }
    let attestor: Attestor = serde_json::from_value(json!({ "name": "blob", "cosign": cosign }))
        .context("building the attestor from the flags")?;
    Ok(Plan::with_trust_root(
        &attestor,
        &ivory_verify::RootState::embedded(),
    )?)
}

/// The text of the file a flag names, read under `max` bytes by the commands' one bounded
/// reader; errors name the flag and the path.
fn read_flag_file(path: &Path, flag: &str, max: u64) -> anyhow::Result<String> {
    let origin = format!("{flag} {}", path.display());
    let file = std::fs::File::open(path).with_context(|| format!("reading {origin}"))?;
    super::wiring::read_bounded(file, &origin, max)
}

fn print(args: &Args, verdict: &Result<BlobVerified, Rejection>) -> anyhow::Result<()> {
    let text = match args.output {
        Format::Table => table(&args.blob, verdict),
        Format::Json | Format::Yaml => {
            output::render(&document(&args.blob, verdict), args.output == Format::Yaml)?
        }
    };
    print!("{text}");
    Ok(())
}

fn table(blob: &str, verdict: &Result<BlobVerified, Rejection>) -> String {
    let blob = output::terminal(blob);
    match verdict {
        Ok(v) => {
            let mut text = format!("Verified OK: {blob}\n");
            let signer = &v.signer;
            if let Some(subject) = &signer.subject {
                let issuer = signer.issuer.as_deref().unwrap_or("(none)");
                text.push_str(&format!(
                    "  signed by {} (issuer {})\n",
                    output::terminal(subject),
                    output::terminal(issuer)
                ));
            }
            if let Some(key) = &signer.key {
                text.push_str(&format!("  signed with key {key}\n"));
            }
            for line in &v.evidence {
                text.push_str(&format!("  {line}\n"));
            }
            text
        }
        Err(reason) => format!(
            "Not verified: {blob}: {}\n",
            output::terminal(&reason.to_string())
        ),
    }
}

fn document(blob: &str, verdict: &Result<BlobVerified, Rejection>) -> Value {
    match verdict {
        Ok(v) => json!({
            "blob": blob,
            "verified": true,
            "signer": v.signer,
            "evidence": v.evidence,
            "statement": v.statement,
        }),
        Err(reason) => json!({
            "blob": blob,
            "verified": false,
            "message": reason.to_string(),
        }),
    }
}
