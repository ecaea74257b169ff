//! `ivory-bench peers` (`scripts/bench.sh --peers`): Kyverno's admission controller side by side
//! with ivory, on the same registry, images, policies and AdmissionReviews.
//!
//! Kyverno (built by `scripts/bench/build-kyverno.sh`) runs out of cluster against the e2e
//! kube-apiserver (`scripts/e2e/cluster.sh start DIR`): this module installs Kyverno's CRDs, its
//! namespace and ConfigMaps and the three ImageValidatingPolicies ivory serves from files, starts
//! `kyverno --kubeconfig … --serverIP 127.0.0.1:PORT`, and posts AdmissionReviews straight to its
//! HTTPS server (`/ivpol/mutate/…`, `/ivpol/validate/…`, the paths its webhook configurations
//! use). Figures go into `target/bench/results.json` (keys `kyverno_*`, details under
//! `details.peers`). See BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use axum::body::Bytes;
use base64::Engine as _;
use serde_json::{Value, json};

use crate::LoadArgs;
use crate::curves;
use crate::loadgen::{self, Target, post, round};
use crate::phases::{self, HUNG_CONCURRENCY, mib, warm_images};
use crate::procs::{Server, free_port};
use crate::report;
use crate::sign::Image;
use crate::stack::Stack;
use ivory_bench::review::pod_review;

/// The Kyverno release `scripts/bench/build-kyverno.sh` builds.
const KYVERNO_VERSION: &str = "v1.19.1";
/// Kyverno's namespace (`KYVERNO_NAMESPACE`) and the Secrets its certificate controller writes.
const NAMESPACE: &str = "kyverno";
const CA_SECRET: &str = "kyverno-svc.kyverno.svc.kyverno-tls-ca";
const TLS_SECRET: &str = "kyverno-svc.kyverno.svc.kyverno-tls-pair";
/// Concurrent admissions of one never-seen image in the herd phase.
const HERD: usize = 32;
/// Images of the containers-per-Pod curve (its largest Pod), taken from the cached-phase images.
const CURVE_IMAGES: usize = 100;
/// Kyverno's start-up (CRD discovery, informers, leader election, its own CA and certificate).
const KYVERNO_READY_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the policies get to show up in Kyverno's engine after it is ready.
const POLICY_LOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// Every policy, as in the load harness.
const POLICIES: &str = "bench/fixture/hung";
/// The generic entries of the Helm chart's `config.resourceFilters` (the chart's remaining
/// entries name Kyverno's own objects).
const RESOURCE_FILTERS: &str = "[Event,*,*] [*/*,kube-system,*] [*/*,kube-public,*] \
    [*/*,kube-node-lease,*] [Node,*,*] [Node/?*,*,*] [APIService,*,*] [APIService/?*,*,*] \
    [TokenReview,*,*] [SubjectAccessReview,*,*] [SelfSubjectAccessReview,*,*] [Binding,*,*] \
    [Pod/binding,*,*] [ReplicaSet,*,*] [ReplicaSet/?*,*,*] [EphemeralReport,*,*] \
    [ClusterEphemeralReport,*,*]";

/// The chart's `config.webhooks` with `excludeKyvernoNamespace: true`.
const WEBHOOKS: &str = r#"{"namespaceSelector": {"matchExpressions": [{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["kyverno"]}]}}"#;

/// Settings of `ivory-bench peers`.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct PeersArgs {
    /// The load harness's settings (`--quick`, binaries, fixtures, output folder, …).
    #[command(flatten)]
    pub load: LoadArgs,
    /// Folder of a cluster started by `scripts/e2e/cluster.sh start DIR` (its `kubeconfig`,
    /// `pki/` and `apiserver.port`).
    #[arg(long)]
    pub cluster: PathBuf,
    /// Kyverno's admission controller (`cmd/kyverno`), built by scripts/bench/build-kyverno.sh.
    #[arg(long)]
    pub kyverno: PathBuf,
    /// Kyverno's CRDs: `config/crds` of the Kyverno module source.
    #[arg(long)]
    pub kyverno_crds: PathBuf,
}

