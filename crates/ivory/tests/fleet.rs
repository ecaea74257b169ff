//! A fleet of `ivory serve` processes sharing a real `redis-server` (`--cache-redis`), against
//! the real registry: one registry request set for an image the fleet has not seen, and the
//! same answers when Redis is paused, stopped or full of garbage, and no wait for leases planted
//! in it.

use std::path::{Path, PathBuf};
use std::process::Command;

use ivory_testkit::{Harness, RedisServer, RegistryHarness};
use serde_json::Value;

use crate::util::{Ivory, Tls, VERIFY_SIGNED, key_attestor, pod_review, policy};

const L2_KEY: &str = "fleet-test-hmac-key-0123456789abcdef0123456789";

async fn push(h: &Harness, layout: &str) -> String {
    h.push_fixture(layout).await.unwrap().0
}

/// A policy dir with `require-signed` (Deny, failurePolicy Fail) for the registry's images.
fn setup(dir: &Path, h: &Harness) -> (std::path::PathBuf, Tls) {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    let body = format!(
        "  validationActions: [Deny]\n  failurePolicy: Fail\n  validationConfigurations:\n    \
         mutateDigest: false\n    verifyDigest: false\n{}{VERIFY_SIGNED}",
        key_attestor()
    );
    let glob = format!("{}/*", h.host());
    std::fs::write(
        policies.join("signed.yaml"),
        policy("require-signed", &glob, &body),
    )
    .unwrap();
    std::fs::write(dir.join("registry-ca.pem"), h.ca_pem()).unwrap();
    std::fs::write(dir.join("l2.key"), L2_KEY).unwrap();
    (policies, Tls::write(dir, "ivory fleet test CA"))
}

/// What each fleet test starts from: (the registry with the signed fixture, that image, a
/// Redis, a folder with the policies, the registry's CA, the L2 key and ivory's TLS (see
/// [`setup`]), the policies folder, the TLS).
async fn fleet() -> (
    Harness,
    String,
    RedisServer,
    tempfile::TempDir,
    PathBuf,
    Tls,
) {
    let h = RegistryHarness::start_default().await.unwrap();
    let signed = push(&h, "sig-p256").await;
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (policies, tls) = setup(dir.path(), &h);
    (h, signed, redis, dir, policies, tls)
}

async fn replica(dir: &Path, policies: &Path, tls: &Tls, redis: Option<&RedisServer>) -> Ivory {
    let mut args = vec![
        "--policies".to_owned(),
        policies.display().to_string(),
        "--registry-ca".into(),
        dir.join("registry-ca.pem").display().to_string(),
    ];
    if let Some(redis) = redis {
        args.extend([
            "--cache-redis".into(),
            redis.url(),
            "--cache-redis-key".into(),
            dir.join("l2.key").display().to_string(),
            // The machine running the tests is shared: what these tests check must not hinge
            // on a loaded machine answering within the production default.
            "--cache-redis-timeout".into(),
            "1s".into(),
        ]);
    }
    Ivory::start(tls, &args).await
}

/// Registry requests since the last reset, sorted, without each client's one-time `/v2/`.
fn request_set(h: &Harness) -> Vec<String> {
    let mut set: Vec<String> = h
        .requests()
        .into_iter()
        .map(|(method, path, _)| format!("{method} {path}"))
        .filter(|r| !r.ends_with(" /v2/"))
        .collect();
    set.sort();
    set
}

const VALIDATE: &str = "/ivpol/validate/require-signed?timeout=8s";

