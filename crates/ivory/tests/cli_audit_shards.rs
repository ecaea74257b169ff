//! Sharded `ivory audit` against the real registry: four shards (`--shard I/4 --shard-out`)
//! merged with `--merge` give the single process's report in every format; a merge with a
//! shard missing or unfinished refuses and names it; a shard cut off mid-run resumes without
//! counting an image twice or checking again what it finished; an image no shard can reach is
//! that shard's error, never a pass; with `--cache-redis` no shard verifies what another did.

use std::path::Path;

use ivory_testkit::{RedisServer, RegistryHarness};
use serde_json::Value;

use crate::cli_audit::{audit_args, corpus, sig_fetches};
use crate::cli_util::{Run, ivory};

const SHARDS: u32 = 4;
/// An image on a port nothing listens on: the shard that owns it cannot reach it.
const UNREACHABLE: &str = "127.0.0.1:1/gone/app:v1";

/// The audit's arguments for the corpus registry and the unreachable image, plus `extra`.
fn args(base: &[String], host: &str, list: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = base.to_vec();
    args.extend(
        ["--registry", host, "--images-from", list.to_str().unwrap()]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned()),
    );
    args
}

async fn shard(base: &[String], index: u32, parts: &Path, extra: &[&str]) -> Run {
    let label = format!("{index}/{SHARDS}");
    let mut all = vec!["--shard", &label, "--shard-out", parts.to_str().unwrap()];
    all.extend_from_slice(extra);
    let mut args = base.to_vec();
    args.extend(all.iter().map(|s| (*s).to_owned()));
    ivory(&args).await
}

