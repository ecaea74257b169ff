//! `ivory serve`: wires the registry client, the verifier, the policy source and the metrics
//! into `ivory-server` and runs it until SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use super::wiring::{self, duration};
use anyhow::{Context as _, bail};
use ivory_registry::Registry;
use ivory_server::{
    AppState, DEFAULT_BODY_LIMIT, FileSource, HttpLimits, Listen, Metrics, PolicyStore,
    ServeOptions,
};
use ivory_verify::{CosignVerifier, VerifierConfig};

mod kube_wiring;
mod l2_wiring;
mod supervise;
mod trust_wiring;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Policy file or folder (repeatable; reloaded on change; `--policy` is the same flag, as
    /// `ivory apply`, `verify` and `audit` name it). Without it the embedded default policy is
    /// served, which pins every Pod image to its digest.
    #[arg(long = "policies", visible_alias = "policy", value_name = "PATH")]
    policies: Vec<PathBuf>,
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9443")]
    listen: SocketAddr,
    /// PEM certificate chain (reloaded when the file changes).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key (reloaded when the file changes).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve plain HTTP. For local experiments only: the API server requires HTTPS.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    insecure_http: bool,
    /// Bind the listening socket in a small parent process that starts the serving process and
    /// starts it again at once when it dies (SIGKILL, OOM kill, crash), on the same socket:
    /// connections made meanwhile wait in its backlog instead of being refused. SIGTERM/SIGINT
    /// are passed on. The Helm chart and the kustomize base turn it on.
    #[arg(long)]
    supervise: bool,
    #[command(flatten)]
    registry: super::wiring::RegistryAccessOpts,
    #[command(flatten)]
    trust: trust_wiring::TrustOpts,
    /// Watch ImageValidatingPolicies, NamespacedImageValidatingPolicies, Namespaces and the
    /// registry Secrets of ivory's namespace through the Kubernetes API (KUBECONFIG or
    /// in-cluster config) instead of reading --policies.
    #[arg(long, conflicts_with = "policies")]
    kube: bool,
    /// ivory's namespace (where `credentials.secrets` live) with --kube, used when neither
    /// POD_NAMESPACE nor the service account's namespace file is present.
    #[arg(long, value_name = "NS", default_value = "ivory")]
    namespace: String,
    /// Without --kube: cluster objects (YAML/JSON files or folders, repeatable) the policies'
    /// `resource.Get`, `resource.List` and `globalContext.Get` read, loaded once at start.
    /// With --kube they come from watches of what the loaded policies read.
    #[arg(
        long = "cluster-resources",
        value_name = "FILE",
        conflicts_with = "kube"
    )]
    cluster_resources: Vec<PathBuf>,
    /// With --kube, most objects one watch of a resource the policies read may hold; past it
    /// the watch serves nothing (reads fail, the failurePolicy decides) and lists again later.
    #[arg(long, value_name = "N", default_value_t = ivory_server::cluster_resources::WatchLimits::default().max_objects)]
    resource_watch_max_objects: usize,
    /// With --kube, most bytes (objects' JSON without managedFields) one such watch may hold.
    #[arg(long, value_name = "BYTES", default_value_t = ivory_server::cluster_resources::WatchLimits::default().max_bytes)]
    resource_watch_max_bytes: usize,
    /// With --kube, most bytes all those watches may hold together; a watch whose growth would
    /// pass it serves nothing (as past its own bounds) and lists again later.
    #[arg(long, value_name = "BYTES", default_value_t = ivory_server::cluster_resources::WatchLimits::default().max_total_bytes)]
    resource_watch_max_total_bytes: usize,
    /// Largest accepted AdmissionReview body in bytes (larger bodies get 413).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_BODY_LIMIT)]
    body_limit: usize,
    /// Request-body bytes all requests together may hold at once; a body past it gets 503 (the
    /// API server applies the webhook's failurePolicy). Bounds the memory clients can pin
    /// before ivory judges anything: the per-request --body-limit alone does not.
    #[arg(long, value_name = "BYTES", default_value_t = HttpLimits::default().body_budget)]
    body_budget: usize,
    /// A request's whole body must arrive within this, or it gets 408 (Go duration).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    body_timeout: Duration,
    /// An HTTP/1.1 request's headers must arrive within this; it also closes HTTP/1.1
    /// keep-alive connections idle for as long (Go duration).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    header_timeout: Duration,
    /// A connection (HTTP/1.1 or HTTP/2) that moves no byte for this long while no request of
    /// it is in flight is closed; longer than the API server's own 90 s (Go duration).
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = duration)]
    idle_timeout: Duration,
    /// The TLS handshake must finish within this (Go duration).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    handshake_timeout: Duration,
    /// Connections open at once; one past it is closed as soon as it is accepted.
    #[arg(long, value_name = "N", default_value = "1024")]
    max_connections: std::num::NonZeroUsize,
    /// Header bytes all requests being judged may hold at once (as HTTP/2 counts a header
    /// list); a request past it gets 503. Bounds what stalled requests' headers can pin.
    #[arg(long, value_name = "BYTES", default_value_t = HttpLimits::default().header_budget)]
    header_budget: usize,
    /// Answer bytes not yet sent that all connections together may hold; an answer past it is
    /// replaced by a 503. Bounds what clients that never read their answers can pin.
    #[arg(long, value_name = "BYTES", default_value_t = HttpLimits::default().answer_budget)]
    answer_budget: usize,
    /// Answer bytes not yet sent that one connection may hold; an answer past it is replaced
    /// by a 503.
    #[arg(long, value_name = "BYTES", default_value_t = HttpLimits::default().answer_budget_per_connection)]
    answer_budget_per_connection: usize,
    /// A connection whose pending answers move no byte for this long (an HTTP/2 client that
    /// grants no window, an HTTP/1.1 client that reads nothing) is closed (Go duration).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    answer_timeout: Duration,
    /// Time in-flight requests get to finish after SIGTERM/SIGINT (Go duration).
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = duration)]
    grace_period: Duration,
    /// How often policy and certificate files are checked for changes (Go duration).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration)]
    reload_interval: Duration,
    /// How long a tag's resolved digest is reused by the mutating stage's pins and the
    /// verifications (Go duration; 0s disables the cache). Longer spares registries a herd of
    /// lookups for popular tags; shorter pins a moved tag's new digest sooner (until then the
    /// old digest is pinned). Never reused across credential sets.
    #[arg(long, value_name = "DURATION", default_value = super::wiring::TAG_CACHE_TTL, value_parser = duration)]
    tag_cache_ttl: Duration,
    /// Act on PolicyExceptions (policies.kyverno.io), as Kyverno's --enablePolicyException:
    /// those among the --policies files, or, with --kube, watched. Off by default: an
    /// exception is inert until this is given.
    #[arg(long)]
    enable_policy_exceptions: bool,
    /// Only PolicyExceptions in this namespace count (Kyverno's --exceptionNamespace; default:
    /// every namespace).
    #[arg(long, value_name = "NS", requires = "enable_policy_exceptions")]
    exception_namespace: Option<String>,
    /// With --kube, do not write PolicyReports/ClusterPolicyReports (wgpolicyk8s.io/v1alpha2);
    /// results are still logged (target ivory::audit) and counted.
    #[arg(long, requires = "kube")]
    disable_policy_reports: bool,
    /// With --kube, do not re-verify the images running Pods run (policies with
    /// evaluation.background.enabled, the default).
    #[arg(long, requires = "kube")]
    disable_background_scans: bool,
    /// Time between two background scans of the running Pods (Go duration; the first runs at
    /// start and warms the verdict cache).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = duration)]
    background_scan_interval: Duration,
    /// Pods a background scan judges at the same time (bounds the registry load).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    background_concurrency: u16,
    /// Redis (or Valkey, or any server speaking its protocol) URL of a cache shared by the
    /// replicas: `redis://[user:password@]host:port[/db]`, `rediss://…` for TLS. Verdicts,
    /// resolved tags and signature source hints found there skip the registry, and one replica
    /// at a time verifies an image the fleet has not seen. Never needed to answer: a slow or
    /// unavailable server only costs --cache-redis-timeout.
    #[arg(
        long,
        value_name = "URL",
        env = "IVORY_CACHE_REDIS",
        hide_env_values = true
    )]
    cache_redis: Option<String>,
    /// File holding the HMAC key every entry of the shared cache is sealed with (at least 32
    /// bytes, the same on every replica, e.g. from a Secret). Give it twice to rotate: the
    /// first seals, both are accepted.
    #[arg(long, value_name = "FILE", requires = "cache_redis")]
    cache_redis_key: Vec<PathBuf>,
    /// Longest one call to the shared cache may take (Go duration); a slower or failed call
    /// counts as a miss and the shared cache is skipped for a second.
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = duration)]
    cache_redis_timeout: Duration,
    /// PEM file of the CA(s) that issued the certificate of a `rediss://` --cache-redis server,
    /// trusted besides the system roots (a private CA).
    #[arg(long, value_name = "FILE", requires = "cache_redis")]
    cache_redis_ca: Option<PathBuf>,
}