/// `n` concurrent validations of `image` on `ivory`; the answers' `allowed` and messages.
async fn admit(ivory: &Ivory, image: &str, n: usize) -> Vec<(bool, String)> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let (client, url) = (ivory.client(), ivory.url(VALIDATE));
        let review = pod_review(&format!("u-{i}"), &[image]);
        tasks.push(tokio::spawn(async move {
            let resp = client.post(url).json(&review).send().await.unwrap();
            assert_eq!(resp.status().as_u16(), 200);
            let v: Value = resp.json().await.unwrap();
            (
                v["response"]["allowed"] == true,
                v["response"]["status"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn metric_sum(text: &str, start: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(start))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_times_32_admissions_of_a_new_image_cost_one_registry_request_set() {
    let (h, signed, redis, dir, policies, tls) = fleet().await;

    // What one replica without the L2 asks the registry for one admission of the image.
    let lone = replica(dir.path(), &policies, &tls, None).await;
    h.reset_requests();
    assert!(admit(&lone, &signed, 1).await[0].0);
    let one_set = request_set(&h);
    assert!(!one_set.is_empty());
    drop(lone);

    let fleet = [
        replica(dir.path(), &policies, &tls, Some(&redis)).await,
        replica(dir.path(), &policies, &tls, Some(&redis)).await,
        replica(dir.path(), &policies, &tls, Some(&redis)).await,
    ];
    h.reset_requests();
    let answers = futures::future::join_all(fleet.iter().map(|r| admit(r, &signed, 32))).await;
    for (allowed, message) in answers.into_iter().flatten() {
        assert!(allowed, "{message}");
    }
    assert_eq!(request_set(&h), one_set);
    let mut won = 0.0;
    for r in &fleet {
        won += metric_sum(
            &r.metrics().await,
            "ivory_l2_events_total{event=\"leases_won\"}",
        );
    }
    // One replica loaded the tag, one the verdict; the rest waited or read the L2.
    assert_eq!(won, 2.0);

    // A replica restarted into the warm fleet asks the registry nothing.
    let fresh = replica(dir.path(), &policies, &tls, Some(&redis)).await;
    h.reset_requests();
    assert!(admit(&fresh, &signed, 4).await.iter().all(|(a, _)| *a));
    assert_eq!(request_set(&h), Vec::<String>::new());
}

/// Every answer as without an L2: the signed image allowed, the unsigned one denied for its
/// signature (never for a spent budget).
async fn answers_are_right(ivory: &Ivory, signed: &str, unsigned: &str) {
    for (allowed, message) in admit(ivory, signed, 16).await {
        assert!(allowed, "{message}\n{}", ivory.logs());
    }
    for (allowed, message) in admit(ivory, unsigned, 16).await {
        assert!(!allowed);
        assert!(
            message.contains("failed the image Signature verification"),
            "{message}"
        );
    }
}

fn redis_cli(redis: &RedisServer, script: &str) {
    let status = Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "EVAL", script, "0"])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_stopped_or_garbage_redis_changes_no_answer() {
    let (h, signed, mut redis, dir, policies, tls) = fleet().await;
    let unsigned = push(&h, "unsigned").await;
    let warm = replica(dir.path(), &policies, &tls, Some(&redis)).await;
    answers_are_right(&warm, &signed, &unsigned).await;

    // Paused (accepts connections, never answers): a fresh replica, every lookup cold.
    redis.pause().unwrap();
    let during_pause = replica(dir.path(), &policies, &tls, Some(&redis)).await;
    answers_are_right(&during_pause, &signed, &unsigned).await;
    answers_are_right(&warm, &signed, &unsigned).await;
    let m = during_pause.metrics().await;
    assert!(
        metric_sum(&m, "ivory_l2_events_total{event=\"errors\"}") >= 1.0,
        "{m}"
    );
    redis.resume().unwrap();

    // Garbage and forged entries under every name the fleet wrote.
    redis_cli(
        &redis,
        "for _, k in ipairs(redis.call('KEYS', 'ivory:v2:*')) do \
         redis.call('SET', k, 'IVL2' .. string.rep('x', 60)) end",
    );
    let after_garbage = replica(dir.path(), &policies, &tls, Some(&redis)).await;
    answers_are_right(&after_garbage, &signed, &unsigned).await;
    let m = after_garbage.metrics().await;
    assert!(
        metric_sum(&m, "ivory_l2_events_total{event=\"rejected\"}") >= 1.0,
        "{m}"
    );

    // Stopped (connections refused).
    redis.stop();
    let during_outage = replica(dir.path(), &policies, &tls, Some(&redis)).await;
    answers_are_right(&during_outage, &signed, &unsigned).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_planted_in_redis_do_not_delay_admissions() {
    let (_h, signed, redis, dir, policies, tls) = fleet().await;
    let first = replica(dir.path(), &policies, &tls, Some(&redis)).await;
    assert!(admit(&first, &signed, 1).await[0].0);
    // Someone with write access to Redis (not the key) empties every name the fleet wrote and
    // plants its lease, with no expiry: "another replica is loading this, wait".
    redis_cli(
        &redis,
        "for _, k in ipairs(redis.call('KEYS', 'ivory:v2:*')) do \
         redis.call('DEL', k) redis.call('SET', k .. ':lease', 'planted') end",
    );
    let fresh = replica(dir.path(), &policies, &tls, Some(&redis)).await;
    let start = ivory_clock::now();
    let answers = admit(&fresh, &signed, 1).await;
    let took = start.elapsed();
    eprintln!("admission with planted leases: {took:?} (budget 8 s)");
    assert!(answers[0].0, "{}", answers[0].1);
    // Before sealed leases, each planted lease held the admission for half its budget.
    assert!(took < std::time::Duration::from_secs(2), "{took:?}");
    let m = fresh.metrics().await;
    assert_eq!(
        metric_sum(&m, "ivory_l2_events_total{event=\"leases_waited\"}"),
        0.0,
        "{m}"
    );
    assert!(
        metric_sum(&m, "ivory_l2_events_total{event=\"rejected\"}") >= 1.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_redis_without_a_key_is_refused() {
    let bad = Command::new(crate::util::BIN)
        .args([
            "serve",
            "--insecure-http",
            "--cache-redis",
            "redis://127.0.0.1:1",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let text = String::from_utf8_lossy(&bad.stderr);
    assert!(
        text.contains("--cache-redis needs --cache-redis-key"),
        "{text}"
    );
}
