//! `ivory-bench fleet` (`scripts/bench.sh --fleet`): three `ivory serve` replicas sharing one
//! real `redis-server` (`--cache-redis`), against the same registry and images as the load
//! harness. Figures go into `target/bench/results.json` beside the load figures (keys
//! `fleet_*`, details under `details.fleet`). See BENCHMARKS.md.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use axum::body::Bytes;
use ivory_testkit::RedisServer;
use serde_json::{Value, json};

use crate::LoadArgs;
use crate::loadgen::{self, Target, post, round};
use crate::phases::{admit, admit_in_pods, mib, request_lines, url, warm_images};
use crate::procs::Server;
use crate::report;
use crate::sign::Image;
use crate::stack::Stack;
use ivory_bench::review::pod_review;

/// Concurrent admissions per replica of the one never-seen image.
const HERD_PER_REPLICA: usize = 32;
/// Cached-phase images admitted through the restarted replica.
const AFTER_RESTART: usize = 300;

/// Sizes of one fleet run.
struct Plan {
    cached: usize,
    step: Duration,
    rounds: usize,
}

pub(crate) async fn run(args: LoadArgs) -> Result<()> {
    let started = ivory_clock::now();
    let plan = if args.quick {
        Plan {
            cached: args.cached_images.unwrap_or(3_000),
            step: Duration::from_secs(3),
            rounds: 1,
        }
    } else {
        Plan {
            cached: args.cached_images.unwrap_or(100_000),
            step: Duration::from_secs(10),
            rounds: 2,
        }
    };
    let machine = report::machine();
    let stack = Stack::build(args, plan.cached.max(AFTER_RESTART), 0).await?;
    let redis = RedisServer::start()
        .await
        .context("starting redis-server")?;
    let key = stack.work.join("l2.key");
    std::fs::write(
        &key,
        "ivory-bench fleet hmac key 0123456789abcdef0123456789",
    )
    .context("writing the L2 key")?;
    let mut l2 = vec![
        "--cache-redis".to_owned(),
        redis.url(),
        "--cache-redis-key".to_owned(),
        key.display().to_string(),
    ];
    if let Some(timeout) = &stack.args.cache_redis_timeout {
        l2.extend(["--cache-redis-timeout".to_owned(), timeout.clone()]);
    }
    let mut details = serde_json::Map::new();
    details.insert("quick".into(), json!(stack.args.quick));
    details.insert(
        "cache_redis_timeout".into(),
        json!(
            stack
                .args
                .cache_redis_timeout
                .as_deref()
                .unwrap_or("default (50ms)")
        ),
    );
    details.insert("machine_at_start".into(), machine);

    eprintln!("fleet: one replica without the L2, for the size of one request set…");
    let lone = stack.start_ivory_with("fleet-lone", &[]).await?;
    first_contact(&stack, &lone).await?;
    stack.registry.reset_requests();
    let [per_set_image, herd_image] = stack.images.cold.as_slice() else {
        anyhow::bail!("expected two cold images");
    };
    admit(&stack, &lone.url, "fleet-set".into(), per_set_image, true).await?;
    let per_set = request_lines(&stack).len();

    eprintln!("fleet: 3 replicas x {HERD_PER_REPLICA} admissions of one never-seen image…");
    let mut fleet = Vec::new();
    for i in 0..3 {
        let replica = stack.start_ivory_with(&format!("fleet-{i}"), &l2).await?;
        first_contact(&stack, &replica).await?;
        fleet.push(replica);
    }
    stack.registry.reset_requests();
    let herd = futures::future::join_all(fleet.iter().flat_map(|r| {
        (0..HERD_PER_REPLICA).map(|i| {
            let uid = format!("fleet-herd-{i}");
            admit(&stack, &r.url, uid, herd_image, true)
        })
    }))
    .await;
    let failed = herd.iter().filter(|r| r.is_err()).count();
    ensure!(failed == 0, "{failed} fleet herd admissions failed");
    let herd_lines = request_lines(&stack);
    let herd_sets = herd_lines.len() as f64 / per_set.max(1) as f64;
    details.insert(
        "herd".into(),
        json!({"replicas": 3, "admissions_per_replica": HERD_PER_REPLICA,
               "requests_per_set": per_set, "requests": herd_lines}),
    );

    eprintln!("fleet: warm Pod through replica 0, then replica 2 restarted…");
    let warm_body = Bytes::from(pod_review("fleet-warm", &warm_images(&stack)));
    let warm_url = url(&fleet[0].url, "validate");
    ensure!(
        post(&stack.client, &warm_url, warm_body.clone())
            .await?
            .allowed(),
        "warm Pod not admitted"
    );
    let sample: Vec<Image> = stack.images.cached[..AFTER_RESTART].to_vec();
    admit_all(&stack, &fleet[0].url, &sample, "fleet-prime").await?;
    drop(fleet.pop());
    let restarted = stack.start_ivory_with("fleet-2-restarted", &l2).await?;
    first_contact(&stack, &restarted).await?;
    stack.registry.reset_requests();
    let start = ivory_clock::now();
    ensure!(
        post(
            &stack.client,
            &url(&restarted.url, "validate"),
            warm_body.clone()
        )
        .await?
        .allowed(),
        "warm Pod not admitted by the restarted replica"
    );
    admit_all(&stack, &restarted.url, &sample, "fleet-restarted").await?;
    let restart_seconds = start.elapsed().as_secs_f64();
    let restart_lines = request_lines(&stack);
    details.insert(
        "restart".into(),
        json!({"images": sample.len() + warm_images(&stack).len(),
               "seconds": round(restart_seconds, 2),
               "registry_requests": restart_lines.len(),
               "l2": l2_events(&stack, &restarted).await}),
    );
    fleet.push(restarted);

    eprintln!("fleet: warm throughput with the L2 and without…");
    let off = stack.start_ivory_with("fleet-no-l2", &[]).await?;
    ensure!(
        post(&stack.client, &url(&off.url, "validate"), warm_body.clone())
            .await?
            .allowed(),
        "warm Pod not admitted without the L2"
    );
    let target = |server: &Server| Target {
        client: stack.client.clone(),
        url: url(&server.url, "validate"),
        body: warm_body.clone(),
    };
    let (on_target, off_target) = (target(&fleet[0]), target(&off));
    loadgen::closed_loop(&on_target, 8, Duration::from_secs(1)).await;
    loadgen::closed_loop(&off_target, 8, Duration::from_secs(1)).await;
    let (mut on_best, mut off_best) = (0.0f64, 0.0f64);
    let mut steps = Vec::new();
    // Alternate, so that what else the machine runs falls on both sides alike.
    for _ in 0..plan.rounds {
        let on = loadgen::closed_loop(&on_target, 32, plan.step).await;
        let off_stats = loadgen::closed_loop(&off_target, 32, plan.step).await;
        on_best = on_best.max(on.rps);
        off_best = off_best.max(off_stats.rps);
        steps.push(json!({"l2_on": on.to_json(), "l2_off": off_stats.to_json()}));
    }
    drop(off);
    details.insert("warm".into(), json!({"concurrency": 32, "steps": steps}));

    eprintln!(
        "fleet: {} distinct verdicts through a fresh replica…",
        plan.cached
    );
    let fresh = stack.start_ivory_with("fleet-cache", &l2).await?;
    let start = ivory_clock::now();
    admit_all(&stack, &fresh.url, &stack.images.cached, "fleet-cache").await?;
    let cache_seconds = start.elapsed().as_secs_f64();
    let (hwm, rss) = fresh.memory_kib()?;
    let redis_kib = redis_memory_kib(&redis)?;
    details.insert("cached_l2".into(), l2_events(&stack, &fresh).await);
    let keys = redis_dbsize(&redis)?;
    details.insert(
        "cached".into(),
        json!({"images": stack.images.cached.len(), "seconds": round(cache_seconds, 1),
               "ivory_peak_rss_mib": mib(hwm), "ivory_rss_mib_after": mib(rss),
               "redis_keys": keys, "redis_peak_rss_mib": mib(redis_kib.0),
               "redis_rss_mib": mib(redis_kib.1)}),
    );
    details.insert("machine_at_end".into(), report::machine());
    details.insert(
        "wall_s".into(),
        json!(round(started.elapsed().as_secs_f64(), 1)),
    );

    let figures = json!({
        "fleet_herd_request_sets_3x32": round(herd_sets, 2),
        "fleet_restart_registry_requests": restart_lines.len(),
        "fleet_warm_rps_l2_on_vs_off": round(on_best / off_best.max(1e-9), 3),
        "fleet_ivory_peak_rss_mib_cached": mib(hwm),
        "fleet_redis_peak_rss_mib_cached": mib(redis_kib.0),
        "fleet_cached_verdicts": stack.images.cached.len(),
    });
    report::merge_fleet(&stack.args.out, figures, Value::Object(details))
}