/// The PolicyReport without its timestamps, which differ between runs.
fn report_without_time(path: &Path) -> Value {
    let mut report: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    if let Some(results) = report["results"].as_array_mut() {
        for result in results {
            result
                .as_object_mut()
                .map(|r| r.remove("timestamp"))
                .unwrap_or_default();
        }
    }
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_shards_merge_into_the_single_process_report_and_resume_after_a_kill() {
    let h = RegistryHarness::start_default().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (images, _) = corpus(&h, dir.path()).await;
    let list = dir.path().join("images.txt");
    std::fs::write(&list, format!("{UNREACHABLE}\n")).unwrap();
    let base = audit_args(&h, dir.path(), &[]);
    let host = h.host().to_owned();
    let formats = |name: &str| -> Vec<String> {
        let report = dir.path().join(format!("{name}.yaml"));
        vec![
            "-o".into(),
            "json".into(),
            "--policy-report".into(),
            report.display().to_string(),
        ]
    };

    let single = ivory(
        args(&base, &host, &list, &[])
            .iter()
            .chain(&formats("single")),
    )
    .await;
    assert_eq!(single.code, 2, "an unreachable image: {}", single.stderr);
    let single_doc = single.json();
    assert_eq!(single_doc["summary"]["images"], images.len() + 1);
    assert_eq!(single_doc["summary"]["error"], 1);

    // Three of four shards: the merge refuses and names the missing one.
    let parts = dir.path().join("parts");
    let shard_base = args(&base, &host, &list, &[]);
    let mut owner_of_unreachable = None;
    for index in 0..SHARDS - 1 {
        let run = shard(&shard_base, index, &parts, &["-o", "json"]).await;
        assert_eq!(run.code, 0, "a finished shard exits 0: {}", run.stderr);
        let doc = run.json();
        if doc["images"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["image"] == UNREACHABLE)
        {
            owner_of_unreachable = Some(index);
            assert_eq!(doc["summary"]["error"], 1, "the shard's own error: {doc}");
        }
    }
    let merge = |extra: Vec<String>| {
        let mut args = vec![
            "audit".to_owned(),
            "--merge".to_owned(),
            parts.display().to_string(),
        ];
        args.extend(extra);
        ivory(args)
    };
    let partial = merge(formats("partial")).await;
    assert_ne!(partial.code, 0);
    assert!(
        partial.stderr.contains("shard 3/4: no part"),
        "{}",
        partial.stderr
    );
    assert!(
        partial.stdout.is_empty(),
        "nothing merged: {}",
        partial.stdout
    );

    let last = shard(&shard_base, SHARDS - 1, &parts, &[]).await;
    assert_eq!(last.code, 0, "{}", last.stderr);
    if owner_of_unreachable.is_none() {
        owner_of_unreachable = Some(SHARDS - 1);
    }
    let merged = merge(formats("merged")).await;
    assert_eq!(merged.code, single.code, "{}", merged.stderr);
    assert_eq!(
        merged.json(),
        single_doc,
        "the merged report is the single one"
    );
    assert_eq!(
        report_without_time(&dir.path().join("merged.yaml")),
        report_without_time(&dir.path().join("single.yaml"))
    );
    let owner = owner_of_unreachable.unwrap();
    assert!(
        merged
            .stderr
            .lines()
            .any(|l| l.starts_with(&format!("shard {owner}/4:")) && l.ends_with(", 1 error")),
        "the unreachable image is its shard's error: {}",
        merged.stderr
    );
    let sarif = |run: Run| run.json();
    let single_sarif = sarif(ivory(args(&base, &host, &list, &["-o", "sarif"])).await);
    let merged_sarif = sarif(merge(vec!["-o".into(), "sarif".into()]).await);
    assert_eq!(merged_sarif, single_sarif);

    // Shard 0 cut off mid-run: half its part kept, a line torn, no marker. Run again, it
    // resumes: only what it had not finished is checked, and the merge is the same.
    let part = parts.join("shard-0-of-4.jsonl");
    let text = std::fs::read_to_string(&part).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 4, "shard 0 holds {} reports", lines.len());
    let kept = lines.len() / 2;
    let mut cut = lines[..kept].join("\n");
    cut.push('\n');
    cut.push_str(&lines[kept][..lines[kept].len() / 2]);
    std::fs::write(&part, cut).unwrap();
    std::fs::remove_file(parts.join("shard-0-of-4.done.json")).unwrap();
    // Errors are checked again; verdicts are kept.
    let verdicts = lines[..kept]
        .iter()
        .filter(|l| serde_json::from_str::<Value>(l).unwrap()["verdict"] != "Error")
        .count();
    let unfinished = merge(Vec::new()).await;
    assert!(
        unfinished.stderr.contains("shard 0/4: unfinished"),
        "{}",
        unfinished.stderr
    );
    h.reset_requests();
    let resumed = shard(&shard_base, 0, &parts, &[]).await;
    assert_eq!(resumed.code, 0, "{}", resumed.stderr);
    assert!(
        resumed
            .stderr
            .contains(&format!("shard 0/4: resuming, {verdicts} images finished")),
        "{}",
        resumed.stderr
    );
    let fetched = sig_fetches(&h).len();
    assert!(
        fetched <= lines.len() - verdicts,
        "resumed shard checked {fetched} signatures again for {} unfinished images",
        lines.len() - verdicts
    );
    let merged = merge(formats("merged")).await;
    assert_eq!(merged.json(), single_doc, "no image counted twice");

    // A done shard started again does nothing.
    let again = shard(&shard_base, 0, &parts, &[]).await;
    assert_eq!(again.code, 0);
    assert!(
        again.stderr.contains("shard 0/4 is complete"),
        "{}",
        again.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_sharing_the_redis_cache_verify_each_digest_once() {
    let h = RegistryHarness::start_default().await.unwrap();
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (images, _) = corpus(&h, dir.path()).await;
    let key = dir.path().join("cache.key");
    std::fs::write(&key, "k".repeat(40)).unwrap();
    let url = redis.url();
    let base = audit_args(
        &h,
        dir.path(),
        &[
            "--registry",
            h.host(),
            "--cache-redis",
            &url,
            "--cache-redis-key",
            key.to_str().unwrap(),
        ],
    );
    let parts = dir.path().join("parts");
    // Each shard twice over the same listing: the second time every verdict is in Redis.
    h.reset_requests();
    for index in 0..SHARDS {
        let run = shard(&base, index, &parts, &[]).await;
        assert_eq!(run.code, 0, "{}", run.stderr);
    }
    let first = sig_fetches(&h);
    let distinct: std::collections::BTreeSet<&String> = images.values().collect();
    assert!(
        first.values().all(|n| *n == 1),
        "a digest verified by two shards: {first:?}"
    );
    assert_eq!(first.len(), distinct.len());

    h.reset_requests();
    let other = dir.path().join("again");
    for index in 0..SHARDS {
        let run = shard(&base, index, &other, &[]).await;
        assert_eq!(run.code, 0, "{}", run.stderr);
    }
    assert!(
        sig_fetches(&h).is_empty(),
        "verdicts in the shared cache were verified again: {:?}",
        sig_fetches(&h)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_generator_writes_an_indexed_job_running_this_audit_sharded() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("signed.yaml");
    let body = format!(
        "{}{}",
        crate::util::key_attestor(),
        crate::util::VERIFY_SIGNED
    );
    std::fs::write(
        &policy,
        crate::util::policy("require-signed", "registry.test/*", &body),
    )
    .unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "PEM").unwrap();
    let base = [
        "audit",
        "--policy",
        policy.to_str().unwrap(),
        "--registry",
        "registry.test",
        "--registry-ca",
        ca.to_str().unwrap(),
        "--job",
        "audit-all",
        "--job-shards",
        "6",
        "--job-parallelism",
        "3",
        "--job-image",
        "registry.test/ivory@sha256:00",
        "--job-parts-claim",
        "audit-parts",
    ];
    let refused = ivory(base).await;
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("--job-registry-ca-configmap"),
        "a CA file cannot go into a Pod: {}",
        refused.stderr
    );
    let mut with_ca = base.to_vec();
    with_ca.extend(["--job-registry-ca-configmap", "registry-ca"]);
    let run = ivory(&with_ca).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let docs: Vec<Value> = serde_saphyr::from_multiple(&run.stdout).unwrap();
    let (config_map, job) = (&docs[0], &docs[1]);
    assert_eq!(config_map["kind"], "ConfigMap");
    assert_eq!(
        config_map["data"]["signed.yaml"],
        std::fs::read_to_string(&policy).unwrap().as_str()
    );
    assert_eq!(job["kind"], "Job");
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    assert_eq!(spec["completions"], 6);
    assert_eq!(spec["parallelism"], 3);
    assert_eq!(spec["backoffLimitPerIndex"], 3);
    let pod = &spec["template"]["spec"];
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let after = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
    assert_eq!(after("--shard"), "$(JOB_COMPLETION_INDEX)/6");
    assert_eq!(after("--shard-out"), "/var/lib/ivory-audit/audit-all");
    assert_eq!(after("--registry"), "registry.test");
    assert_eq!(after("--registry-ca"), "/etc/ivory/registry-ca/ca.crt");
    assert_eq!(after("--policy"), "/etc/ivory/audit-policies");
    let volumes = pod["volumes"].to_string();
    assert!(
        volumes.contains("audit-parts") && volumes.contains("registry-ca"),
        "{volumes}"
    );
}
