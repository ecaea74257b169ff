//! `ivory doctor`: checks each layer between a policy and its enforcement, through the
//! Kubernetes API. What is checked and the verdict of each check are
//! [`ivory_server::doctor`]'s ([`examine`]); this file reads the flag, words each finding and
//! renders the table, and exits 1 when a check failed.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use ivory_server::doctor::{Check, Finding, Source, Status, examine};
use ivory_server::kube_source::POLICY_VERSION;

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
    /// The folder `ivory webhooks --static DIR` wrote (its validating/ and mutating/ folders),
    /// when ivory is registered through the API server's static manifests: their webhooks are
    /// reported beside the API's, with whether the API server applies them (read from its
    /// /metrics, which needs `get` on the non-resource URL /metrics) and where the two differ.
    #[arg(long, value_name = "DIR")]
    static_manifests: Option<PathBuf>,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Some((namespace, name)) = args.service_account.split_once('/') else {
        anyhow::bail!(
            "--service-account {:?}: expected NAMESPACE/NAME",
            args.service_account
        );
    };
    let user = format!("system:serviceaccount:{namespace}:{name}");
    let checks = examine(&user, args.static_manifests.as_deref()).await;
    print!("{}", render(&checks));
    let failed = checks.iter().any(|c| c.status() == Status::Fail);
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The DETAIL column: what a finding says, for people.
pub(crate) fn detail(check: &Check) -> String {
    match &check.finding {
        Finding::ApiReached { version } => version.clone(),
        Finding::ApiUnreachable(e) => chain(e),
        Finding::CrdReady => format!("{POLICY_VERSION} served, Established"),
        Finding::CrdVersionNotServed => format!("version {POLICY_VERSION} is not served"),
        Finding::CrdNotEstablished => "not Established".to_owned(),
        Finding::CrdNotInstalled => "not installed (kubectl apply -k deploy/crds)".to_owned(),
        Finding::CrdUnreadable(e) => e.to_string(),
        Finding::PolicyCompiles => "compiles".to_owned(),
        Finding::PolicyInvalid(errors) => {
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            errors.join("; ")
        }
        Finding::PoliciesUnlisted(e) => format!("listing: {e}"),
        Finding::NoPolicies => {
            "no ImageValidatingPolicy or NamespacedImageValidatingPolicy exists".to_owned()
        }
        Finding::ReadAllowed {
            read,
            service_account,
        } => format!("reads {read}; {service_account} may get, list and watch it"),
        Finding::ReadDenied {
            read,
            service_account,
            verbs,
        } => format!(
            "reads {read}, but {service_account} may not {} it: every read fails and the \
             failurePolicy decides (Helm value clusterReads, or the ClusterRole \
             ivory-cluster-reads)",
            verbs.join(", ")
        ),
        Finding::ReadUnknown {
            read,
            service_account,
            verb,
            error,
        } => {
            format!("reads {read}; could not ask whether {service_account} may {verb} it: {error}")
        }
        Finding::Registered {
            webhook,
            config,
            failure_policy,
            source,
            also_api,
        } => {
            let mut text = match source {
                Source::Api => format!("webhook {webhook} in {config}"),
                Source::Static => format!("static webhook {webhook} in {config}"),
            };
            let _ = write!(text, " (failurePolicy {failure_policy})");
            if let Some(api) = also_api {
                let _ = write!(text, "; also API webhook {api}");
            }
            text
        }
        Finding::SourcesDisagree {
            static_webhook,
            api_webhook,
            differences,
        } => format!(
            "static webhook {static_webhook} and API webhook {api_webhook} differ in {}: the API \
             server calls both, so the stricter decides; make them one (ivory webhooks with the \
             same flags) or delete the API one",
            differences.join(", ")
        ),
        Finding::StaticInForce {
            dir,
            hash,
            webhooks,
        } => format!(
            "in force: the API server applies {} as on disk ({hash}), {webhooks} webhook(s) \
             calling ivory; the API cannot delete them",
            dir.display()
        ),
        Finding::StaticStale {
            dir,
            on_disk,
            applied,
        } => format!(
            "the API server applies {}, not {} as on disk ({}): an edit not read yet (it \
             watches the folder, at most a minute) or refused (its log: \"reloading admission \
             manifest config\"); the last good version stays in force",
            applied.join(", "),
            dir.display(),
            on_disk.as_deref().unwrap_or("no manifests"),
        ),
        Finding::StaticNotApplied { dir } => format!(
            "the API server applies no static manifests for this plugin: {} is not in force \
             (start the API server with --admission-control-config-file pointing at ivory's \
             admission-configuration.yaml; Kubernetes 1.37+, ManifestBasedAdmissionControlConfig)",
            dir.display()
        ),
        Finding::StaticUnread { hashes } => format!(
            "the API server applies static webhook manifests ({}); pass --static-manifests DIR \
             to check them against the policies",
            hashes.join(", ")
        ),
        Finding::StaticUnknown(e) => format!(
            "cannot tell whether the API server applies the static manifests: reading its \
             /metrics: {e}"
        ),
        Finding::StaticUnreadable(e) => chain(e),
        Finding::Unregistered { stage } => format!(
            "no {stage} webhook calls ivory for this policy: it exists but is not enforced (register `ivory webhooks`)"
        ),
        Finding::FailurePolicyDiffers {
            webhook,
            webhook_says,
            policy_says,
        } => format!(
            "webhook {webhook} has failurePolicy {webhook_says}, the policy says {policy_says}"
        ),
        Finding::WebhooksUnlisted(e) => chain(e),
        Finding::EndpointReady { readyz, .. } => {
            let lines: Vec<&str> = readyz.lines().map(str::trim).collect();
            format!("/readyz: {}", lines.join(" | "))
        }
        Finding::EndpointUnready(e) => chain(e),
        Finding::EndpointSilent { timeout } => format!(
            "no answer within {}s (the API server will time out too)",
            timeout.as_secs()
        ),
    }
}

/// An error and its causes, joined by `: ` (as anyhow's `{:#}` writes them).
fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(out, ": {cause}");
        source = cause.source();
    }
    out
}

/// The report as an aligned table.
pub(crate) fn render(checks: &[Check]) -> String {
    let header = ["LAYER", "SUBJECT", "STATUS", "DETAIL"];
    let rows: Vec<[String; 4]> = checks
        .iter()
        .map(|c| {
            [
                c.layer().as_str().to_owned(),
                c.subject.clone(),
                c.status().as_str().to_owned(),
                detail(c),
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
    let count = |status| checks.iter().filter(|c| c.status() == status).count();
    out.push_str(&match (count(Status::Fail), count(Status::Warn)) {
        (0, 0) => "all layers ok\n".to_owned(),
        (0, w) => format!("no check failed; {w} warning(s)\n"),
        (n, _) => format!("{n} check(s) failed\n"),
    });
    out
}

#[cfg(test)]
mod tests;
