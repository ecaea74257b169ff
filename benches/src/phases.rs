//! The measurements, in run order, all against the same registry and binaries.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use axum::body::Bytes;
use futures::StreamExt as _;
use serde_json::{Value, json};

use crate::LoadArgs;
use crate::loadgen::{self, Stats, Target, post, round};
use crate::report;
use crate::sign::Image;
use crate::stack::Stack;
use ivory_bench::review::pod_review;

/// Every policy, so each image meets the policy whose glob matches it.
const POLICIES: &str = "bench/fixture/hung";
/// `?timeout=` of the hung-registry phase (the webhook's timeoutSeconds).
const HUNG_TIMEOUT: Duration = Duration::from_secs(2);
/// Local bookkeeping allowed past the budget before a response counts as late.
const LATE_SLACK: Duration = Duration::from_millis(100);
/// Concurrent admissions in the herd phase.
const HERD: usize = 64;
/// How long the warm throughput steps send to one server before the other's turn.
const SLICE: Duration = Duration::from_millis(500);
/// Requests in flight in the hung-registry phase.
pub(crate) const HUNG_CONCURRENCY: usize = 64;

/// Sizes of one run.
struct Plan {
    concurrencies: Vec<usize>,
    step: Duration,
    cached: usize,
    cosign: usize,
    hung: usize,
}

impl Plan {
    fn new(args: &LoadArgs) -> Self {
        if args.quick {
            Self {
                concurrencies: vec![8, 32],
                step: Duration::from_secs(3),
                cached: args.cached_images.unwrap_or(3000),
                cosign: 4,
                hung: 64,
            }
        } else {
            Self {
                concurrencies: vec![1, 8, 32, 64],
                step: Duration::from_secs(10),
                cached: args.cached_images.unwrap_or(10_000),
                cosign: 16,
                hung: 256,
            }
        }
    }
}