/// Sizes of one side-by-side run.
struct Plan {
    concurrencies: Vec<usize>,
    step: Duration,
    cached: usize,
    hung: usize,
}

impl Plan {
    fn new(args: &LoadArgs) -> Self {
        if args.quick {
            Self {
                concurrencies: vec![8, 32],
                step: Duration::from_secs(3),
                cached: args.cached_images.unwrap_or(600),
                hung: 64,
            }
        } else {
            Self {
                concurrencies: vec![1, 8, 32, 64],
                step: Duration::from_secs(10),
                cached: args.cached_images.unwrap_or(3_000),
                hung: 256,
            }
        }
    }
}

/// What one webhook measured in the phases both run.
struct Side {
    cold_tag: usize,
    cold_digest: usize,
    herd_sets: f64,
    warm_max_rps: f64,
    late: usize,
    detail: serde_json::Map<String, Value>,
}

/// Runs both webhooks through the same phases and merges the `kyverno_*` figures into
/// `results.json`.
pub(crate) async fn run(args: PeersArgs) -> Result<()> {
    let started = ivory_clock::now();
    let plan = Plan::new(&args.load);
    let machine = report::machine();
    let kube = Kube::open(&args.cluster)?;
    let stack = Stack::build(args.load.clone(), plan.cached, 0).await?;
    eprintln!("peers: installing Kyverno's CRDs, namespace, ConfigMaps and the policies…");
    prepare_cluster(&kube, &args.kyverno_crds, &stack.work.join("policies")).await?;

    eprintln!("peers: starting Kyverno {KYVERNO_VERSION} out of cluster…");
    let kyverno_started = ivory_clock::now();
    let (kyverno, kyverno_client, kyverno_flags) = start_kyverno(&args, &stack, &kube).await?;
    let ready_s = kyverno_started.elapsed().as_secs_f64();
    wait_for_policies(&stack, &kyverno_client, &kyverno.url).await?;
    let (_, kyverno_idle) = kyverno.memory_kib()?;

    eprintln!("peers: ivory (cold, herd, warm, hung)…");
    let ivory = stack.start_ivory("peers-ivory").await?;
    let ivory_side = side(&stack, &stack.client, &ivory.url, &plan).await?;
    let (ivory_hwm, _) = ivory.memory_kib()?;
    drop(ivory);

    eprintln!("peers: Kyverno (cold, herd, warm, hung)…");
    let kyverno_side = side(&stack, &kyverno_client, &kyverno.url, &plan).await?;

    eprintln!("peers: containers per Pod, Kyverno then ivory…");
    let step = curves::warm_step(stack.args.quick);
    let curve_images = &stack.images.cached[..CURVE_IMAGES.min(stack.images.cached.len())];
    let kyverno_containers =
        curves::containers_points(&kyverno, &kyverno_client, curve_images, step).await?;
    let ivory = stack.start_ivory("peers-ivory-containers").await?;
    let ivory_containers =
        curves::containers_points(&ivory, &stack.client, curve_images, step).await?;
    drop(ivory);

    eprintln!(
        "peers: Kyverno verifies {} distinct images…",
        stack.images.cached.len()
    );
    let kyverno_cached = fill_cache(&kyverno_client, &kyverno.url, &stack.images.cached).await;
    let (kyverno_hwm, kyverno_rss) = kyverno.memory_kib()?;
    let kyverno_log = stack.work.join("kyverno.log");
    drop(kyverno);

    eprintln!("peers: a fresh ivory verifies the same images…");
    let (ivory_cached_rss, ivory_cached) = phases::cached_rss(&stack).await?;

    ensure!(
        ivory_side.warm_max_rps > 0.0 && kyverno_side.warm_max_rps > 0.0,
        "no successful warm requests (Kyverno's log: {})",
        kyverno_log.display()
    );
    let figures = json!({
        "kyverno_warm_rps_ratio": round(ivory_side.warm_max_rps / kyverno_side.warm_max_rps, 2),
        "kyverno_cold_requests_per_tag_image": kyverno_side.cold_tag,
        "kyverno_herd_request_sets_32": round(kyverno_side.herd_sets, 2),
        "kyverno_late_responses_hung_registry": kyverno_side.late,
        "kyverno_rss_mib": mib(kyverno_hwm),
    });
    let mut figures = figures;
    for (side, points) in [
        ("kyverno", &kyverno_containers),
        ("ivory", &ivory_containers),
    ] {
        for point in points.as_array().into_iter().flatten() {
            let n = &point["containers"];
            for field in ["p50_ms", "cpu_us_per_admission"] {
                figures[format!("curve_{side}_containers_{n}_{field}")] = point[field].clone();
            }
        }
    }
    let details = json!({
        "quick": stack.args.quick,
        "kyverno_version": KYVERNO_VERSION,
        "kyverno_binary": args.kyverno.display().to_string(),
        "kyverno_flags": kyverno_flags,
        "kyverno_ready_s": round(ready_s, 1),
        "kyverno_rss_mib_idle_after_start": mib(kyverno_idle),
        "kyverno_rss_mib_at_end": mib(kyverno_rss),
        "kyverno_cold_requests_per_digest_image": kyverno_side.cold_digest,
        "kyverno_cached": kyverno_cached,
        "containers_per_pod": {"kyverno": kyverno_containers, "ivory": ivory_containers},
        "kyverno": Value::Object(kyverno_side.detail),
        "ivory": Value::Object(ivory_side.detail),
        "ivory_cold_requests_per_tag_image": ivory_side.cold_tag,
        "ivory_cold_requests_per_digest_image": ivory_side.cold_digest,
        "ivory_herd_request_sets_32": round(ivory_side.herd_sets, 2),
        "ivory_late_responses_hung_registry": ivory_side.late,
        "ivory_peak_rss_mib_same_phases": mib(ivory_hwm),
        "ivory_cached": ivory_cached,
        "ivory_rss_mib_same_images": round(ivory_cached_rss, 1),
        "machine_at_start": machine,
        "machine_at_end": report::machine(),
        "wall_s": round(started.elapsed().as_secs_f64(), 1),
    });
    report::merge(&stack.args.out, "peers", figures, details)
}

