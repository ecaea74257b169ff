//! `ivory audit`: verifies every image of a registry (catalog + tag listing, paginated) and/or
//! of an image list and/or of the Pods of a cluster against the policies, and reports.
//!
//! * Work is bounded: `--concurrency` images in flight, `--registry-concurrency` requests per
//!   registry host.
//! * A registry under audit may be hostile: its listings are read page by page and each page
//!   is queued for verification as it comes (never the whole listing in memory), names
//!   outside the OCI distribution grammar are skipped and reported once per repository
//!   (never shown), and at most `--max-images` images are listed per audit.
//! * Tags that hold cosign signatures/attestations (`sha256-<hex>.sig`, …) are not images.
//! * Dedup: tags are resolved first and each distinct `repository@digest` is verified once
//!   (signatures live beside the image in its repository, so the repository is part of the
//!   key); every tag of it gets that verdict.
//! * Cluster Pods (`--kubeconfig [FILE]`, else as kubectl finds the cluster): each container's
//!   status `imageID` digest, else its spec image, evaluated in the Pod's namespace (the
//!   Namespace as the cluster holds it, so namespaceSelectors and namespaced policies apply)
//!   and read with the Pod's `imagePullSecrets`; `--policy-report` then holds one namespaced
//!   PolicyReport per namespace.
//! * A progress line on stderr when it is a terminal, none when piped.
//! * Ctrl-C stops the audit and prints what finished (`summary.interrupted: true`, exit 130).
//! * Exit 0 when everything passed (or `--exit-zero`), 1 when anything failed, 2 when anything
//!   could not be checked or listed.
//! * Sharded (`--shard I/N`, `shard.rs`): a shard audits the entries whose name hashes to it,
//!   writes its part as it goes (`--shard-out DIR`, `part.rs`) and resumes from it; `--merge
//!   DIR` joins complete parts into the report one process would have written (`merge.rs`).
//!   `--cache-redis` shares verdicts between shards (and with the webhook) as `ivory serve`
//!   does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{IsTerminal as _, Write as _};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use ivory_engine::report::{ImageChecker, ImageReport};
use ivory_engine::verifier::ImageVerifier;
use ivory_registry::{Credentials, Registry};
use ivory_verify::SharedCache;
use serde_json::json;

use self::listing::list_registry;
use self::part::{Completion, Opened, Part};
use self::progress::Progress;
use self::queue::ImageQueue;
use self::shard::Shard;
use super::output::{self, AuditFormat, Counts};
use super::quick_policy::{self, QuickPolicy};
use super::wiring::{self, RegistryOpts, duration, positive};

mod cluster;
mod job;
mod listing;
mod merge;
mod part;
mod progress;
mod queue;
mod shard;

/// Default of `--concurrency`: images verified at the same time.
const DEFAULT_CONCURRENCY: NonZeroUsize = NonZeroUsize::new(8).unwrap();

