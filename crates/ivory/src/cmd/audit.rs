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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{IsTerminal as _, Write as _};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use ivory_engine::verifier::{ImageVerifier, VerifyError};
use ivory_policy::compiled::ImageMatcher;
use ivory_registry::{Credentials, Registry};
use ivory_verify::SharedCache;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::image_report::{self, Checker, ImageReport, QuickPolicy};
use super::output::{self, AuditFormat, Counts};
use super::wiring::{self, RegistryOpts, duration, positive};

mod cluster;

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
    #[arg(long = "policy", value_name = "FILE")]
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
    #[command(flatten)]
    registry: RegistryOpts,
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
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.registries.is_empty() && args.images_from.is_empty() && args.kubeconfig.is_none() {
        bail!(
            "nothing to audit: give --registry HOST, --images-from FILE and/or --kubeconfig FILE"
        );
    }
    let policies = image_report::policies(&args.policies, &args.quick)?;
    let mut config = args.registry.config()?;
    config.page_size = args.page_size;
    let cache = args.registry.cache.open();
    let verifier = wiring::verifier_for(
        config,
        args.registry.tag_cache_ttl,
        args.registry.access.signature_repository(),
        cache.clone(),
    )?;
    let registry = verifier.registry().clone();
    let checker = Arc::new(Checker {
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
    let mut finished = Finished::default();
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
    finished
        .reports
        .sort_by(|a, b| (&a.image, &a.namespace).cmp(&(&b.image, &b.namespace)));
    print(&args, &finished, interrupted)?;
    let counts = Counts::of(&finished.reports);
    Ok(if interrupted {
        ExitCode::from(130)
    } else if args.exit_zero {
        ExitCode::SUCCESS
    } else if counts.error > 0 {
        ExitCode::from(2)
    } else if counts.fail > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

async fn audit(
    args: &Args,
    registry: &Registry,
    cache: Option<Arc<dyn SharedCache>>,
    checker: &Arc<Checker>,
    finished: &mut Finished,
    progress: &mut Progress,
) -> anyhow::Result<()> {
    let mut pipeline = Pipeline::new(args.concurrency, checker, finished, progress);
    for path in &args.images_from {
        for image in image_lines(&wiring::read_input(path, "--images-from")?) {
            pipeline.push(image).await?;
        }
    }
    let mut listed = 0;
    let mut hosts = args.registries.iter();
    for host in hosts.by_ref() {
        let policies = &checker.policies;
        if !list_registry(args, registry, policies, host, &mut pipeline, &mut listed).await? {
            pipeline.finished.truncated = true;
            break;
        }
    }
    for host in hosts {
        pipeline.report(ImageReport::error(
            host,
            format!(
                "{host}: not listed: --max-images {} reached",
                args.max_images
            ),
        ));
    }
    pipeline.finish().await?;
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
    base: &Checker,
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
        let checker = Arc::new(Checker {
            verifier,
            policies: base.policies.clone(),
            exceptions: base.exceptions.clone(),
            resources: base.resources.clone(),
            timeout: base.timeout,
            namespace: group.namespace.clone(),
            namespace_object: namespaces.get(&group.namespace).cloned(),
        });
        let before = finished.reports.len();
        let mut pipeline = Pipeline::new(args.concurrency, &checker, finished, progress);
        for image in group.images {
            pipeline.push(image).await?;
        }
        pipeline.finish().await?;
        for report in &mut finished.reports[before..] {
            report.namespace = Some(group.namespace.clone());
        }
    }
    Ok(())
}

/// What one task finished.
enum Done {
    Resolved(String, Result<String, VerifyError>),
    Verified(String, ImageReport),
}

/// Images of one repository@digest waiting for (or given) its single verification.
struct Group {
    waiting: Vec<String>,
    report: Option<ImageReport>,
}

/// Resolves images as the sources find them and verifies each distinct repository@digest
/// once, as soon as its first tag is resolved (a hung lookup does not hold the others back):
/// `limit` tasks run at a time and a new image waits while `2 × limit` are queued, so a
/// listing's pages wait for room instead of piling up.
struct Pipeline<'a> {
    checker: Arc<Checker>,
    limit: usize,
    permits: Arc<Semaphore>,
    tasks: JoinSet<Done>,
    groups: HashMap<String, Group>,
    /// Images queued so far: each is audited once, however many sources name it.
    seen: HashSet<String>,
    finished: &'a mut Finished,
    progress: &'a mut Progress,
}

impl<'a> Pipeline<'a> {
    fn new(
        limit: NonZeroUsize,
        checker: &Arc<Checker>,
        finished: &'a mut Finished,
        progress: &'a mut Progress,
    ) -> Self {
        progress.start("verifying", 0);
        Self {
            checker: checker.clone(),
            limit: limit.get(),
            permits: Arc::new(Semaphore::new(limit.get())),
            tasks: JoinSet::new(),
            groups: HashMap::new(),
            seen: HashSet::new(),
            finished,
            progress,
        }
    }

    /// Queues `image` (waiting for room first); false when it was queued before.
    async fn push(&mut self, image: String) -> anyhow::Result<bool> {
        if !self.seen.insert(image.clone()) {
            return Ok(false);
        }
        self.finished.found += 1;
        self.progress.grow(1);
        while self.tasks.len() >= 2 * self.limit {
            self.join_one().await?;
        }
        let (checker, permits) = (self.checker.clone(), self.permits.clone());
        self.tasks.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let digest = checker.resolve(&image).await;
            Done::Resolved(image, digest)
        });
        Ok(true)
    }

    /// An entry for something that could not be listed.
    fn report(&mut self, report: ImageReport) {
        self.finished.found += 1;
        self.finished.reports.push(report);
        self.progress.grow(1);
        self.progress.inc(1);
    }

    /// Waits for every queued image.
    async fn finish(mut self) -> anyhow::Result<()> {
        while self.join_one().await? {}
        Ok(())
    }

    /// Takes one finished task's result; false when no task is left.
    async fn join_one(&mut self) -> anyhow::Result<bool> {
        let Some(joined) = self.tasks.join_next().await else {
            return Ok(false);
        };
        let finished = &mut *self.finished;
        match joined.context("audit task failed")? {
            Done::Resolved(image, Err(e)) => {
                finished.reports.push(ImageReport::unresolved(&image, &e));
                self.progress.inc(1);
            }
            Done::Resolved(image, Ok(digest)) => {
                let key = format!("{}@{digest}", repository(&image));
                if let Some(group) = self.groups.get_mut(&key) {
                    match &group.report {
                        Some(report) => {
                            finished.reports.push(ImageReport {
                                image,
                                ..report.clone()
                            });
                            self.progress.inc(1);
                        }
                        None => group.waiting.push(image),
                    }
                    return Ok(true);
                }
                self.groups.insert(
                    key.clone(),
                    Group {
                        waiting: vec![image.clone()],
                        report: None,
                    },
                );
                let (checker, permits) = (self.checker.clone(), self.permits.clone());
                self.tasks.spawn(async move {
                    let _permit = permits.acquire_owned().await;
                    Done::Verified(key, checker.check_digest(&image, &digest).await)
                });
            }
            Done::Verified(key, report) => {
                let Some(group) = self.groups.get_mut(&key) else {
                    return Ok(true);
                };
                let waiting = std::mem::take(&mut group.waiting);
                self.progress.inc(waiting.len());
                for image in waiting {
                    finished.reports.push(ImageReport {
                        image,
                        ..report.clone()
                    });
                }
                group.report = Some(report);
                finished.digests += 1;
            }
        }
        Ok(true)
    }
}