/// Cold, herd, warm throughput and hung registry against one webhook at `base`.
async fn side(stack: &Stack, client: &reqwest::Client, base: &str, plan: &Plan) -> Result<Side> {
    let mut detail = serde_json::Map::new();
    let (cold_tag, cold_digest, cold) = phases::cold(stack, client, base).await?;
    detail.insert("cold".into(), cold);
    let (herd_sets, herd) = phases::herd(stack, client, base, cold_tag, HERD).await?;
    detail.insert("herd".into(), herd);

    let body = Bytes::from(pod_review("warm", &single_policy_images(stack)));
    let target = Target {
        client: client.clone(),
        url: format!("{base}/ivpol/validate/{POLICIES}"),
        body: body.clone(),
    };
    let first = post(client, &target.url, body).await?;
    ensure!(first.allowed(), "warm Pod not admitted: {}", first.body);
    stack.registry.reset_requests();
    let steps = phases::sweep_at(&target, &plan.concurrencies, plan.step).await;
    let warm_registry_requests = stack.registry.requests().len();
    let served: u64 = steps.iter().map(|(_, s)| s.ok).sum();
    let warm_max_rps = phases::max_rps(&steps);
    detail.insert(
        "warm".into(),
        json!({
            "steps": phases::steps_json(&steps),
            "max_rps": round(warm_max_rps, 1),
            "registry_requests_during_steps": warm_registry_requests,
            "admissions_during_steps": served,
        }),
    );

    // Pool the hung phase's connections first, as the load harness does.
    loadgen::closed_loop(&target, HUNG_CONCURRENCY, Duration::from_secs(1)).await;
    let (late, hung) = phases::hung(stack, client, base, plan.hung).await?;
    detail.insert("hung".into(), hung);
    detail.insert(
        "load_harness_warm_pod".into(),
        load_harness_warm_pod(stack, client, base).await,
    );
    Ok(Side {
        cold_tag,
        cold_digest,
        herd_sets,
        warm_max_rps,
        late,
        detail,
    })
}