#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 everything passed (or --exit-zero), 1 any image failed (not \
verified, or denied by a validation), 2 any image could not be checked (registry failure, time \
budget spent under failurePolicy Fail, CEL error) or a source could not be listed (in full: \
names outside the OCI grammar, --max-images reached), 130 interrupted (the finished part is \
printed)."
)]
pub(crate) struct Args {
    /// Policy file or folder (repeatable).
    #[arg(long = "policy", visible_alias = "policies", value_name = "FILE")]
    policies: Vec<PathBuf>,
    #[command(flatten)]
    quick: QuickPolicy,
    /// Audit every repository in this registry's catalog (host or host:port; repeatable).
    #[arg(long = "registry", value_name = "HOST")]
    registries: Vec<String>,
    /// Only repositories whose name matches this glob (`*` also matches `/`; repeatable).
    #[arg(long = "repository", value_name = "GLOB", requires = "registries")]
    repositories: Vec<String>,
    /// File with one image reference per line (`#` comments; `-` for stdin; repeatable).
    #[arg(long, value_name = "FILE")]
    images_from: Vec<PathBuf>,
    /// Audit the images of the Pods of a cluster: this kubeconfig's current context, or
    /// without FILE as kubectl finds it (KUBECONFIG, ~/.kube/config, in-cluster config).
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    kubeconfig: Option<Option<PathBuf>>,
    /// Images verified at the same time.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONCURRENCY)]
    concurrency: NonZeroUsize,
    /// Images listed from registries at most; past it the listing stops and says so (an
    /// error entry: exit 2).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_IMAGES, value_parser = positive)]
    max_images: usize,
    /// Entries per catalog/tag-list page.
    #[arg(long, value_name = "N", default_value_t = ivory_registry::DEFAULT_PAGE_SIZE, value_parser = positive)]
    page_size: usize,
    /// Output format. `json` is stable: {"summary": {images, digests, pass, fail, error,
    /// found, interrupted, truncated}, "images": [{image, digest, verdict, policies, message}]}.
    #[arg(long, short, value_enum, default_value_t = AuditFormat::Table)]
    output: AuditFormat,
    /// Also write a wgpolicyk8s.io/v1alpha2 ClusterPolicyReport (YAML) to FILE (`-`: stdout);
    /// with --kubeconfig, one PolicyReport per namespace of the cluster's images (plus a
    /// ClusterPolicyReport for images from other sources).
    #[arg(long, value_name = "FILE")]
    policy_report: Option<PathBuf>,
    /// Exit 0 even when images fail or cannot be checked.
    #[arg(long)]
    exit_zero: bool,
    /// Namespace of the synthetic Pod the policies are evaluated on (default `default`); with
    /// --kubeconfig, also the only namespace whose Pods are audited (default: all).
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
    /// Time budget per image and per listing call (Go duration).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = duration)]
    timeout: Duration,
    /// Audit only shard I of N (0-based, `I/N`): the images and listing problems whose name
    /// hashes to I. Every shard lists all sources, so shards agree on the split whatever order
    /// the registry lists in; run N of them (an Indexed Job: `--shard $(JOB_COMPLETION_INDEX)/N`)
    /// and join their parts with --merge.
    #[arg(long, value_name = "I/N", value_parser = shard::parse, conflicts_with = "kubeconfig")]
    shard: Option<Shard>,
    /// With --shard: write the shard's part into DIR as it goes (shard-I-of-N.jsonl, one
    /// report a line; shard-I-of-N.done.json when finished). A shard started again on the
    /// same DIR resumes: its pass and fail reports are kept, the rest checked again, no image
    /// counted twice; one already done does nothing. Exits 0 once its part is done, whatever
    /// the verdicts: they are the merge's.
    #[arg(long, value_name = "DIR", requires = "shard")]
    shard_out: Option<PathBuf>,
    /// Join the parts of a sharded audit in DIR into the one report a single process writes
    /// (every output format, --policy-report, exit status), each shard's counts on stderr.
    /// Refuses, naming them, when shards are missing or unfinished.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["registries", "images_from", "kubeconfig", "shard"])]
    merge: Option<PathBuf>,
    /// Share verdicts through this Redis/Valkey server (`redis://` or `rediss://`), as the
    /// webhook's replicas do, instead of the local cache folder: shards then never verify
    /// twice what another verified.
    #[arg(long, value_name = "URL")]
    cache_redis: Option<String>,
    /// HMAC key file(s) of --cache-redis (the webhook's `ivory serve --cache-redis-key`).
    #[arg(long, value_name = "FILE", requires = "cache_redis")]
    cache_redis_key: Vec<PathBuf>,
    /// PEM CA of a `rediss://` --cache-redis server's certificate.
    #[arg(long, value_name = "FILE", requires = "cache_redis")]
    cache_redis_ca: Option<PathBuf>,
    /// Longest one call to --cache-redis may take (Go duration); slower counts as a miss.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = duration)]
    cache_redis_timeout: Duration,
    #[command(flatten)]
    registry: RegistryOpts,
    #[command(flatten)]
    job: job::JobOpts,
}

/// Default of `--max-images`: a large registry's worth, a few MiB of reports.
const DEFAULT_MAX_IMAGES: usize = 10_000;

/// What the audit has finished so far (kept when it is interrupted).
#[derive(Default)]
struct Finished {
    reports: Vec<ImageReport>,
    /// Images found by the sources.
    found: usize,
    /// Distinct repository@digest pairs verified.
    digests: usize,
    /// Registry listings stopped at `--max-images`.
    truncated: bool,
    /// The shard this run audits; `None`: everything.
    shard: Option<Shard>,
    /// Where finished reports go as they finish (`--shard-out`).
    part: Option<Part>,
    /// Images an earlier run of this shard finished (kept from its part).
    resumed: HashSet<String>,
}

impl Finished {
    /// Whether this run audits `entry` (an image, or a listing problem's subject).
    fn owns(&self, entry: &str) -> bool {
        self.shard.is_none_or(|shard| shard.owns(entry))
    }