/// The registry's one-time first contact of a new process (`/v2/`, referrers probe), paid with
/// the fixture so that the counts that follow are per image.
async fn first_contact(stack: &Stack, server: &Server) -> Result<()> {
    admit(
        stack,
        &server.url,
        "first-contact".into(),
        &stack.images.fixture,
        true,
    )
    .await
}

/// Validates `images` (pinned, three per Pod, 8 Pods in flight); every Pod must be admitted.
async fn admit_all(stack: &Stack, base: &str, images: &[Image], label: &str) -> Result<()> {
    let validate = url(base, "validate");
    let answers = admit_in_pods(&stack.client, &validate, images, label).await;
    let admitted = answers.iter().filter(|a| matches!(a, Ok(true))).count();
    ensure!(
        admitted == answers.len(),
        "{label}: only {admitted} of {} Pods admitted",
        answers.len()
    );
    Ok(())
}

/// The replica's `ivory_l2_*` counters from `/metrics`.
async fn l2_events(stack: &Stack, server: &Server) -> Value {
    let text = match stack
        .client
        .get(format!("{}/metrics", server.url))
        .send()
        .await
    {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(e) => return json!({"error": e.to_string()}),
    };
    let counters: serde_json::Map<String, Value> = text
        .lines()
        .filter(|l| l.starts_with("ivory_l2_"))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), json!(value.parse::<f64>().ok()?)))
        })
        .collect();
    Value::Object(counters)
}

/// (VmHWM, VmRSS) of the redis-server process, KiB.
fn redis_memory_kib(redis: &RedisServer) -> Result<(u64, u64)> {
    let pid = redis.pid().context("redis-server is not running")?;
    crate::procs::memory_kib_of(pid)
}

/// Keys in the shared cache (`redis-cli DBSIZE`).
fn redis_dbsize(redis: &RedisServer) -> Result<u64> {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "DBSIZE"])
        .output()
        .context("running redis-cli DBSIZE")?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("parsing DBSIZE")
}