/// The warm Pod of this run: three containers, as the load harness's, but all three images
/// under `bench/*`, so one policy matches them all. Kyverno v1.19.1 cannot answer the load
/// harness's warm Pod (see [`load_harness_warm_pod`]).
fn single_policy_images(stack: &Stack) -> Vec<String> {
    let mut images: Vec<String> = stack.images.warm.iter().map(Image::pinned_ref).collect();
    images.push(stack.images.herd.pinned_ref());
    images
}

/// Attempts at the load harness's warm Pod, each given [`TWO_POLICY_WAIT`].
const TWO_POLICY_ATTEMPTS: usize = 10;
/// How long one attempt at the load harness's warm Pod may take before it counts as hung.
const TWO_POLICY_WAIT: Duration = Duration::from_secs(3);

/// Sequential validating admissions of the load harness's warm Pod (the fixture under
/// `ivory/*` and two images under `bench/*`: two policies match). Kyverno v1.19.1 answers some
/// and never answers others: its per-request image context (`kyverno/sdk`
/// `imagedataloader.imageContext.Get`) returns a cached image without releasing its read lock,
/// so a later fetch in the same request waits for the write lock forever; whether a request
/// meets that order depends on the order its policies are evaluated in (see BENCHMARKS.md).
async fn load_harness_warm_pod(stack: &Stack, client: &reqwest::Client, base: &str) -> Value {
    let url = phases::url(base, "validate");
    let (mut allowed, mut hung, mut other) = (0, 0, Vec::new());
    for i in 0..TWO_POLICY_ATTEMPTS {
        let body = Bytes::from(pod_review(
            &format!("warm-two-policies-{i}"),
            &warm_images(stack),
        ));
        match tokio::time::timeout(TWO_POLICY_WAIT, post(client, &url, body)).await {
            Err(_) => hung += 1,
            Ok(Ok(a)) if a.allowed() => allowed += 1,
            Ok(Ok(a)) => other.push(json!({"status": a.status, "body": a.body})),
            Ok(Err(e)) => other.push(json!(format!("{e:#}"))),
        }
    }
    json!({
        "attempts": TWO_POLICY_ATTEMPTS, "wait_ms": TWO_POLICY_WAIT.as_millis() as u64,
        "allowed": allowed, "no_answer_within_wait": hung, "other": other,
    })
}

/// Validates every image once (three per Pod, 8 Pods in flight), as the load harness's
/// cache-memory phase does for ivory. Failures are counted, not fatal: the figure is memory.
async fn fill_cache(client: &reqwest::Client, base: &str, images: &[Image]) -> Value {
    let started = ivory_clock::now();
    let validate = phases::url(base, "validate");
    let answers = phases::admit_in_pods(client, &validate, images, "cache").await;
    let allowed = answers.iter().filter(|a| matches!(a, Ok(true))).count();
    let elapsed = started.elapsed().as_secs_f64();
    json!({
        "images": images.len(), "pods": answers.len(), "pods_admitted": allowed,
        "seconds": round(elapsed, 1),
        "verifications_per_s": round(images.len() as f64 / elapsed.max(1e-9), 1),
    })
}

/// Kyverno's CRDs, namespaces `kyverno` and `shop` (the review's), the ConfigMaps Kyverno reads
/// and the ImageValidatingPolicies of `policies` (the files `ivory serve` reads).
async fn prepare_cluster(kube: &Kube, crds: &Path, policies: &Path) -> Result<()> {
    install_kyverno(kube, crds).await?;
    let mut docs = Vec::new();
    yaml_files(policies, &mut docs)?;
    for file in &docs {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        kube.create(
            "/apis/policies.kyverno.io/v1/imagevalidatingpolicies",
            "application/yaml",
            text,
        )
        .await
        .with_context(|| format!("creating the policy of {}", file.display()))?;
    }
    Ok(())
}

