//! The one-shot commands' persistent verification cache (`--cache-dir`) against the real
//! registry, counted in its access log: a second `ivory verify`, `apply` or `audit` over the
//! same images asks the registry nothing and gives the same verdicts; entries edited by hand
//! are ignored (the registry is asked again, as often as on a cold run, and the verdicts do
//! not change). `--nocapture` prints the figures BENCHMARKS.md quotes.

use std::path::Path;

use ivory_testkit::Harness;
use serde_json::Value;

use crate::cli_util::{
    Run, check_images_policies, ivory, key, push_fixture, registry_and_ca, write,
};
use crate::util::fixtures;

/// Runs `args` against the registry and returns the run, the registry requests it made and
/// its wall time in milliseconds.
async fn counted(h: &Harness, args: &[String]) -> (Run, usize, u128) {
    h.reset_requests();
    let started = ivory_clock::now();
    let run = ivory(args).await;
    let millis = started.elapsed().as_millis();
    (run, h.requests().len(), millis)
}

/// The verdicts of a JSON report, without timings.
fn verdicts(doc: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = doc["images"]
        .as_array()
        .map(|images| {
            images
                .iter()
                .map(|i| (i["image"].to_string(), i["verdict"].to_string()))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Flips a byte in the middle of every entry file (what a hand edit of a verdict does).
fn edit_every_entry(cache: &Path) -> usize {
    let mut edited = 0;
    for entry in std::fs::read_dir(cache.join("entries")).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x01;
        std::fs::write(&path, bytes).unwrap();
        edited += 1;
    }
    edited
}

/// Images per kind (signed, unsigned) in the `verify` runs: enough that the figures printed
/// (and quoted in BENCHMARKS.md) are about verification, not process start.
const COPIES: usize = 20;

/// Pushes fixture `layout` as `ivory/<layout>-<i>` for `i` in `0..COPIES`: distinct
/// repositories, so distinct signature lookups, of one digest.
async fn push_copies(h: &Harness, layout: &str) -> Vec<String> {
    let dir = fixtures().join("oci/ivory").join(layout);
    let mut images = Vec::new();
    for i in 0..COPIES {
        let repo = format!("ivory/{layout}-{i}");
        h.push_oci_layout(&dir, &repo).await.unwrap();
        images.push(format!("{}/{repo}:v1", h.host()));
    }
    images
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_asks_the_registry_nothing_and_hand_edits_are_ignored() {
    let (h, dir, ca) = registry_and_ca().await;
    let (signed, _) = push_fixture(&h, "sig-p256").await;
    let (unsigned, _) = push_fixture(&h, "unsigned").await;
    let mut many = push_copies(&h, "sig-p256").await;
    many.extend(push_copies(&h, "unsigned").await);
    let cache = dir.path().join("cache");
    // Each command gets a cache of its own, so each first run is cold.
    let common = |command: &str| -> Vec<String> {
        vec![
            command.to_owned(),
            "--registry-ca".into(),
            ca.display().to_string(),
            "--cache-dir".into(),
            cache.join(command).display().to_string(),
            "-o".into(),
            "json".into(),
        ]
    };

    // verify: signed and unsigned images (positive and negative verdicts).
    let mut verify = common("verify");
    verify.extend([
        "--key".into(),
        key("cosign-p256.pub").display().to_string(),
        "--insecure-ignore-tlog".into(),
        signed.clone(),
        unsigned.clone(),
    ]);
    verify.extend(many.iter().cloned());
    let (first, cold_requests, cold_ms) = counted(&h, &verify).await;
    assert_eq!(first.code, 1, "{}\n{}", first.stdout, first.stderr);
    let (second, warm_requests, warm_ms) = counted(&h, &verify).await;
    assert_eq!(second.code, 1, "{}\n{}", second.stdout, second.stderr);
    assert_eq!(verdicts(&first.json()), verdicts(&second.json()));
    assert!(cold_requests > 0);
    assert_eq!(
        warm_requests,
        0,
        "the second verify asked the registry: {:?}",
        h.requests()
    );
    eprintln!(
        "verify ({} images): first run {cold_requests} registry requests in {cold_ms} ms, second {warm_requests} in {warm_ms} ms",
        many.len() + 2
    );

    // Entries edited by hand are ignored: the registry is asked again, nothing changes.
    assert!(
        edit_every_entry(&cache.join("verify")) >= 4 * COPIES,
        "tags and verdicts of every image"
    );
    let (edited, requests, _) = counted(&h, &verify).await;
    assert_eq!(verdicts(&first.json()), verdicts(&edited.json()));
    assert_eq!(
        requests, cold_requests,
        "edited entries were used: {requests} requests, {cold_requests} cold"
    );
    let (again, requests, _) = counted(&h, &verify).await;
    assert_eq!(verdicts(&first.json()), verdicts(&again.json()));
    assert_eq!(requests, 0, "the entries written again after the edit");

    // apply: a policy file, a Pod; its verdicts are keyed like serve's (digest + trust).
    let policies = check_images_policies(dir.path(), &h);
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\nspec:\n  containers:\n    - name: a\n      image: {signed}\n    - name: b\n      image: {unsigned}\n"
    );
    let resources = write(dir.path(), "pod.yaml", &pod);
    let mut apply = common("apply");
    apply.extend([
        "--policy".into(),
        policies.display().to_string(),
        "--resource".into(),
        resources.display().to_string(),
    ]);
    let (first, cold_requests, cold_ms) = counted(&h, &apply).await;
    assert_eq!(first.code, 1, "{}\n{}", first.stdout, first.stderr);
    let (second, warm_requests, warm_ms) = counted(&h, &apply).await;
    assert_eq!(first.stdout, second.stdout);
    assert!(cold_requests > 0);
    assert_eq!(warm_requests, 0, "the second apply: {:?}", h.requests());
    eprintln!(
        "apply (1 Pod, 2 images): first run {cold_requests} registry requests in {cold_ms} ms, second {warm_requests} in {warm_ms} ms"
    );

    // audit: the same images as verify, from a list.
    let mut lines = format!("{signed}\n{unsigned}\n");
    for image in &many {
        lines.push_str(image);
        lines.push('\n');
    }
    let list = write(dir.path(), "images.txt", &lines);
    let mut audit = common("audit");
    audit.extend([
        "--images-from".into(),
        list.display().to_string(),
        "--policy".into(),
        policies.display().to_string(),
    ]);
    let (first, cold_requests, cold_ms) = counted(&h, &audit).await;
    assert_eq!(first.code, 1, "{}\n{}", first.stdout, first.stderr);
    let (second, warm_requests, warm_ms) = counted(&h, &audit).await;
    assert_eq!(verdicts(&first.json()), verdicts(&second.json()));
    assert!(cold_requests > 0);
    assert_eq!(warm_requests, 0, "the second audit: {:?}", h.requests());
    eprintln!(
        "audit ({} images): first run {cold_requests} registry requests in {cold_ms} ms, second {warm_requests} in {warm_ms} ms",
        many.len() + 2
    );

    // --no-cache: the registry again.
    let mut uncached = verify.clone();
    uncached.push("--no-cache".into());
    let (_, requests, _) = counted(&h, &uncached).await;
    assert!(requests > 0);
}