    /// Keeps a finished report, and appends it to the part.
    fn record(&mut self, report: ImageReport) {
        if let Some(part) = &mut self.part {
            part.append(&report);
        }
        self.reports.push(report);
    }

    /// The reports in the order every output lists them: by image, then namespace.
    fn sort(&mut self) {
        self.reports
            .sort_by(|a, b| (&a.image, &a.namespace).cmp(&(&b.image, &b.namespace)));
    }

    /// Starts from a shard's earlier run: its kept reports count as found and finished.
    fn resume(&mut self, kept: Vec<ImageReport>) {
        self.found += kept.len();
        self.resumed
            .extend(kept.iter().map(|report| report.image.clone()));
        self.reports.extend(kept);
    }
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(dir) = &args.merge {
        return merged(&args, dir);
    }
    if let Some(name) = &args.job.job_name {
        print!("{}", job::manifests(&args, &args.job, name)?);
        return Ok(ExitCode::SUCCESS);
    }
    if args.registries.is_empty() && args.images_from.is_empty() && args.kubeconfig.is_none() {
        bail!(
            "nothing to audit: give --registry HOST, --images-from FILE and/or --kubeconfig FILE"
        );
    }
    let mut finished = Finished {
        shard: args.shard,
        ..Finished::default()
    };
    if let (Some(dir), Some(shard)) = (&args.shard_out, args.shard) {
        match Part::open(dir, shard)? {
            Opened::Complete(done) => {
                eprintln!(
                    "shard {} is complete in {} ({} reports); `ivory audit --merge {}` joins the parts",
                    done.shard,
                    dir.display(),
                    done.reports,
                    dir.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
            Opened::Resume { part, kept } => {
                if !kept.is_empty() {
                    eprintln!(
                        "shard {}: resuming, {} images finished by an earlier run",
                        shard.label(),
                        kept.len()
                    );
                }
                finished.part = Some(part);
                finished.resume(kept);
            }
        }
    }
    let policies = quick_policy::policies(&args.policies, &args.quick)?;
    let mut config = args.registry.config()?;
    config.page_size = args.page_size;
    let cache = match &args.cache_redis {
        Some(url) => {
            let l2 = wiring::connect_redis(
                url,
                &args.cache_redis_key,
                args.cache_redis_timeout,
                args.cache_redis_ca.as_deref(),
            )?;
            Some(l2 as Arc<dyn SharedCache>)
        }
        None => args.registry.cache.open(),
    };
    let verifier = wiring::verifier_for(
        config,
        args.registry.tag_cache_ttl,
        args.registry.access.signature_repository(),
        cache.clone(),
    )?;
    let registry = verifier.registry().clone();
    let checker = Arc::new(ImageChecker {
        verifier: Arc::new(verifier),
        policies,
        exceptions: None,
        resources: Arc::new(ivory_engine::resources::NoResources),
        timeout: args.timeout,
        namespace: args
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        namespace_object: None,
    });
    let mut progress = Progress::new(std::io::stderr().is_terminal());
    let interrupted = {
        let work = audit(
            &args,
            &registry,
            cache,
            &checker,
            &mut finished,
            &mut progress,
        );
        tokio::select! {
            result = work => {
                result?;
                false
            }
            _ = tokio::signal::ctrl_c() => true,
        }
    };
    progress.clear();
    let part = finished.part.take();
    finished.sort();
    print(&args, &finished, interrupted)?;
    if let (Some(part), Some(shard), false) = (part, args.shard, interrupted) {
        let completion = Completion {
            shard: shard.label(),
            found: finished.found,
            truncated: finished.truncated,
            reports: finished.reports.len(),
        };
        part.complete(&completion)?;
        return Ok(ExitCode::SUCCESS);
    }
    Ok(exit_status(&args, &finished.reports, interrupted))
}

/// `--merge DIR`: the joined report, printed as a single-process audit prints it.
fn merged(args: &Args, dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let (mut finished, per_shard) = merge::merge(dir)?;
    for (label, counts) in &per_shard {
        eprintln!(
            "shard {label}: {} images: {} pass, {} fail, {} error",
            counts.total(),
            counts.pass,
            counts.fail,
            counts.error
        );
    }
    finished.sort();
    print(args, &finished, false)?;
    Ok(exit_status(args, &finished.reports, false))
}

/// 130 interrupted, 0 with --exit-zero, 2 any error, 1 any failure, else 0.
fn exit_status(args: &Args, reports: &[ImageReport], interrupted: bool) -> ExitCode {
    let counts = Counts::of(reports);
    if interrupted {
        ExitCode::from(130)
    } else if args.exit_zero {
        ExitCode::SUCCESS
    } else if counts.error > 0 {
        ExitCode::from(2)
    } else if counts.fail > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

async fn audit(
    args: &Args,
    registry: &Registry,
    cache: Option<Arc<dyn SharedCache>>,
    checker: &Arc<ImageChecker>,
    finished: &mut Finished,
    progress: &mut Progress,
) -> anyhow::Result<()> {
    let mut queue = ImageQueue::new(args.concurrency, checker, finished, progress);
    for path in &args.images_from {
        for image in image_lines(&wiring::read_input(path, "--images-from")?) {
            queue.push(image).await?;
        }
    }
    let mut listed = 0;
    let mut hosts = args.registries.iter();
    for host in hosts.by_ref() {
        let policies = &checker.policies;
        if !list_registry(args, registry, policies, host, &mut queue, &mut listed).await? {
            queue.truncated();
            break;
        }
    }
    for host in hosts {
        queue.report(ImageReport::error(
            host,
            format!(
                "{host}: not listed: --max-images {} reached",
                args.max_images
            ),
        ));
    }
    queue.finish().await?;
    if let Some(path) = &args.kubeconfig {
        let cluster = ClusterAudit {
            kubeconfig: path.as_deref(),
            registry,
            cache,
        };
        audit_cluster(args, cluster, checker, finished, progress).await?;
    }
    Ok(())
}

/// Where a cluster audit reads from: the cluster, and the registry client and persistent cache
/// the verifiers for each set of pull secrets share.
struct ClusterAudit<'a> {
    kubeconfig: Option<&'a std::path::Path>,
    registry: &'a Registry,
    cache: Option<Arc<dyn SharedCache>>,
}

/// The images of the cluster's Pods, each group (namespace × pull secrets) evaluated in its
/// namespace with its credentials; the reports name the namespace.
async fn audit_cluster(
    args: &Args,
    ClusterAudit {
        kubeconfig,
        registry,
        cache,
    }: ClusterAudit<'_>,
    base: &ImageChecker,
    finished: &mut Finished,
    progress: &mut Progress,
) -> anyhow::Result<()> {
    let client = cluster::client(kubeconfig).await?;
    let groups =
        cluster::pod_groups(client.clone(), args.namespace.as_deref(), args.page_size).await?;
    let mut namespaces: HashMap<String, serde_json::Value> = HashMap::new();
    for group in groups {
        if !namespaces.contains_key(&group.namespace) {
            let object = cluster::namespace_object(&client, &group.namespace).await;
            namespaces.insert(group.namespace.clone(), object);
        }
        let verifier: Arc<dyn ImageVerifier> = if group.pull_secrets.is_empty() {
            base.verifier.clone()
        } else {
            let secrets =
                cluster::pull_secrets(&client, &group.namespace, &group.pull_secrets).await;
            let mut credentials = Credentials::anonymous();
            for (source, bytes) in secrets {
                match credentials.clone().with_docker_config_json(&source, &bytes) {
                    Ok(with) => credentials = with,
                    Err(e) => tracing::warn!(%source, error = %e, "image pull secret skipped"),
                }
            }
            Arc::new(wiring::verifier_with_credentials(
                registry.clone(),
                args.registry.tag_cache_ttl,
                args.registry.access.signature_repository(),
                credentials,
                cache.clone(),
            ))
        };
        let checker = Arc::new(ImageChecker {
            verifier,
            policies: base.policies.clone(),
            exceptions: base.exceptions.clone(),
            resources: base.resources.clone(),
            timeout: base.timeout,
            namespace: group.namespace.clone(),
            namespace_object: namespaces.get(&group.namespace).cloned(),
        });
        let before = finished.reports.len();
        let mut queue = ImageQueue::new(args.concurrency, &checker, finished, progress);
        for image in group.images {
            queue.push(image).await?;
        }
        queue.finish().await?;
        for report in &mut finished.reports[before..] {
            report.namespace = Some(group.namespace.clone());
        }
    }
    Ok(())
}

/// Image references of a list file: one per line, blank lines and `#` comments ignored.
fn image_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn print(args: &Args, finished: &Finished, interrupted: bool) -> anyhow::Result<()> {
    let reports = &finished.reports;
    let counts = Counts::of(reports);
    let summary = format!(
        "{} images ({} digests): {} pass, {} fail, {} error{}",
        counts.total(),
        finished.digests,
        counts.pass,
        counts.fail,
        counts.error,
        if interrupted {
            format!(" (interrupted; {} images found)", finished.found)
        } else {
            String::new()
        }
    ) + if finished.truncated {
        " (listing stopped at --max-images)"
    } else {
        ""
    };
    let text = match args.output {
        AuditFormat::Table => format!("{}{summary}\n", output::image_table(reports)),
        AuditFormat::Json | AuditFormat::Yaml => {
            let doc = json!({
                "summary": {
                    "images": counts.total(),
                    "digests": finished.digests,
                    "pass": counts.pass,
                    "fail": counts.fail,
                    "error": counts.error,
                    "found": finished.found,
                    "interrupted": interrupted,
                    "truncated": finished.truncated,
                },
                "images": reports.iter().map(output::image_json).collect::<Vec<_>>(),
            });
            output::render(&doc, args.output == AuditFormat::Yaml)?
        }
        AuditFormat::Sarif => output::render(&output::sarif(reports), false)?,
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    if let Some(path) = &args.policy_report {
        let now = ivory_clock::wall()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let now = (now.as_secs(), now.subsec_nanos());
        let yaml = if args.kubeconfig.is_some() {
            policy_reports(reports, now)
                .iter()
                .map(|doc| output::render(doc, true))
                .collect::<anyhow::Result<Vec<_>>>()?
                .join("---\n")
        } else {
            output::render(
                &output::cluster_policy_report(reports, "ivory-audit", now),
                true,
            )?
        };
        if path.as_os_str() == "-" {
            stdout.write_all(format!("---\n{yaml}").as_bytes())?;
        } else {
            super::files::write_replacing(path, yaml.as_bytes())
                .with_context(|| format!("writing --policy-report {}", path.display()))?;
        }
    }
    stdout.flush()?;
    if args.output != AuditFormat::Table {
        eprintln!("{summary}");
    }
    Ok(())
}

/// One namespaced PolicyReport per namespace running audited cluster images, then a
/// ClusterPolicyReport for the images of the other sources (when there are any).
fn policy_reports(reports: &[ImageReport], now: (u64, u32)) -> Vec<serde_json::Value> {
    let mut by_namespace: BTreeMap<&str, Vec<ImageReport>> = BTreeMap::new();
    let mut elsewhere = Vec::new();
    for r in reports {
        match &r.namespace {
            Some(ns) => by_namespace.entry(ns).or_default().push(r.clone()),
            None => elsewhere.push(r.clone()),
        }
    }
    let mut docs: Vec<_> = by_namespace
        .into_iter()
        .map(|(ns, reports)| {
            let mut doc = output::cluster_policy_report(&reports, "ivory-audit", now);
            doc["kind"] = json!("PolicyReport");
            doc["metadata"]["namespace"] = json!(ns);
            doc
        })
        .collect();
    if !elsewhere.is_empty() {
        docs.push(output::cluster_policy_report(
            &elsewhere,
            "ivory-audit",
            now,
        ));
    }
    docs
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn policy_reports_per_namespace() {
        let in_ns = |image: &str, ns: &str| ImageReport {
            namespace: Some(ns.to_owned()),
            ..ImageReport::error(image, "down".into())
        };
        let reports = [
            in_ns("r/a@sha256:aa", "n1"),
            in_ns("r/a@sha256:aa", "n2"),
            in_ns("r/b:1", "n2"),
            ImageReport::error("r/c:1", "down".into()),
        ];
        let docs = policy_reports(&reports, (1, 2));
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[0]["kind"], "PolicyReport");
        assert_eq!(docs[0]["metadata"]["namespace"], "n1");
        assert_eq!(docs[0]["results"].as_array().unwrap().len(), 1);
        assert_eq!(docs[1]["metadata"]["namespace"], "n2");
        assert_eq!(docs[1]["summary"]["error"], 2);
        assert_eq!(docs[2]["kind"], "ClusterPolicyReport");
        assert_eq!(docs[2]["results"][0]["properties"]["image"], "r/c:1");
    }

    #[test]
    fn image_lists_skip_comments() {
        assert_eq!(
            image_lines("# header\n\na:1  # trailing\n  b@sha256:00\n"),
            ["a:1", "b@sha256:00"]
        );
    }
}