/// Kyverno's CRDs (every file under `crds`), namespaces `kyverno` and `shop` (the reviews'), and
/// the ConfigMaps Kyverno reads at start-up (the Helm chart's defaults).
pub(crate) async fn install_kyverno(kube: &Kube, crds: &Path) -> Result<()> {
    let mut files = Vec::new();
    yaml_files(crds, &mut files)?;
    ensure!(!files.is_empty(), "no CRD files under {}", crds.display());
    let mut names = Vec::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let doc = text.strip_prefix("---\n").unwrap_or(&text).to_owned();
        kube.create(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            "application/yaml",
            doc,
        )
        .await
        .with_context(|| format!("creating the CRD of {}", file.display()))?;
        names.push(crd_name(file)?);
    }
    for name in &names {
        kube.wait_established(name).await?;
    }
    for ns in [NAMESPACE, "shop"] {
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        kube.create("/api/v1/namespaces", "application/json", body.to_string())
            .await?;
    }
    let configmaps = [
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kyverno", "namespace": NAMESPACE},
            // The Helm chart's defaults.
            "data": {
                "enableDefaultRegistryMutation": "true",
                "defaultRegistry": "docker.io",
                "generateSuccessEvents": "false",
                "excludeGroups": "system:nodes",
                "resourceFilters": RESOURCE_FILTERS,
                // The chart's `excludeKyvernoNamespace`: without it the webhooks Kyverno
                // registers intercept the creation of its own TLS Secret and its lease updates
                // before it has a certificate, and it never gets one.
                "webhooks": WEBHOOKS,
            },
        }),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kyverno-metrics", "namespace": NAMESPACE},
            "data": {"namespaces": "{\"include\": [], \"exclude\": []}"},
        }),
    ];
    for cm in configmaps {
        kube.create(
            &format!("/api/v1/namespaces/{NAMESPACE}/configmaps"),
            "application/json",
            cm.to_string(),
        )
        .await?;
    }
    Ok(())
}

/// `*.yaml` files under `dir`, recursively, sorted.
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            yaml_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
    Ok(())
}

/// `policies.kyverno.io_imagevalidatingpolicies.yaml` → `imagevalidatingpolicies.policies.kyverno.io`
/// (controller-gen's file naming: `<group>_<plural>.yaml`).
fn crd_name(file: &Path) -> Result<String> {
    let stem = file
        .file_stem()
        .and_then(|s| s.to_str())
        .with_context(|| format!("{}: no file name", file.display()))?;
    let (group, plural) = stem
        .split_once('_')
        .with_context(|| format!("{}: not named <group>_<plural>.yaml", file.display()))?;
    Ok(format!("{plural}.{group}"))
}

/// Starts Kyverno, waits for its readiness endpoint, and returns it with a client that trusts
/// the CA it generated (read from its Secret) and the flags it was started with.
async fn start_kyverno(
    args: &PeersArgs,
    stack: &Stack,
    kube: &Kube,
) -> Result<(Server, reqwest::Client, Vec<String>)> {
    let paths = KyvernoPaths {
        binary: &args.kyverno,
        cluster: &args.cluster,
        registry_ca: &stack.registry_ca,
        work: &stack.work,
    };
    start_kyverno_with(&paths, kube).await
}

/// Where Kyverno's binary, the cluster, the registry CA and the log folder are.
pub(crate) struct KyvernoPaths<'a> {
    /// `cmd/kyverno`, built by scripts/bench/build-kyverno.sh.
    pub binary: &'a Path,
    /// The folder of `scripts/e2e/cluster.sh start DIR`.
    pub cluster: &'a Path,
    /// The registry's CA (Go reads it through `SSL_CERT_FILE`).
    pub registry_ca: &'a Path,
    /// Where `kyverno.log` goes.
    pub work: &'a Path,
}