/// Runs the webhook until a shutdown signal; `log` connects the serve log's writer (its count
/// of dropped lines for the metrics, and when admissions run, so that it batches only then).
pub(crate) async fn run(
    args: Args,
    log: Option<(ivory_server::LogDropsSource, ivory_server::ActivityHook)>,
) -> anyhow::Result<ExitCode> {
    let listen = listen_mode(&args)?;
    if args.supervise {
        return supervise::run(args.listen, supervise::serve_args()).await;
    }
    let inherited = supervise::inherited_listener()?;

    let kube_slot = Arc::new(std::sync::OnceLock::new());
    let registry = Registry::new(args.registry.config()?).context("creating registry client")?;
    let l2 = match &args.cache_redis {
        Some(url) => Some(wiring::connect_redis(
            url,
            &args.cache_redis_key,
            args.cache_redis_timeout,
            args.cache_redis_ca.as_deref(),
        )?),
        None => None,
    };
    let trust_roots = args.trust.roots(&registry)?;
    let tuf_sources = args.trust.attestor_sources(&registry);
    if let Some(period) = args.trust.refresh_period(args.reload_interval) {
        trust_roots.spawn_refresh(period);
    }
    let verifier = CosignVerifier::with_shared_cache(
        registry,
        VerifierConfig {
            tag_ttl: args.tag_cache_ttl,
            signature_repository: args.registry.signature_repository(),
            trust_roots: trust_roots.clone(),
            tuf_sources: Some(tuf_sources),
            ..VerifierConfig::default()
        },
        kube_wiring::credentials_resolver(kube_slot.clone()),
        l2.clone()
            .map(|l2| l2 as Arc<dyn ivory_verify::SharedCache>),
    );
    let mut metrics = Metrics::new();
    if let Some((drops, idle)) = log {
        metrics = metrics.with_log_drops(drops).with_activity_hook(idle);
    }
    if let Some(l2) = l2 {
        l2_wiring::warm_up(&l2).await;
        metrics = metrics.with_l2_stats(Arc::new(move || l2_wiring::counts(&l2)));
    }
    let metrics = metrics.with_trust_root_stats(trust_wiring::stats_source(&trust_roots));
    let metrics = Arc::new(with_verifier_stats(metrics, &verifier));
    let store = Arc::new(PolicyStore::default());
    let kube = if args.kube {
        let source = kube_wiring::start(&args.namespace, &store, &metrics).await?;
        if args.enable_policy_exceptions {
            source
                .watch_exceptions(
                    args.exception_namespace.as_deref(),
                    store.clone(),
                    metrics.clone(),
                )
                .await
                .context("starting the PolicyException watch")?;
        }
        Some(kube_slot.get_or_init(|| source).clone())
    } else {
        start_policy_source(&args, &store, &metrics).await?;
        None
    };

    let resources: Arc<dyn ivory_engine::resources::ResourceSource> =
        match kube.as_ref().and_then(|k| k.client()) {
            Some(client) => {
                let limits = ivory_server::cluster_resources::WatchLimits {
                    max_objects: args.resource_watch_max_objects,
                    max_bytes: args.resource_watch_max_bytes,
                    max_total_bytes: args.resource_watch_max_total_bytes,
                };
                let watches = ivory_server::cluster_resources::ResourceWatches::new(client, limits);
                watches.follow(store.clone());
                let stats = watches.clone();
                metrics.set_resource_watch_stats(Arc::new(move || stats.stats()));
                watches
            }
            None => super::wiring::load_cluster_resources(&args.cluster_resources)?,
        };
    let mut state = AppState::new(Arc::new(verifier), store, metrics);
    state.resources = resources;
    state.namespaces = kube.as_ref().map(|k| k.namespace_source());
    state.credentials = kube.as_ref().map(|k| k.credential_source());
    let limits = http_limits(&args)?;
    state = state.with_limits(limits.clone());
    start_cluster_work(&mut state, &args, kube.as_ref().and_then(|k| k.client()));
    let opts = ServeOptions {
        addr: args.listen,
        inherited,
        listen,
        grace: args.grace_period,
        cert_poll: args.reload_interval,
        limits,
        metrics: state.metrics.clone(),
    };
    ivory_server::serve(
        ivory_server::router(state),
        opts,
        ivory_server::shutdown_signal(),
    )
    .await?;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Where and how to listen: TLS with the given pair, or plain HTTP when asked for (with a
/// warning, except in the supervising parent).
fn listen_mode(args: &Args) -> anyhow::Result<Listen> {
    Ok(match (&args.tls_cert, &args.tls_key, args.insecure_http) {
        (Some(cert), Some(key), false) => Listen::Tls {
            cert: cert.clone(),
            key: key.clone(),
        },
        (None, None, true) if args.supervise => Listen::Insecure,
        (None, None, true) => {
            warn_insecure();
            Listen::Insecure
        }
        _ => bail!("either --tls-cert FILE --tls-key FILE or --insecure-http is required"),
    })
}

/// `metrics` with the verifier's counters (registry calls, caches, CRLs) read at every scrape.
fn with_verifier_stats(metrics: Metrics, verifier: &CosignVerifier) -> Metrics {
    let (stats_source, cache_source, revocation_source) =
        (verifier.clone(), verifier.clone(), verifier.clone());
    metrics
        .with_registry_stats(Arc::new(move || stats_source.registry().stats()))
        .with_cache_stats(Arc::new(move || {
            cache_source
                .cache_stats()
                .into_iter()
                .map(|c| ivory_server::CacheCounts {
                    cache: c.cache.to_owned(),
                    hits: c.hits,
                    negative_hits: c.negative_hits,
                    misses: c.misses,
                    coalesced: c.coalesced,
                })
                .collect()
        }))
        .with_revocation_stats(Arc::new(move || {
            let stats = revocation_source.revocation_stats();
            ivory_server::RevocationCounts {
                crls: stats
                    .crls
                    .into_iter()
                    .map(|c| ivory_server::CrlCount {
                        url: c.url,
                        age_seconds: c.age_seconds,
                        next_update_in_seconds: c.next_update_in_seconds,
                    })
                    .collect(),
                fetched: stats.fetched,
                failed: stats.failed,
            }
        }))
}

/// The webhook port's bounds from the flags, refused when they contradict each other.
fn http_limits(args: &Args) -> anyhow::Result<HttpLimits> {
    anyhow::ensure!(
        args.body_budget >= args.body_limit,
        "--body-budget ({}) must be at least --body-limit ({}): no body of the largest size could be read",
        args.body_budget,
        args.body_limit
    );
    anyhow::ensure!(
        !args.answer_timeout.is_zero(),
        "--answer-timeout must be longer than 0s: every answer would close its connection"
    );
    Ok(HttpLimits {
        body_limit: args.body_limit,
        body_budget: args.body_budget,
        body_timeout: args.body_timeout,
        header_timeout: args.header_timeout,
        idle_timeout: args.idle_timeout,
        handshake_timeout: args.handshake_timeout,
        max_connections: args.max_connections.get(),
        header_budget: args.header_budget,
        answer_budget: args.answer_budget,
        answer_budget_per_connection: args.answer_budget_per_connection,
        answer_timeout: args.answer_timeout,
    })
}

/// With a cluster client: PolicyReports, the PolicyException settings and background scans,
/// as the flags ask (the exceptions are set before the background scan takes the state).
fn start_cluster_work(state: &mut AppState, args: &Args, client: Option<kube::Client>) {
    if !args.disable_policy_reports
        && let Some(client) = client.clone()
    {
        state.reports = Some(ivory_server::reports::KubeReports::start(
            client,
            state.metrics.clone(),
        ));
    }
    state.exceptions = args
        .enable_policy_exceptions
        .then(|| ivory_server::ExceptionSettings {
            namespace: args.exception_namespace.clone(),
        });
    if !args.disable_background_scans
        && let Some(client) = client
    {
        ivory_server::background::start(
            client,
            state.clone(),
            ivory_server::background::BackgroundSettings {
                interval: args.background_scan_interval,
                concurrency: usize::from(args.background_concurrency),
                ..Default::default()
            },
        );
    }
}

/// Loads the policies once (the server is not ready until a clean load), then keeps watching.
async fn start_policy_source(
    args: &Args,
    store: &Arc<PolicyStore>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<()> {
    if args.policies.is_empty() {
        store.replace(vec![ivory_policy::default_policy()]);
        metrics.policies_loaded(1);
        tracing::info!("serving the embedded default policy (pin every Pod image to its digest)");
        return Ok(());
    }
    let source = FileSource {
        paths: args.policies.clone(),
    };
    // Files being written when ivory starts are waited for like a reload would.
    let initial = source.read_settled(args.reload_interval).await;
    let (s, m, files) = (store.clone(), metrics.clone(), initial.clone());
    tokio::task::spawn_blocking(move || FileSource::apply(&files, &s, &m))
        .await
        .context("loading policies")?;
    tokio::spawn(source.watch(
        store.clone(),
        metrics.clone(),
        args.reload_interval,
        initial,
    ));
    Ok(())
}

fn warn_insecure() {
    let text = "--insecure-http: serving admission reviews over PLAIN HTTP. The Kubernetes API \
                server only calls HTTPS webhooks; use this for local experiments only";
    eprintln!("WARNING: {text}");
    tracing::warn!("{text}");
}
