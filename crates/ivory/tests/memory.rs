//! Peak memory of `ivory serve` (its real allocator) against hostile registries and a hostile
//! Redis behind `--cache-redis`: the growth of the process's peak RSS (`VmHWM`) over a run
//! against an honest registry (an honest redis-server).

use std::time::Duration;

use futures::future::join_all;
use ivory_testkit::{HostileOptions, HostileRedis, HostileServer, RedisAttack, RedisServer};
use serde_json::Value;

use crate::util::{
    Ivory, Tls, VERIFY_SIGNED, key_attestor, peak_rss_kib, pod_review, policies_dir, policy,
};

/// Bound on the extra peak memory of one hostile answer.
const ONE_MIB_BOUND: u64 = 16;
/// Bound on the extra peak memory of 32 concurrent hostile answers.
const MANY_MIB_BOUND: u64 = 64;
/// Concurrent admission requests per run.
const CONCURRENT: usize = 32;

/// Pins the digest (reads no manifest body).
const PIN: &str = "/ivpol/mutate/pin";
/// Verifies signatures (reads the signature manifest).
const VERIFY: &str = "/ivpol/validate/verify";

/// An SPDX attestation check by the fixture key with the transparency log required, so a
/// DSSE layer is parsed before any signature check.
fn verify_sbom() -> String {
    format!(
        "{}  attestations:\n    - name: sbom\n      intoto:\n        type: https://spdx.dev/Document\n  validations:\n    - expression: >-\n        images.containers.map(image, verifyAttestationSignatures(image, attestations.sbom, [attestors.key])).all(e, e > 0)\n      message: failed the image attestation verification\n",
        key_attestor().replace(
            "insecureIgnoreTlog: true",
            "url: https://rekor.sigstore.dev\n          insecureIgnoreTlog: false"
        )
    )
}

/// Starts a fresh `ivory serve` with pin and verify policies for images of `h`, warms it up
/// with one honest image, sends `repos` to `path` (one Pod each, all at once), and returns
/// the peak RSS in KiB and the responses.
async fn run(h: &HostileServer, path: &str, repos: &[String]) -> (u64, Vec<Value>) {
    let checks = format!("{}{VERIFY_SIGNED}", key_attestor());
    let (peak, responses, _) = run_with(h, path, repos, &checks).await;
    (peak, responses)
}

/// [`run`] with `checks` (attestors and validations) as the verify policy's checks; also
/// returns ivory's logs.
/// A `policies` folder in `dir` holding `pin`: every image of `h` pinned, nothing verified.
fn pin_policies(dir: &std::path::Path, h: &HostileServer) -> std::path::PathBuf {
    let policies = policies_dir(dir);
    let body = "  failurePolicy: Fail\n  credentials:\n    allowInsecureRegistry: true\n  attestors: []\n  validations:\n    - expression: \"true\"\n";
    std::fs::write(
        policies.join("pin.yaml"),
        policy("pin", &format!("{}/*", h.host()), body),
    )
    .unwrap();
    policies
}

async fn run_with(
    h: &HostileServer,
    path: &str,
    repos: &[String],
    checks: &str,
) -> (u64, Vec<Value>, String) {
    let dir = tempfile::tempdir().unwrap();
    let policies = pin_policies(dir.path(), h);
    let verify = format!(
        "  validationActions: [Deny]\n  failurePolicy: Fail\n  credentials:\n    allowInsecureRegistry: true\n  validationConfigurations:\n    mutateDigest: false\n    verifyDigest: false\n{checks}"
    );
    std::fs::write(
        policies.join("verify.yaml"),
        policy("verify", &format!("{}/*", h.host()), &verify),
    )
    .unwrap();
    let ivory = Ivory::start_policies(dir.path(), &policies).await;
    let warm = pod_review("warm", &[&format!("{}/good:warm", h.host())]);
    let resp = ivory.review(PIN, &warm).await;
    assert_eq!(resp["allowed"], true, "{resp}");
    let reviews: Vec<Value> = repos
        .iter()
        .enumerate()
        .map(|(i, repo)| {
            let image = format!("{}/{repo}:t{i}", h.host());
            pod_review(&format!("u{i}"), &[&image])
        })
        .collect();
    let url = format!("{path}?timeout=10s");
    let responses = join_all(reviews.iter().map(|r| ivory.review(&url, r))).await;
    let pid = ivory.child.id().unwrap();
    (peak_rss_kib(pid), responses, ivory.settled_logs().await)
}