/// [`start_kyverno`] for any caller: the side-by-side proof of `ivory convert` uses it too.
pub(crate) async fn start_kyverno_with(
    paths: &KyvernoPaths<'_>,
    kube: &Kube,
) -> Result<(Server, reqwest::Client, Vec<String>)> {
    let port = free_port()?;
    let metrics_port = free_port()?;
    let flags = vec![
        format!(
            "--kubeconfig={}",
            paths.cluster.join("kubeconfig").display()
        ),
        format!("--serverIP=127.0.0.1:{port}"),
        "--webhookServerHost=127.0.0.1".to_owned(),
        format!("--webhookServerPort={port}"),
        format!("--servicePort={port}"),
        format!("--caSecretName={CA_SECRET}"),
        format!("--tlsSecretName={TLS_SECRET}"),
        // No admission reports: ivory writes none, and the API server and etcd would compete
        // with the webhooks for the same two cores.
        "--admissionReports=false".to_owned(),
        // The Helm chart's defaults. `--autoUpdateWebhooks` stays on (the default): with it
        // off Kyverno registers catch-all `*/*` webhooks (failurePolicy Fail) without the
        // namespace exclusion, which then block the creation of its own TLS Secret.
        "--omitEvents=PolicyApplied,PolicySkipped".to_owned(),
        "--loggingFormat=text".to_owned(),
        "--disableLogColor".to_owned(),
        "--v=2".to_owned(),
        "--metricsHost=127.0.0.1".to_owned(),
        format!("--metricsPort={metrics_port}"),
        "--controllerRuntimeMetricsAddress=0".to_owned(),
    ];
    let mut cmd = Command::new(paths.binary);
    cmd.args(&flags)
        .env("KYVERNO_NAMESPACE", NAMESPACE)
        .env("KYVERNO_SERVICEACCOUNT_NAME", "kyverno")
        .env("KYVERNO_DEPLOYMENT", "kyverno")
        .env("KYVERNO_POD_NAME", "kyverno-bench")
        .env("KYVERNO_SVC", "kyverno-svc")
        .env("INIT_CONFIG", "kyverno")
        .env("METRICS_CONFIG", "kyverno-metrics")
        // Go's crypto/x509 reads the roots from this file on Linux: the registry's CA.
        .env("SSL_CERT_FILE", paths.registry_ca);
    // Only for the readiness poll: Kyverno's CA exists once it has started.
    let insecure = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(5))
        .build()
        .context("building the readiness client")?;
    let log = paths.work.join("kyverno.log");
    let url = format!("https://127.0.0.1:{port}");
    let server = Server::start_within(
        "kyverno",
        cmd,
        &log,
        url,
        "/health/readiness",
        &insecure,
        KYVERNO_READY_TIMEOUT,
    )
    .await?;
    let secret = kube
        .get(&format!(
            "/api/v1/namespaces/{NAMESPACE}/secrets/{CA_SECRET}"
        ))
        .await?
        .with_context(|| format!("Secret {CA_SECRET} missing after Kyverno started"))?;
    let ca_b64 = secret["data"]["tls.crt"]
        .as_str()
        .or_else(|| secret["data"]["rootCA.crt"].as_str())
        .with_context(|| format!("Secret {CA_SECRET} has no tls.crt"))?;
    let ca = base64::engine::general_purpose::STANDARD
        .decode(ca_b64)
        .context("decoding Kyverno's CA")?;
    let ca_pem = String::from_utf8(ca).context("Kyverno's CA is not PEM")?;
    let client = loadgen::client(&ca_pem, 256)?;
    Ok((server, client, flags))
}