pub(crate) async fn run(args: LoadArgs) -> Result<()> {
    let started = ivory_clock::now();
    let plan = Plan::new(&args);
    let machine = report::machine();
    let stack = Stack::build(args, plan.cached, plan.cosign).await?;
    let mut details = serde_json::Map::new();
    details.insert("quick".into(), json!(stack.args.quick));
    details.insert("machine_at_start".into(), machine);

    let ivory = stack.start_ivory("ivory-serve").await?;
    eprintln!("cold and herd…");
    let (tag_cold, digest_cold, cold_detail) = cold(&stack, &stack.client, &ivory.url).await?;
    details.insert("cold".into(), cold_detail);
    let (sets, herd_detail) = herd(&stack, &stack.client, &ivory.url, tag_cold, HERD).await?;
    details.insert("herd".into(), herd_detail);

    eprintln!("warm throughput…");
    let warm_body = Bytes::from(pod_review("warm", &warm_images(&stack)));
    let ivory_target = Target {
        client: stack.client.clone(),
        url: format!("{}/ivpol/validate/{POLICIES}", ivory.url),
        body: warm_body.clone(),
    };
    let first = post(&stack.client, &ivory_target.url, warm_body.clone()).await?;
    ensure!(
        first.allowed(),
        "warm Pod not admitted by ivory: {}",
        first.body
    );
    let null = stack.start_null().await?;
    let null_target = Target {
        url: format!("{}/ivpol/validate/{POLICIES}", null.url),
        ..ivory_target.clone()
    };
    let (ivory_steps, null_steps) = sweep_in_turn(&ivory_target, &null_target, &plan).await;
    let ivory_max = max_rps(&ivory_steps);
    let null_max = max_rps(&null_steps);
    ensure!(
        ivory_max > 0.0 && null_max > 0.0,
        "no successful warm requests"
    );

    eprintln!("latency at half load ({:.0} req/s)…", ivory_max / 2.0);
    let cpu_before = ivory.cpu_times()?;
    let half = loadgen::open_loop(&ivory_target, ivory_max / 2.0, plan.step).await;
    let half_cpu = ivory.cpu_times()?.since(cpu_before);
    // The server's own CPU per answered admission over the half-load step.
    let per_admission = |cpu: Duration| cpu.as_secs_f64() * 1e6 / half.ok.max(1) as f64;
    let warm_cpu_us = per_admission(half_cpu.total());
    // The null webhook's CPU per answer over the same step at the same rate: the same TLS and
    // HTTP work on the same machine, so ivory's figure divided by it means the same anywhere.
    let null_cpu_before = null.cpu_times()?;
    let null_half = loadgen::open_loop(&null_target, ivory_max / 2.0, plan.step).await;
    let null_half_cpu = null.cpu_times()?.since(null_cpu_before);
    let per_answer = |cpu: Duration| cpu.as_secs_f64() * 1e6 / null_half.ok.max(1) as f64;
    let null_cpu_us = per_answer(null_half_cpu.total());
    drop(null);
    details.insert(
        "warm".into(),
        json!({
            "ivory_steps": steps_json(&ivory_steps),
            "null_steps": steps_json(&null_steps),
            "ivory_max_rps": round(ivory_max, 1),
            "null_max_rps": round(null_max, 1),
            "half_load_rps": round(ivory_max / 2.0, 1),
            "ivory_half_load": half.to_json(),
            "null_half_load": null_half.to_json(),
            "ivory_cpu_us": round(warm_cpu_us, 1),
            "null_cpu_us": round(null_cpu_us, 1),
            // The same figures apart: the kernel's part (sockets, the log's writes) and the
            // user-space part, where ivory's own work is.
            "ivory_cpu_user_us": round(per_admission(half_cpu.user), 1),
            "ivory_cpu_system_us": round(per_admission(half_cpu.system), 1),
            "null_cpu_user_us": round(per_answer(null_half_cpu.user), 1),
            "null_cpu_system_us": round(per_answer(null_half_cpu.system), 1),
            "request_bytes": warm_body.len(),
        }),
    );

    eprintln!("hung registry…");
    // Open (and keep pooled) the connections the hung phase uses, as the API server would
    // have: its timing must not include TLS handshakes.
    loadgen::closed_loop(&ivory_target, HUNG_CONCURRENCY, Duration::from_secs(1)).await;
    let (late, hung_detail) = hung(&stack, &stack.client, &ivory.url, plan.hung).await?;
    details.insert("hung".into(), hung_detail);
    let (hwm, _) = ivory.memory_kib()?;
    details.insert("ivory_serve_peak_rss_mib".into(), json!(mib(hwm)));
    drop(ivory);

    eprintln!("cache memory ({} images)…", stack.images.cached.len());
    let (rss, rss_detail) = cached_rss(&stack).await?;
    details.insert("cached".into(), rss_detail);

    eprintln!("cold verification vs cosign…");
    let (ratio, cosign_detail) = versus_cosign(&stack).await?;
    details.insert("cosign".into(), cosign_detail);
    details.insert("machine_at_end".into(), report::machine());
    details.insert(
        "wall_s".into(),
        json!(round(started.elapsed().as_secs_f64(), 1)),
    );

    let results = json!({
        "warm_rps_ratio": round(ivory_max / null_max, 3),
        "warm_p99_ms": round(half.p99_ms, 3),
        "warm_cpu_us": round(warm_cpu_us, 1),
        "warm_cpu_vs_null": ratio_of(warm_cpu_us, null_cpu_us),
        "warm_p99_vs_null": ratio_of(half.p99_ms, null_half.p99_ms),
        "cold_requests_per_tag_image": tag_cold,
        "cold_requests_per_digest_image": digest_cold,
        "herd_request_sets_64": round(sets, 2),
        "late_responses_hung_registry": late,
        "rss_mib_10k_cached": round(rss, 1),
        "cold_verify_ratio_vs_cosign": round(ratio, 3),
        "details": Value::Object(details),
    });
    report::write(&stack.args.out, &results)
}

/// `a ÷ b` to three places; `null` when `b` is not a positive figure (nothing answered).
fn ratio_of(a: f64, b: f64) -> Value {
    if b > 0.0 {
        json!(round(a / b, 3))
    } else {
        Value::Null
    }
}

pub(crate) fn warm_images(stack: &Stack) -> Vec<String> {
    let mut images = vec![stack.images.fixture.pinned_ref()];
    images.extend(stack.images.warm.iter().map(Image::pinned_ref));
    images
}

pub(crate) fn mib(kib: u64) -> f64 {
    round(kib as f64 / 1024.0, 1)
}

pub(crate) fn url(base: &str, stage: &str) -> String {
    format!("{base}/ivpol/{stage}/{POLICIES}")
}

