//! Cost curves (`ivory-bench curves`, `scripts/bench.sh --curves`): how a warm admission's
//! latency and CPU grow with the containers of a Pod and with the policies of a request, and
//! how a cold admission grows with the never-seen images of one Pod. Every point runs against
//! the same registry, key and binaries as `ivory-bench load`; the figures are added to
//! `target/bench/results.json` under `curves` (the verdict-cache curve is
//! [`crate::cache_probe`]'s, one fresh process per size).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use axum::body::Bytes;
use serde_json::{Value, json};

use crate::LoadArgs;
use crate::loadgen::{self, Target, post, round};
use crate::procs::Server;
use crate::report;
use crate::sign::Image;
use crate::stack::Stack;
use ivory_bench::policy::key_policy;
use ivory_bench::review::pod_review;

/// Containers per Pod of the containers curve.
const CONTAINERS: [usize; 3] = [1, 10, 100];
/// Matching policies per request of the policies curve.
const POLICIES: [usize; 3] = [1, 10, 50];
/// Never-seen images in one Pod of the cold curve.
const COLD_IMAGES: [usize; 3] = [1, 10, 100];
/// Verdicts held by the cache-probe processes (the last one only in a full run).
const CACHED_VERDICTS: [usize; 3] = [10_000, 100_000, 1_000_000];
/// Warm points run at concurrency 1: the curve is the cost of one admission, not the
/// machine's throughput (the load run has that).
const WARM_CONCURRENCY: usize = 1;

/// Runs every curve and adds them to the results file.
pub(crate) async fn run(args: LoadArgs) -> Result<()> {
    let started = ivory_clock::now();
    let step = warm_step(args.quick);
    let warm_pool = CONTAINERS.iter().copied().max().unwrap_or(1);
    let cold_pool: usize = COLD_IMAGES.iter().sum();
    let stack = Stack::build(args, warm_pool + cold_pool, 0).await?;
    let (warm, cold) = stack.images.cached.split_at(warm_pool);

    eprintln!("containers per Pod…");
    let containers = containers_curve(&stack, warm, step).await?;
    eprintln!("matching policies per request…");
    let policies = policies_curve(&stack, &warm[0], step).await?;
    eprintln!("never-seen images per Pod…");
    let cold = cold_curve(&stack, cold).await?;
    eprintln!("cached verdicts…");
    let sizes = if stack.args.quick {
        &CACHED_VERDICTS[..2]
    } else {
        &CACHED_VERDICTS[..]
    };
    let cache = crate::cache_probe::curve(sizes)?;

    let mut figures = serde_json::Map::new();
    key_figures(
        &mut figures,
        "containers",
        &containers,
        "containers",
        WARM_KEYS,
    );
    key_figures(&mut figures, "policies", &policies, "policies", WARM_KEYS);
    key_figures(&mut figures, "cold_images", &cold, "images", COLD_KEYS);
    key_figures(
        &mut figures,
        "cached_verdicts",
        &cache,
        "verdicts",
        CACHE_KEYS,
    );
    let details = json!({
        "quick": stack.args.quick,
        "step_s": step.as_secs_f64(),
        "warm_concurrency": WARM_CONCURRENCY,
        "containers_per_pod": containers,
        "policies_per_request": policies,
        "cold_images_per_pod": cold,
        "cached_verdicts": cache,
        "machine": report::machine(),
        "wall_s": round(started.elapsed().as_secs_f64(), 1),
    });
    report::merge(&stack.args.out, "curves", Value::Object(figures), details)
}

/// Point fields of a warm curve that become top-level keys.
const WARM_KEYS: &[&str] = &["p50_ms", "p99_ms", "cpu_us_per_admission"];
/// Point fields of the cold curve that become top-level keys.
const COLD_KEYS: &[&str] = &["admission_ms", "cpu_ms", "registry_requests"];
/// Point fields of the verdict-cache curve that become top-level keys.
const CACHE_KEYS: &[&str] = &["lookup_ns", "rss_mib"];

/// `curve_<axis>_<n>_<field>` keys of `points` (each point names its size in `size_field`).
fn key_figures(
    figures: &mut serde_json::Map<String, Value>,
    axis: &str,
    points: &Value,
    size_field: &str,
    fields: &[&str],
) {
    for point in points.as_array().into_iter().flatten() {
        let size = &point[size_field];
        for field in fields {
            figures.insert(
                format!("curve_{axis}_{size}_{field}"),
                point[*field].clone(),
            );
        }
    }
}

/// Warm latency and server CPU per admission of a Pod with 1, 10, 100 signed containers.
async fn containers_curve(stack: &Stack, warm: &[Image], step: Duration) -> Result<Value> {
    let ivory = stack.start_ivory("ivory-serve-containers").await?;
    containers_points(&ivory, &stack.client, warm, step).await
}

