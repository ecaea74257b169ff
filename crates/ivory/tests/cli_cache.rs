//! The one-shot commands' persistent verification cache (`--cache-dir`) against the real
//! registry, counted in its access log: a second `ivory verify`, `apply` or `audit` over the
//! same images asks the registry nothing and gives the same verdicts; entries edited by hand
//! are ignored (the registry is asked again, as often as on a cold run, and the verdicts do
//! not change); a folder another local user owns is not trusted at all. `--nocapture` prints
//! the figures BENCHMARKS.md quotes.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use ivory_testkit::Harness;
use serde_json::Value;

use crate::cli_util::{
    Run, check_images_policies, ivory, key, push_fixture, registry_and_ca, write, write_ca,
};
use ivory_testkit::fixtures_dir;

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
    let dir = fixtures_dir().join("oci/ivory").join(layout);
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

/// A uid no account of this machine has: the test's other local user.
fn unused_uid() -> u32 {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let used: Vec<u32> = passwd
        .lines()
        .filter_map(|l| l.split(':').nth(2)?.parse().ok())
        .collect();
    (40_000..60_000).find(|u| !used.contains(u)).unwrap()
}

/// Runs `ivory <args>` as `uid` (and gid `uid`, no supplementary groups) with `setpriv`.
async fn ivory_as(uid: u32, home: &Path, args: &[String]) -> Run {
    let out = tokio::process::Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg("--")
        .arg(crate::util::BIN)
        .args(args)
        .env("IVORY_LOG", "warn")
        .env("HOME", home)
        .env_remove("IVORY_CACHE_DIR")
        .output()
        .await
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// root's `ivory verify --cache-dir` over a folder another local user made (with ivory, as
/// that user, so the folder, the key and a positive verdict sealed with it are theirs): the
/// folder is not trusted, said once on stderr, and the registry is asked. The image's
/// signature has since been replaced by one from another key, so trusting the folder would
/// pass an image that no longer verifies, with no registry request at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_folder_another_user_owns_is_not_trusted() {
    if !rustix::process::geteuid().is_root() {
        eprintln!(
            "SKIPPED a_cache_folder_another_user_owns_is_not_trusted: acting as another user (setpriv) needs root; CI runs as root"
        );
        return;
    }
    let (h, _dir, _) = registry_and_ca().await;
    let (_, digest) = push_fixture(&h, "unsigned").await;
    let image = format!("{}/ivory/unsigned@{digest}", h.host());
    let signer = ivory_testkit::CosignSigner::generate().unwrap();
    h.push_cosign_signature("ivory/unsigned", &digest, &signer)
        .await
        .unwrap();
    // Files the other user can read, and a home of theirs to keep the cache in.
    let uid = unused_uid();
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ca = write_ca(shared.path(), &h);
    let public = write(shared.path(), "key.pub", &signer.public_pem);
    for file in [&ca, &public] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let home = shared.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
    let cache = home.join("cache");
    let args: Vec<String> = vec![
        "verify".into(),
        "--registry-ca".into(),
        ca.display().to_string(),
        "--key".into(),
        public.display().to_string(),
        "--insecure-ignore-tlog".into(),
        "--cache-dir".into(),
        cache.display().to_string(),
        image.clone(),
    ];

    // The other user's own cache serves them: a second run asks the registry nothing.
    let first = ivory_as(uid, &home, &args).await;
    assert_eq!(first.code, 0, "{}\n{}", first.stdout, first.stderr);
    h.reset_requests();
    let warm = ivory_as(uid, &home, &args).await;
    assert_eq!(warm.code, 0, "{}\n{}", warm.stdout, warm.stderr);
    assert_eq!(h.requests().len(), 0, "{:?}", h.requests());
    let owner = std::fs::metadata(cache.join("key")).unwrap().uid();
    assert_eq!(owner, uid, "the key is the other user's");

    // The signature replaced: the image is no longer signed by the key.
    let other = ivory_testkit::CosignSigner::generate().unwrap();
    h.push_cosign_signature("ivory/unsigned", &digest, &other)
        .await
        .unwrap();

    // root, over the other user's folder: not trusted, said once, the registry asked.
    h.reset_requests();
    let run = ivory(&args).await;
    assert_eq!(
        run.code, 1,
        "an entry of another user's folder was trusted\n{}\n{}",
        run.stdout, run.stderr
    );
    assert!(!h.requests().is_empty());
    let said = run
        .stderr
        .matches("running without the verification cache")
        .count();
    assert_eq!(said, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "owned by uid {uid}, not by the user running ivory (uid 0) or root"
        )),
        "{}",
        run.stderr
    );
    // Nothing of root's was written there.
    let owners: Vec<u32> = std::fs::read_dir(cache.join("entries"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().uid())
        .collect();
    assert!(owners.iter().all(|&o| o == uid), "{owners:?}");
}