/// The API server's sequence for one Pod: mutate (pins tags), then validate the pinned Pod.
pub(crate) async fn admit(
    stack: &Stack,
    base: &str,
    uid: String,
    image: &Image,
    by_tag: bool,
) -> Result<()> {
    admit_via(&stack.client, base, uid, image, by_tag).await
}

/// [`admit`] through `client` (a webhook with another CA: Kyverno's).
pub(crate) async fn admit_via(
    client: &reqwest::Client,
    base: &str,
    uid: String,
    image: &Image,
    by_tag: bool,
) -> Result<()> {
    let reference = if by_tag {
        image.tag_ref()
    } else {
        image.digest_ref()
    };
    let body = Bytes::from(pod_review(&uid, std::slice::from_ref(&reference)));
    let mutated = post(client, &url(base, "mutate"), body).await?;
    ensure!(
        mutated.allowed(),
        "mutate denied {reference}: {}",
        mutated.body
    );
    if by_tag {
        ensure!(
            mutated.patch().is_some(),
            "mutate did not pin {reference}: {}",
            mutated.body
        );
    }
    let pinned = if by_tag {
        image.pinned_ref()
    } else {
        reference.clone()
    };
    let body = Bytes::from(pod_review(&uid, &[pinned]));
    let validated = post(client, &url(base, "validate"), body).await?;
    ensure!(
        validated.allowed(),
        "validate denied {reference}: {}",
        validated.body
    );
    Ok(())
}

pub(crate) fn request_lines(stack: &Stack) -> Vec<String> {
    stack
        .registry
        .requests()
        .into_iter()
        .map(|(m, p, s)| format!("{m} {p} {s}"))
        .collect()
}

/// Registry requests for one never-seen image, by tag and by digest.
pub(crate) async fn cold(
    stack: &Stack,
    client: &reqwest::Client,
    base: &str,
) -> Result<(usize, usize, Value)> {
    let [tag_image, digest_image] = stack.images.cold.as_slice() else {
        bail!("expected two cold images");
    };
    // Per-registry one-time requests (the `/v2/` ping, the referrers-API probe) happen on
    // the first contact; the fixture pays them so the counts below are per image.
    stack.registry.reset_requests();
    admit_via(
        client,
        base,
        "registry-first-contact".into(),
        &stack.images.fixture,
        true,
    )
    .await?;
    let first_contact = request_lines(stack);
    stack.registry.reset_requests();
    admit_via(client, base, "cold-tag".into(), tag_image, true).await?;
    let tag_lines = request_lines(stack);
    stack.registry.reset_requests();
    admit_via(client, base, "cold-digest".into(), digest_image, false).await?;
    let digest_lines = request_lines(stack);
    let detail = json!({
        "first_contact_requests_fixture_by_tag": first_contact,
        "tag_requests": tag_lines,
        "digest_requests": digest_lines,
    });
    Ok((tag_lines.len(), digest_lines.len(), detail))
}

/// `count` concurrent admissions (mutate + validate) of one uncached image: how many cold
/// request sets reach the registry.
pub(crate) async fn herd(
    stack: &Stack,
    client: &reqwest::Client,
    base: &str,
    per_set: usize,
    count: usize,
) -> Result<(f64, Value)> {
    stack.registry.reset_requests();
    let image = &stack.images.herd;
    let results = futures::future::join_all(
        (0..count).map(|i| admit_via(client, base, format!("herd-{i}"), image, true)),
    )
    .await;
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.err().map(|e| format!("{e:#}")))
        .collect();
    ensure!(failed.is_empty(), "herd admissions failed: {failed:?}");
    let lines = request_lines(stack);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for line in &lines {
        *counts.entry(line.clone()).or_default() += 1;
    }
    let sets = lines.len() as f64 / per_set.max(1) as f64;
    Ok((sets, json!({"requests": lines.len(), "by_request": counts})))
}

/// Closed-loop steps of ivory and of the null webhook at each concurrency, in slices taken in
/// turn ([`loadgen::closed_loops_in_turn`]), after a short warm-up of each.
async fn sweep_in_turn(
    ivory: &Target,
    null: &Target,
    plan: &Plan,
) -> (Vec<(usize, Stats)>, Vec<(usize, Stats)>) {
    for target in [ivory, null] {
        loadgen::closed_loop(target, 8, Duration::from_secs(1)).await;
    }
    let (mut ivory_steps, mut null_steps) = (Vec::new(), Vec::new());
    for &c in &plan.concurrencies {
        let [i, n] = loadgen::closed_loops_in_turn([ivory, null], c, plan.step, SLICE).await;
        ivory_steps.push((c, i));
        null_steps.push((c, n));
    }
    (ivory_steps, null_steps)
}