/// [`containers_curve`] against any webhook serving the `bench` policy (`ivory-bench peers` runs
/// it against Kyverno too): `server` is whose CPU is read, `client` trusts its certificate.
pub(crate) async fn containers_points(
    server: &Server,
    client: &reqwest::Client,
    warm: &[Image],
    step: Duration,
) -> Result<Value> {
    ensure!(
        warm.len() >= CONTAINERS.iter().copied().max().unwrap_or(1),
        "the containers curve needs {CONTAINERS:?} images, the run pushed {}",
        warm.len()
    );
    let mut points = Vec::new();
    for n in CONTAINERS {
        let images: Vec<String> = warm.iter().take(n).map(Image::pinned_ref).collect();
        let target = Target {
            client: client.clone(),
            url: format!("{}/ivpol/validate/bench", server.url),
            body: Bytes::from(pod_review(&format!("containers-{n}"), &images)),
        };
        let mut point = warm_point(server, &target, step).await?;
        point["containers"] = json!(n);
        points.push(point);
    }
    Ok(Value::Array(points))
}

/// Step of a warm point: `--quick` 2 s, full 6 s.
pub(crate) fn warm_step(quick: bool) -> Duration {
    if quick {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(6)
    }
}

/// Warm latency and server CPU per admission when 1, 10, 50 policies match the same image.
async fn policies_curve(stack: &Stack, image: &Image, step: Duration) -> Result<Value> {
    let glob = format!("{}/bench/*", stack.registry.host());
    let pem = std::fs::read_to_string(&stack.bench_key)
        .with_context(|| format!("reading {}", stack.bench_key.display()))?;
    let mut points = Vec::new();
    for n in POLICIES {
        let dir = stack.work.join(format!("policies-{n}"));
        let names = write_policies(&dir, n, &glob, &pem)?;
        let ivory = stack
            .start_ivory_on(&format!("ivory-serve-policies-{n}"), &dir, &[])
            .await?;
        let target = Target {
            client: stack.client.clone(),
            url: format!("{}/ivpol/validate/{}", ivory.url, names.join("/")),
            body: Bytes::from(pod_review(&format!("policies-{n}"), &[image.pinned_ref()])),
        };
        let mut point = warm_point(&ivory, &target, step).await?;
        point["policies"] = json!(n);
        points.push(point);
    }
    Ok(Value::Array(points))
}

/// `n` key policies, all matching `glob`, in a fresh `dir`; their names.
fn write_policies(dir: &Path, n: usize, glob: &str, pem: &str) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    (0..n)
        .map(|i| {
            let name = format!("curve-{i}");
            let path = dir.join(format!("{name}.yaml"));
            std::fs::write(&path, key_policy(&name, glob, pem))
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(name)
        })
        .collect()
}

/// One warm point: the first answer (which verifies) must admit; then a closed loop at
/// [`WARM_CONCURRENCY`] for `step`, with the server's own CPU time over the step.
async fn warm_point(server: &Server, target: &Target, step: Duration) -> Result<Value> {
    let first = post(&target.client, &target.url, target.body.clone()).await?;
    ensure!(
        first.allowed(),
        "warm-up of {} not admitted: {}",
        target.url,
        first.body
    );
    let cpu_before = server.cpu_time()?;
    let stats = loadgen::closed_loop(target, WARM_CONCURRENCY, step).await;
    let cpu = server.cpu_time()?.saturating_sub(cpu_before);
    ensure!(
        stats.ok > 0 && stats.errors == 0,
        "warm step of {}: {} answers, {} errors",
        target.url,
        stats.ok,
        stats.errors
    );
    let mut point = stats.to_json();
    point["cpu_us_per_admission"] = json!(round(cpu.as_secs_f64() * 1e6 / stats.ok as f64, 1));
    point["request_bytes"] = json!(target.body.len());
    Ok(point)
}

/// One admission of a Pod with 1, 10, 100 never-seen images, each on a fresh `ivory serve`
/// (empty caches, first registry contact paid before the clock starts).
async fn cold_curve(stack: &Stack, pool: &[Image]) -> Result<Value> {
    let mut points = Vec::new();
    let mut rest = pool;
    for n in COLD_IMAGES {
        let (images, tail) = rest.split_at(n.min(rest.len()));
        rest = tail;
        let ivory = stack.start_ivory(&format!("ivory-serve-cold-{n}")).await?;
        let validate = format!("{}/ivpol/validate/bench/fixture", ivory.url);
        let contact = pod_review("cold-first-contact", &[stack.images.fixture.pinned_ref()]);
        let first = post(&stack.client, &validate, Bytes::from(contact)).await?;
        ensure!(
            first.allowed(),
            "first contact not admitted: {}",
            first.body
        );
        let refs: Vec<String> = images.iter().map(Image::pinned_ref).collect();
        let body = Bytes::from(pod_review(&format!("cold-{n}"), &refs));
        stack.registry.reset_requests();
        let cpu_before = ivory.cpu_time()?;
        let sent = ivory_clock::now();
        let answer = post(&stack.client, &validate, body).await?;
        let elapsed = sent.elapsed();
        let cpu = ivory.cpu_time()?.saturating_sub(cpu_before);
        ensure!(
            answer.allowed(),
            "cold Pod of {n} images not admitted: {}",
            answer.body
        );
        let requests = stack.registry.requests().len();
        points.push(json!({
            "images": n,
            "admission_ms": round(elapsed.as_secs_f64() * 1e3, 1),
            "ms_per_image": round(elapsed.as_secs_f64() * 1e3 / n as f64, 2),
            "cpu_ms": round(cpu.as_secs_f64() * 1e3, 1),
            "registry_requests": requests,
        }));
    }
    Ok(Value::Array(points))
}