/// Waits until Kyverno denies an unsigned image under each of the `fixture` and `bench` globs:
/// before its engine holds the policies, nothing matches and everything is allowed.
async fn wait_for_policies(stack: &Stack, client: &reqwest::Client, base: &str) -> Result<()> {
    let host = stack.registry.host();
    let zero = format!("sha256:{}", "0".repeat(64));
    let url = phases::url(base, "validate");
    let started = ivory_clock::now();
    for repo in ["ivory/unsigned", "bench/unsigned"] {
        let image = format!("{host}/{repo}@{zero}");
        loop {
            let body = Bytes::from(pod_review("policy-probe", std::slice::from_ref(&image)));
            let answer = post(client, &url, body).await?;
            if answer.status == 200 && !answer.allowed() {
                break;
            }
            if started.elapsed() > POLICY_LOAD_TIMEOUT {
                bail!(
                    "Kyverno still admits the unsigned {image} after {POLICY_LOAD_TIMEOUT:?}: \
                     its engine has not loaded the policies ({})",
                    answer.body
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// The e2e kube-apiserver as the admin of `cluster.sh` (client certificate, system:masters).
pub(crate) struct Kube {
    base: String,
    client: reqwest::Client,
}

impl Kube {
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        let read = |name: &str| -> Result<String> {
            let path = dir.join(name);
            std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "reading {} (start the cluster with scripts/e2e/cluster.sh start DIR)",
                    path.display()
                )
            })
        };
        let ca = reqwest::Certificate::from_pem(read("pki/ca.crt")?.as_bytes())
            .context("the cluster CA")?;
        let identity = reqwest::Identity::from_pem(
            format!("{}\n{}", read("pki/admin.crt")?, read("pki/admin.key")?).as_bytes(),
        )
        .context("the cluster admin's certificate and key")?;
        let port: u16 = read("apiserver.port")?
            .trim()
            .parse()
            .context("apiserver.port")?;
        let client = reqwest::Client::builder()
            .tls_certs_merge([ca])
            .identity(identity)
            .timeout(Duration::from_secs(30))
            .build()
            .context("building the kube client")?;
        Ok(Self {
            base: format!("https://127.0.0.1:{port}"),
            client,
        })
    }

    /// POSTs one object; an object that already exists (409) is fine.
    pub(crate) async fn create(&self, path: &str, content_type: &str, body: String) -> Result<()> {
        let res = self
            .client
            .post(format!("{}{path}", self.base))
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
            .await
            .with_context(|| format!("POST {path}"))?;
        let status = res.status();
        if status.is_success() || status == reqwest::StatusCode::CONFLICT {
            return Ok(());
        }
        let text = res.text().await.unwrap_or_default();
        bail!("POST {path}: {status}: {text}")
    }

    /// DELETEs one object; one that does not exist (404) is fine.
    pub(crate) async fn delete(&self, path: &str) -> Result<()> {
        let res = self
            .client
            .delete(format!("{}{path}", self.base))
            .send()
            .await
            .with_context(|| format!("DELETE {path}"))?;
        let status = res.status();
        if status.is_success() || status == reqwest::StatusCode::NOT_FOUND {
            return Ok(());
        }
        let text = res.text().await.unwrap_or_default();
        bail!("DELETE {path}: {status}: {text}")
    }

    /// GETs one object; `None` when it does not exist.
    pub(crate) async fn get(&self, path: &str) -> Result<Option<Value>> {
        let res = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        if res.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let status = res.status();
        let text = res.text().await.unwrap_or_default();
        ensure!(status.is_success(), "GET {path}: {status}: {text}");
        Ok(Some(
            serde_json::from_str(&text).with_context(|| format!("GET {path}: not JSON"))?,
        ))
    }

    /// Waits until the CRD `name` is Established (its API is served).
    async fn wait_established(&self, name: &str) -> Result<()> {
        let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}");
        let started = ivory_clock::now();
        loop {
            if let Some(crd) = self.get(&path).await?
                && crd["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Established" && c["status"] == "True")
                })
            {
                return Ok(());
            }
            ensure!(
                started.elapsed() < Duration::from_secs(60),
                "CRD {name} not established after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_names_follow_controller_gen_file_names() {
        let name = crd_name(Path::new(
            "config/crds/policies.kyverno.io/policies.kyverno.io_imagevalidatingpolicies.yaml",
        ))
        .expect("named");
        assert_eq!(name, "imagevalidatingpolicies.policies.kyverno.io");
        assert!(crd_name(Path::new("config/crds/plain.yaml")).is_err());
    }

    #[test]
    fn resource_filters_are_bracketed_triples() {
        for filter in RESOURCE_FILTERS.split_whitespace() {
            assert!(filter.starts_with('[') && filter.ends_with(']'), "{filter}");
            assert_eq!(filter.matches(',').count(), 2, "{filter}");
        }
    }
}