fn all_denied(responses: &[Value]) {
    for r in responses {
        assert_eq!(r["allowed"], false, "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_answers_cannot_grow_ivory_memory_past_their_bounds() {
    let h = HostileServer::start(HostileOptions::default())
        .await
        .unwrap();
    let good: Vec<String> = vec!["good".into(); CONCURRENT];
    let (base_one, r) = run(&h, PIN, &good[..1]).await;
    assert_eq!(r[0]["allowed"], true, "{}", r[0]);
    let (base_many, r) = run(&h, PIN, &good).await;
    assert!(r.iter().all(|r| r["allowed"] == true));

    let (one, r) = run(&h, PIN, &["endless".to_string()]).await;
    all_denied(&r);
    // A valid manifest of tiny objects: small on the wire, huge as a parsed tree.
    let (objects, r) = run(&h, VERIFY, &["objects".to_string()]).await;
    all_denied(&r);
    // An attestation layer of tiny objects, parsed before any signature check.
    let (balloon, r, logs) =
        run_with(&h, VERIFY, &["balloonatt".to_string()], &verify_sbom()).await;
    all_denied(&r);
    assert!(
        logs.contains("signature blob refused for its JSON shape"),
        "{logs}"
    );
    let endless: Vec<String> = vec!["endless".into(); CONCURRENT];
    let (many, r) = run(&h, PIN, &endless).await;
    all_denied(&r);

    let extra_one = one.saturating_sub(base_one);
    let extra_many = many.saturating_sub(base_many);
    let extra_objects = objects.saturating_sub(base_one);
    let extra_balloon = balloon.saturating_sub(base_one);
    eprintln!(
        "peak RSS (KiB): honest 1 = {base_one}, endless 1 = {one} (+{extra_one}), \
         tiny objects 1 = {objects} (+{extra_objects}), \
         tiny-object attestation 1 = {balloon} (+{extra_balloon}); honest {CONCURRENT} = {base_many}, \
         endless {CONCURRENT} = {many} (+{extra_many})"
    );
    assert!(
        extra_one < ONE_MIB_BOUND * 1024,
        "one endless manifest: +{extra_one} KiB"
    );
    assert!(
        extra_objects < ONE_MIB_BOUND * 1024,
        "one manifest of tiny objects: +{extra_objects} KiB"
    );
    assert!(
        extra_balloon < ONE_MIB_BOUND * 1024,
        "one attestation of tiny objects: +{extra_balloon} KiB"
    );
    assert!(
        extra_many < MANY_MIB_BOUND * 1024,
        "{CONCURRENT} endless manifests: +{extra_many} KiB"
    );
}

/// Starts `ivory serve --cache-redis <redis_url>` with the pin policy for images of `h`, sends
/// [`CONCURRENT`] admissions of distinct tags (each a lookup in the shared cache), leaves the
/// store 2 s to send whatever it sends, and returns the peak RSS in KiB.
async fn run_l2(h: &HostileServer, redis_url: &str) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let policies = pin_policies(dir.path(), h);
    let key = dir.path().join("l2.key");
    std::fs::write(&key, "memory-test-hmac-key-0123456789abcdef0123456789").unwrap();
    let tls = Tls::write(dir.path(), "ivory test CA");
    let args = [
        "--policies".to_owned(),
        policies.display().to_string(),
        "--cache-redis".into(),
        redis_url.to_owned(),
        "--cache-redis-key".into(),
        key.display().to_string(),
    ];
    let ivory = Ivory::start(&tls, &args).await;
    let reviews: Vec<Value> = (0..CONCURRENT)
        .map(|i| pod_review(&format!("u{i}"), &[&format!("{}/good:l2-{i}", h.host())]))
        .collect();
    let url = format!("{PIN}?timeout=10s");
    let responses = join_all(reviews.iter().map(|r| ivory.review(&url, r))).await;
    for r in &responses {
        // The shared cache never decides: every answer is the registry's.
        assert_eq!(r["allowed"], true, "{r}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    peak_rss_kib(ivory.child.id().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_redis_cannot_grow_ivory_memory() {
    let h = HostileServer::start(HostileOptions::default())
        .await
        .unwrap();
    let honest = RedisServer::start().await.unwrap();
    let base = run_l2(&h, &honest.url()).await;
    let mut figures = vec![format!("honest redis-server = {base}")];
    let mut worst = 0;
    for attack in RedisAttack::ALL {
        let fake = HostileRedis::start(attack).await.unwrap();
        let peak = run_l2(&h, &fake.url()).await;
        let extra = peak.saturating_sub(base);
        figures.push(format!(
            "{attack:?} = {peak} (+{extra}; the fake handed over {} B)",
            fake.sent()
        ));
        worst = worst.max(extra);
    }
    eprintln!(
        "peak RSS (KiB) of ivory serve --cache-redis: {}",
        figures.join(", ")
    );
    assert!(
        worst < ONE_MIB_BOUND * 1024,
        "a hostile redis: +{worst} KiB ({})",
        figures.join(", ")
    );
}