/// Closed-loop steps of `step` at each of `concurrencies` (after a one-second warm-up).
pub(crate) async fn sweep_at(
    target: &Target,
    concurrencies: &[usize],
    step: Duration,
) -> Vec<(usize, Stats)> {
    loadgen::closed_loop(target, 8, Duration::from_secs(1)).await;
    let mut steps = Vec::new();
    for &c in concurrencies {
        steps.push((c, loadgen::closed_loop(target, c, step).await));
    }
    steps
}

pub(crate) fn max_rps(steps: &[(usize, Stats)]) -> f64 {
    steps.iter().map(|(_, s)| s.rps).fold(0.0, f64::max)
}

pub(crate) fn steps_json(steps: &[(usize, Stats)]) -> Value {
    steps
        .iter()
        .map(|(c, s)| {
            let mut v = s.to_json();
            v["concurrency"] = json!(c);
            v
        })
        .collect()
}

/// Admissions whose images live on a registry that accepts connections and never answers:
/// every response must arrive within the budget derived from `?timeout=`.
pub(crate) async fn hung(
    stack: &Stack,
    client: &reqwest::Client,
    base: &str,
    count: usize,
) -> Result<(usize, Value)> {
    let budget = HUNG_TIMEOUT - HUNG_TIMEOUT / 10;
    let host = stack.hung.host();
    let fake = format!("sha256:{}", "ab".repeat(32));
    let requests = (0..count).map(|i| {
        let (stage, image) = if i % 2 == 0 {
            ("mutate", format!("{host}/hung/app{i}:v1"))
        } else {
            ("validate", format!("{host}/hung/app{i}@{fake}"))
        };
        let url = format!("{}?timeout=2s", url(base, stage));
        let body = Bytes::from(pod_review(&format!("hung-{i}"), &[image]));
        let client = client.clone();
        async move {
            let start = ivory_clock::now();
            let answer = post(&client, &url, body).await;
            (
                stage,
                start.elapsed(),
                answer.map(|a| (a.status, a.allowed())),
            )
        }
    });
    let answers: Vec<_> = futures::stream::iter(requests)
        .buffer_unordered(HUNG_CONCURRENCY)
        .collect()
        .await;
    let mut late = 0;
    let (mut denied, mut errors) = (0, 0);
    let mut by_stage: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (stage, elapsed, answer) in &answers {
        by_stage
            .entry(stage)
            .or_default()
            .push(elapsed.as_secs_f64() * 1000.0);
        if *elapsed > budget + LATE_SLACK {
            late += 1;
        }
        match answer {
            Ok((200, false)) => denied += 1,
            _ => errors += 1,
        }
    }
    let stages: serde_json::Map<String, Value> = by_stage
        .into_iter()
        .map(|(stage, mut ms)| {
            ms.sort_by(f64::total_cmp);
            let at = |q: f64| ms[((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
            let v = json!({"min_ms": round(ms[0], 1), "p50_ms": round(at(0.5), 1), "max_ms": round(at(1.0), 1)});
            (stage.to_owned(), v)
        })
        .collect();
    let detail = json!({
        "requests": answers.len(), "timeout_ms": HUNG_TIMEOUT.as_millis() as u64,
        "budget_ms": budget.as_millis() as u64, "late_slack_ms": LATE_SLACK.as_millis() as u64,
        "latency_by_stage": stages, "denied": denied, "other_answers_or_errors": errors,
    });
    Ok((late, detail))
}

/// A fresh `ivory serve` verifies every cached-phase image once (three per Pod); peak RSS after.
pub(crate) async fn cached_rss(stack: &Stack) -> Result<(f64, Value)> {
    let ivory = stack.start_ivory("ivory-serve-cache").await?;
    let (_, before) = ivory.memory_kib()?;
    let started = ivory_clock::now();
    let validate = url(&ivory.url, "validate");
    let answers = admit_in_pods(&stack.client, &validate, &stack.images.cached, "cache").await;
    let allowed = answers.iter().filter(|a| matches!(a, Ok(true))).count();
    let pods_sent = answers.len();
    ensure!(
        allowed == pods_sent,
        "only {allowed} of {pods_sent} cache-phase Pods admitted (see {})",
        stack.work.join("ivory-serve-cache.log").display()
    );
    let elapsed = started.elapsed();
    let (hwm, rss) = ivory.memory_kib()?;
    let detail = json!({
        "images": stack.images.cached.len(), "pods": pods_sent,
        "seconds": round(elapsed.as_secs_f64(), 1),
        "verifications_per_s": round(stack.images.cached.len() as f64 / elapsed.as_secs_f64(), 1),
        "rss_mib_idle_start": mib(before), "rss_mib_after": mib(rss), "peak_rss_mib": mib(hwm),
    });
    Ok((mib(hwm), detail))
}

/// Wall time of one cold `ivory verify` and one `cosign verify` process per image.
async fn versus_cosign(stack: &Stack) -> Result<(f64, Value)> {
    let mut cases: Vec<(String, &std::path::Path)> = vec![(
        stack.images.fixture.digest_ref(),
        stack.fixture_key.as_path(),
    )];
    cases.extend(
        stack
            .images
            .cosign
            .iter()
            .map(|i| (i.digest_ref(), stack.bench_key.as_path())),
    );
    let tuf = stack.work.join("tuf");
    let (mut ivory_total, mut cosign_total) = (Duration::ZERO, Duration::ZERO);
    let mut rows = Vec::new();
    // One untimed run of each tool first: both binaries start from the page cache, so the
    // figures compare verification, not the first read of a 40-100 MB executable.
    let mut timed_cases = Vec::with_capacity(cases.len() + 1);
    if let Some(first) = cases.first() {
        timed_cases.push((first.clone(), false));
    }
    timed_cases.extend(cases.iter().cloned().map(|c| (c, true)));
    for ((image, key), counted) in &timed_cases {
        let mut ivory = std::process::Command::new(&stack.args.ivory);
        ivory
            .args([
                "verify",
                image.as_str(),
                "--insecure-ignore-tlog",
                "-o",
                "json",
            ])
            .arg("--key")
            .arg(key)
            .arg("--registry-ca")
            .arg(&stack.registry_ca);
        let mut cosign = std::process::Command::new(&stack.args.cosign);
        cosign
            .args(["verify", "--insecure-ignore-tlog", "--key"])
            .arg(key)
            .arg(image)
            .env("SSL_CERT_FILE", &stack.registry_ca)
            .env("TUF_ROOT", &tuf);
        let i = timed(ivory, "ivory verify", image).await?;
        let c = timed(cosign, "cosign verify", image).await?;
        if !counted {
            continue;
        }
        ivory_total += i;
        cosign_total += c;
        rows.push(json!({"image": image, "ivory_ms": ms(i), "cosign_ms": ms(c)}));
    }
    let ratio = ivory_total.as_secs_f64() / cosign_total.as_secs_f64().max(1e-9);
    let detail = json!({
        "images": cases.len(), "ivory_total_ms": ms(ivory_total),
        "cosign_total_ms": ms(cosign_total), "per_image": rows,
    });
    Ok((ratio, detail))
}

fn ms(d: Duration) -> f64 {
    round(d.as_secs_f64() * 1000.0, 1)
}

/// Runs a verifier process to completion; it must succeed.
async fn timed(cmd: std::process::Command, what: &str, image: &str) -> Result<Duration> {
    let mut cmd = tokio::process::Command::from(cmd);
    let start = ivory_clock::now();
    let out = cmd
        .output()
        .await
        .with_context(|| format!("running {what}"))?;
    let elapsed = start.elapsed();
    if !out.status.success() {
        bail!(
            "{what} {image} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(elapsed)
}

/// Sends every image of `images` to the validating `url` by digest, three per Pod review
/// (uids `<label>-<n>`), 8 reviews in flight: whether each Pod was allowed.
pub(crate) async fn admit_in_pods(
    client: &reqwest::Client,
    url: &str,
    images: &[Image],
    label: &str,
) -> Vec<Result<bool>> {
    let pods = images.chunks(3).enumerate().map(|(i, chunk)| {
        let refs: Vec<String> = chunk.iter().map(Image::pinned_ref).collect();
        let body = Bytes::from(pod_review(&format!("{label}-{i}"), &refs));
        let (client, url) = (client.clone(), url.to_owned());
        async move { post(&client, &url, body).await.map(|a| a.allowed()) }
    });
    futures::stream::iter(pods)
        .buffer_unordered(8)
        .collect()
        .await
}