/// Queues `host/repo:tag` for every tag of every catalog repository matching `--repository`,
/// page by page. Repository names outside the grammar become one error entry for the
/// registry; a repository whose tags cannot be listed, or that lists tags outside the
/// grammar, one entry for it. False once `--max-images` images were listed: the listing
/// stopped (and says so in an entry).
async fn list_registry(
    args: &Args,
    registry: &Registry,
    policies: &[Arc<ivory_policy::CompiledPolicy>],
    host: &str,
    pipeline: &mut Pipeline<'_>,
    listed: &mut usize,
) -> anyhow::Result<bool> {
    // The listing may use plain HTTP or unverified TLS where a policy for this registry's
    // images allows it, as verifying them will: the catalog when such a policy may select an
    // image on this host, each repository's tags when it selects that repository.
    let insecure = policies
        .iter()
        .any(|p| p.allows_insecure_registry() && may_select_on_host(p, host));
    let creds = Credentials::anonymous().allow_insecure(insecure);
    let globs = args
        .repositories
        .iter()
        .map(|g| {
            ivory_policy::compile_image_glob(g)
                .map_err(|e| anyhow::anyhow!("--repository {g}: {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let failed = |e: ivory_registry::Error| {
        tracing::debug!(registry = host, error = %e, "catalog listing failed");
        anyhow::anyhow!("listing the catalog of registry {host}: {}", e.summary())
    };
    let mut catalog = registry.catalog_pages(host, &creds).map_err(failed)?;
    let mut invalid = 0;
    let mut more = true;
    while let Some(page) = catalog
        .next_page(ivory_clock::now() + args.timeout)
        .await
        .map_err(failed)?
    {
        invalid += page.invalid;
        for repo in page
            .names
            .iter()
            .filter(|r| globs.is_empty() || globs.iter().any(|g| g.is_match(r)))
        {
            more = list_repository(args, registry, policies, host, repo, pipeline, listed).await?;
            if !more {
                break;
            }
        }
        if !more {
            break;
        }
    }
    if invalid > 0 {
        pipeline.report(ImageReport::error(
            host,
            format!(
                "{host}: {invalid} repository names outside the OCI distribution grammar skipped"
            ),
        ));
    }
    if !more {
        pipeline.report(ImageReport::error(
            host,
            format!(
                "{host}: listing stopped at --max-images {}: the registry lists more images \
                 (raise --max-images to audit them)",
                args.max_images
            ),
        ));
    }
    Ok(more)
}

/// Queues the tags of `host/repo`, page by page; false when `--max-images` stopped it.
async fn list_repository(
    args: &Args,
    registry: &Registry,
    policies: &[Arc<ivory_policy::CompiledPolicy>],
    host: &str,
    repo: &str,
    pipeline: &mut Pipeline<'_>,
    listed: &mut usize,
) -> anyhow::Result<bool> {
    let reference = format!("{host}/{repo}");
    let repo_insecure = policies
        .iter()
        .any(|p| p.allows_insecure_registry() && selects_repository(p, &reference));
    let repo_creds = Credentials::anonymous().allow_insecure(repo_insecure);
    let failed = |e: ivory_registry::Error| {
        ImageReport::error(
            &reference,
            format!("{reference}: listing the tags: {}", e.summary()),
        )
    };
    let mut tags = match registry.tag_pages(&reference, &repo_creds) {
        Ok(tags) => tags,
        Err(e) => {
            pipeline.report(failed(e));
            return Ok(true);
        }
    };
    let mut invalid = 0;
    let mut more = true;
    'pages: loop {
        let page = match tags.next_page(ivory_clock::now() + args.timeout).await {
            Ok(Some(page)) => page,
            Ok(None) => break,
            Err(e) => {
                pipeline.report(failed(e));
                break;
            }
        };
        invalid += page.invalid;
        for tag in page.names.iter().filter(|t| !is_signature_tag(t)) {
            if *listed >= args.max_images {
                more = false;
                break 'pages;
            }
            if pipeline.push(format!("{reference}:{tag}")).await? {
                *listed += 1;
            }
        }
    }
    if invalid > 0 {
        pipeline.report(ImageReport::error(
            &reference,
            format!("{reference}: {invalid} tags outside the OCI distribution grammar skipped"),
        ));
    }
    Ok(more)
}

/// Whether the policy may select some image on `host`: a glob whose literal start (before its
/// first wildcard) is compatible with `host/`; an expression, or no matcher, may select any.
fn may_select_on_host(policy: &ivory_policy::CompiledPolicy, host: &str) -> bool {
    let prefix = format!("{host}/");
    policy.image_matchers.is_empty()
        || policy.image_matchers.iter().any(|m| match m {
            ImageMatcher::Glob { pattern, .. } => {
                let literal = pattern
                    .split(['*', '?', '[', '{'])
                    .next()
                    .unwrap_or_default();
                prefix.starts_with(literal) || literal.starts_with(&prefix)
            }
            ImageMatcher::Expression(_) => true,
        })
}

/// Whether the policy selects images of the repository `reference` (`host/repo`), with or
/// without a tag.
fn selects_repository(policy: &ivory_policy::CompiledPolicy, reference: &str) -> bool {
    [reference.to_owned(), format!("{reference}:latest")]
        .iter()
        .any(|image| ivory_engine::images::matches_image(policy, image).unwrap_or(false))
}

/// cosign's `sha256-<hex>.sig|.att|.sbom` tags and the OCI referrers fallback tag
/// `sha256-<hex>` hold signatures and attestations, not images to audit.
fn is_signature_tag(tag: &str) -> bool {
    let Some(rest) = tag.strip_prefix("sha256-") else {
        return false;
    };
    let hex = rest.split('.').next().unwrap_or(rest);
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Image references of a list file: one per line, blank lines and `#` comments ignored.
fn image_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The repository part of a reference (`host/repo:tag@sha256:…` → `host/repo`).
fn repository(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    match no_digest.rfind(':') {
        Some(i) if !no_digest[i..].contains('/') => &no_digest[..i],
        _ => no_digest,
    }
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
                "images": reports.iter().map(ImageReport::to_json).collect::<Vec<_>>(),
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

/// A one-line progress bar on stderr, only when stderr is a terminal.
struct Progress {
    enabled: bool,
    label: String,
    total: usize,
    done: usize,
}

impl Progress {
    fn new(enabled: bool) -> Self {
        Self {
            enabled,
            label: String::new(),
            total: 0,
            done: 0,
        }
    }

    fn start(&mut self, label: &str, total: usize) {
        self.label = label.to_owned();
        self.total = total;
        self.done = 0;
        self.draw();
    }

    /// More images to do (the sources are still being listed).
    fn grow(&mut self, n: usize) {
        self.total += n;
        self.draw();
    }

    fn inc(&mut self, n: usize) {
        self.done += n;
        self.draw();
    }

    fn draw(&self) {
        if self.enabled {
            eprint!("\r\x1b[2K{}", output::terminal(&self.line()));
        }
    }

    /// `verifying     [#######            ] 12/52`
    fn line(&self) -> String {
        const WIDTH: usize = 30;
        let filled = (self.done * WIDTH)
            .checked_div(self.total)
            .unwrap_or(WIDTH)
            .min(WIDTH);
        let bar = format!("{}{}", "#".repeat(filled), " ".repeat(WIDTH - filled));
        format!("{:<13} [{bar}] {}/{}", self.label, self.done, self.total)
    }

    fn clear(&self) {
        if self.enabled {
            eprint!("\r\x1b[2K");
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn repositories_of_references() {
        assert_eq!(repository("h:5000/a/b:v1"), "h:5000/a/b");
        assert_eq!(repository("h:5000/a/b"), "h:5000/a/b");
        assert_eq!(repository("h:5000/a/b:v1@sha256:aa"), "h:5000/a/b");
        assert_eq!(repository("h/a@sha256:aa"), "h/a");
    }

    #[test]
    fn progress_line() {
        let mut p = Progress::new(false);
        p.start("verifying", 4);
        p.inc(1);
        assert_eq!(
            p.line(),
            format!("verifying     [{}{}] 1/4", "#".repeat(7), " ".repeat(23))
        );
        p.start("listing tags", 0);
        assert_eq!(p.line(), format!("listing tags  [{}] 0/0", "#".repeat(30)));
    }

    #[test]
    fn signature_tags_are_not_images() {
        let hex = "0e1dfb0e6a9d8ade72c3c7e96a1a79378d7fadba2f48659904af92517bbca5aa";
        assert!(is_signature_tag(&format!("sha256-{hex}.sig")));
        assert!(is_signature_tag(&format!("sha256-{hex}.att")));
        assert!(is_signature_tag(&format!("sha256-{hex}")));
        assert!(!is_signature_tag("sha256-latest"));
        assert!(!is_signature_tag("v1"));
    }

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
