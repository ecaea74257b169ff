//! `ivory audit` as a process against the real registry: a catalog of 52 tags in several
//! repositories (signed fixtures, unsigned fixtures, generated images, one digest under two
//! tags), paginated listings, dedup by digest, the output formats and Ctrl-C.

use std::collections::BTreeMap;
use std::time::Duration;

use ivory_testkit::{Harness, HungRegistry, RegistryHarness, write_simple_image};
use serde_json::Value;

use crate::cli_util::{
    Run, ivory, push_fixture, retag_fixture, write, write_ca, write_require_signed,
};
use crate::util::{BIN, VERIFY_SIGNED, key_attestor, policy};
use ivory_testkit::eventually;

/// Generated unsigned images: `gen/<repo>:t<n>`, 16 per repository.
const GENERATED: [&str; 3] = ["gen/alpha", "gen/beta", "team/gamma"];
const PER_REPO: usize = 16;

/// Pushes the audit corpus; returns (image → digest, signed images).
pub(crate) async fn corpus(
    h: &Harness,
    dir: &std::path::Path,
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut images = BTreeMap::new();
    let (signed, signed_digest) = push_fixture(h, "sig-p256").await;
    // The same digest under a second tag: verified once.
    retag_fixture(h, "sig-p256", "ivory/sig-p256", &signed_digest, "latest").await;
    let signed_latest = signed.replace(":v1", ":latest");
    images.insert(signed.clone(), signed_digest.clone());
    images.insert(signed_latest.clone(), signed_digest);
    for layout in ["unsigned", "sig-wrong-key"] {
        let (image, digest) = push_fixture(h, layout).await;
        images.insert(image, digest);
    }
    for repo in GENERATED {
        for n in 0..PER_REPO {
            let layout = dir.join(format!("{}-{n}", repo.replace('/', "-")));
            let tag = format!("t{n}");
            let img = write_simple_image(&layout, &tag, &format!("{repo}-{n}")).unwrap();
            h.push_oci_layout(&layout, repo).await.unwrap();
            images.insert(format!("{}/{repo}:{tag}", h.host()), img.manifest.digest);
        }
    }
    (images, vec![signed, signed_latest])
}

pub(crate) fn sig_fetches(h: &Harness) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (method, uri, _) in h.requests() {
        if method == "GET" && uri.contains("/manifests/sha256-") && uri.ends_with(".sig") {
            *counts.entry(uri).or_insert(0) += 1;
        }
    }
    counts
}

pub(crate) fn audit_args(h: &Harness, dir: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let policy = write_require_signed(dir, "signed.yaml", h);
    let mut args: Vec<String> = vec![
        "audit".into(),
        "--policy".into(),
        policy.display().to_string(),
        "--registry-ca".into(),
        write_ca(dir, h).display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_audit_counts_dedup_and_formats() {
    let h = RegistryHarness::start_default().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (images, signed) = corpus(&h, dir.path()).await;
    assert_eq!(images.len(), 52);
    let distinct = images.len() - 1;
    let report_path = dir.path().join("report.yaml");
    h.reset_requests();

    let host = h.host().to_owned();
    let args = audit_args(
        &h,
        dir.path(),
        &[
            "--registry",
            &host,
            "--page-size",
            "5",
            "--concurrency",
            "6",
            "-o",
            "json",
            "--policy-report",
            report_path.to_str().unwrap(),
        ],
    );
    let run = ivory(&args).await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    let summary = &doc["summary"];
    assert_eq!(summary["images"], 52, "{summary}");
    assert_eq!(summary["digests"], distinct);
    assert_eq!(summary["pass"], 2);
    assert_eq!(summary["fail"], 50);
    assert_eq!(summary["error"], 0);
    assert_eq!(summary["interrupted"], false);
    assert!(
        run.stderr
            .contains("52 images (51 digests): 2 pass, 50 fail, 0 error"),
        "{}",
        run.stderr
    );
    let listed = doc["images"].as_array().unwrap();
    let got: BTreeMap<String, String> = listed
        .iter()
        .map(|i| {
            (
                i["image"].as_str().unwrap().to_owned(),
                i["digest"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(got, images);
    for entry in listed {
        let image = entry["image"].as_str().unwrap();
        let expected = if signed.iter().any(|s| s == image) {
            "pass"
        } else {
            "fail"
        };
        assert_eq!(entry["verdict"], expected, "{entry}");
        assert_eq!(entry["policies"][0]["policy"], "require-signed");
    }

    // One verification per distinct digest, and the listings were paginated.
    let fetches = sig_fetches(&h);
    assert_eq!(fetches.len(), distinct, "{fetches:?}");
    assert!(fetches.values().all(|n| *n == 1), "{fetches:?}");
    let requests = h.requests();
    let pages = |path: &str| {
        requests
            .iter()
            .filter(|(m, uri, _)| m == "GET" && uri.starts_with(path))
            .count()
    };
    assert!(pages("/v2/_catalog") >= 2, "catalog not paginated");
    assert!(
        requests
            .iter()
            .any(|(_, uri, _)| uri.starts_with("/v2/_catalog?") && uri.contains("last=")),
        "catalog not followed past the first page"
    );
    // Distribution 2.8 ignores `n` for tag lists (answers every tag at once), so tag paging is
    // covered by ivory-registry's own tests; here every tag was found (checked above).

    // The PolicyReport parses back with the same counts.
    let report: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    assert_eq!(report["apiVersion"], "wgpolicyk8s.io/v1alpha2");
    assert_eq!(report["kind"], "ClusterPolicyReport");
    assert_eq!(report["summary"]["pass"], 2);
    assert_eq!(report["summary"]["fail"], 50);
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 52);
    let first = &results[0];
    assert_eq!(first["policy"], "require-signed");
    assert_eq!(first["source"], "ivory");
    assert!(
        first["properties"]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );

    // --repository filters the catalog; SARIF lists the failures; --exit-zero.
    let args = audit_args(
        &h,
        dir.path(),
        &[
            "--registry",
            &host,
            "--repository",
            "gen/*",
            "-o",
            "sarif",
            "--exit-zero",
        ],
    );
    let run = ivory(&args).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let sarif = run.json();
    assert_eq!(sarif["version"], "2.1.0");
    let results = sarif["runs"][0]["results"].as_array().unwrap();
    assert_eq!(results.len(), 2 * PER_REPO);
    assert!(results.iter().all(|r| r["ruleId"] == "require-signed"));
    let located = results[0]["locations"][0]["logicalLocations"][0]["name"]
        .as_str()
        .unwrap();
    assert!(located.starts_with(&format!("{host}/gen/")), "{located}");

    // Table output ends with the summary line.
    let args = audit_args(
        &h,
        dir.path(),
        &["--registry", &host, "--repository", "ivory/*"],
    );
    let run = ivory(&args).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stdout
            .ends_with("4 images (3 digests): 2 pass, 2 fail, 0 error\n"),
        "{}",
        run.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_from_file_errors_and_interrupt() {
    let h = RegistryHarness::start_default().await.unwrap();
    let hung = HungRegistry::start().await.unwrap();
    let (signed, signed_digest) = push_fixture(&h, "sig-p256").await;
    let dir = tempfile::tempdir().unwrap();
    let stuck = format!("{}/stuck/app:v1", hung.host());
    let list = write(
        dir.path(),
        "images.txt",
        &format!("# audit list\n{signed}\n\n{signed}\n{stuck}\n"),
    );
    let args = audit_args(
        &h,
        dir.path(),
        &["--images-from", list.to_str().unwrap(), "-o", "json"],
    );
    let child = spawn_cold(&args);
    // Interrupt once the signed image is verified (its signature was fetched).
    let fetched = eventually(
        "the signed image's signature to be fetched",
        Duration::from_secs(30),
        || async { !sig_fetches(&h).is_empty() },
    )
    .await
    .is_ok();
    assert!(fetched, "the signed image was never verified");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = child.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("audit did not stop on SIGINT")
        .unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert_eq!(run.code, 130, "{}\n{}", run.stdout, run.stderr);
    let doc = run.json();
    assert_eq!(doc["summary"]["interrupted"], true);
    assert_eq!(
        doc["summary"]["found"], 2,
        "duplicates in the list count once"
    );
    assert_eq!(doc["summary"]["images"], 1);
    assert_eq!(doc["images"][0]["image"], signed);
    assert_eq!(doc["images"][0]["digest"], signed_digest);
    assert_eq!(doc["images"][0]["verdict"], "pass");
    assert!(run.stderr.contains("interrupted"), "{}", run.stderr);

    // Without the hung registry, an unreachable one is an error naming image and registry.
    let refused = format!("{}/gone/app:v1", ivory_testkit::refused_host().unwrap());
    let list = write(dir.path(), "images2.txt", &format!("{signed}\n{refused}\n"));
    let args = audit_args(
        &h,
        dir.path(),
        &["--images-from", list.to_str().unwrap(), "-o", "yaml"],
    );
    let run = ivory(&args).await;
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let doc: Value = serde_saphyr::from_str(&run.stdout).unwrap();
    assert_eq!(doc["summary"]["pass"], 1);
    assert_eq!(doc["summary"]["error"], 1);
    let failed = doc["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["image"] == refused.as_str())
        .unwrap();
    assert_eq!(failed["verdict"], "error");
    let message = failed["message"].as_str().unwrap();
    assert!(message.contains(&refused), "{message}");
    assert!(
        message.contains(refused.split('/').next().unwrap()),
        "{message}"
    );

    // A registry whose catalog cannot be listed fails the audit, naming the registry.
    let gone = ivory_testkit::refused_host().unwrap();
    let run = ivory(audit_args(&h, dir.path(), &["--registry", &gone])).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains(&format!("catalog of registry {gone}")),
        "{}",
        run.stderr
    );

    // Nothing to audit is a usage error.
    let run = ivory(audit_args(&h, dir.path(), &[])).await;
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--registry"), "{}", run.stderr);
}

/// Starts `ivory <args>` with its output piped and without the persistent cache: each run
/// measures a cold start.
fn spawn_cold(args: &[String]) -> tokio::process::Child {
    tokio::process::Command::new(BIN)
        .args(args)
        .env("IVORY_LOG", "warn")
        .env("IVORY_NO_CACHE", "true")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Runs `ivory <args>` to completion, sampling its peak RSS (`VmHWM`, KiB) while it runs:
/// the last sample is within a few milliseconds of the end.
async fn ivory_with_peak(args: &[String]) -> (Run, u64) {
    let child = spawn_cold(args);
    let pid = child.id().unwrap();
    let sampler = tokio::spawn(async move {
        let mut peak = 0;
        while let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            // A zombie has no VmHWM line: the sampler stops there.
            let Some(kib) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            else {
                break;
            };
            peak = peak.max(kib);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        peak
    });
    let out = tokio::time::timeout(Duration::from_secs(600), child.wait_with_output())
        .await
        .expect("audit did not end")
        .unwrap();
    let peak = sampler.await.unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    (run, peak)
}

/// A control character a terminal would act on (see `output::terminal`).
fn acts_on_terminal(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}'
        )
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

/// Extra peak RSS the hostile listing may cost over a tiny audit of the same registry: the
/// reports of the 10,000 images it lists (measured: about +45 MiB in a debug build, linear in
/// `--max-images`, whatever the listing's size).
const HOSTILE_LISTING_MIB_BOUND: u64 = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_listings_are_streamed_bounded_validated_and_escaped() {
    use ivory_testkit::{HOSTILE_TAGS, HostileOptions, HostileServer};
    let h = HostileServer::start(HostileOptions::default())
        .await
        .unwrap();
    let host = h.host();
    let dir = tempfile::tempdir().unwrap();
    let body = format!("{}{VERIFY_SIGNED}", key_attestor());
    let policy = write(
        dir.path(),
        "signed.yaml",
        &policy("require-signed", &format!("{host}/*"), &body),
    );
    // Text of the operator's own list reaches the table too (an unparsable reference).
    let forged = format!("{host}/evil\x1b]0;owned\x07:v1\u{202e}\x1b[2K");
    let list = write(dir.path(), "images.txt", &format!("{forged}\n"));
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = vec![
            "audit".into(),
            "--policy".into(),
            policy.display().to_string(),
            "--registry".into(),
            host.clone(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };

    // The control: the same registry, only the small repository.
    let (small, base) = ivory_with_peak(&args(&["--repository", "ctrl"])).await;
    assert_eq!(small.code, 2, "{}\n{}", small.stdout, small.stderr);
    assert!(
        small.stdout.contains(&format!(
            "{host}/ctrl: {} tags outside the OCI distribution grammar skipped",
            HOSTILE_TAGS.len()
        )),
        "{}",
        small.stdout
    );

    // Endless pages of ~4000-byte names outside the grammar (and a few valid tags) in
    // `pages`: the default --max-images stops the listing; every invalid name is counted,
    // none is shown; nothing printed can drive the terminal.
    let started = ivory_clock::now();
    let (run, peak) = ivory_with_peak(&args(&["--images-from", list.to_str().unwrap()])).await;
    let took = started.elapsed();
    assert_eq!(run.code, 2, "{}", run.stderr);
    for (name, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
        let bad: Vec<char> = text.chars().filter(|c| acts_on_terminal(*c)).collect();
        assert!(bad.is_empty(), "{name} holds {bad:?}");
    }
    assert!(
        !run.stdout.contains("xxxxxxxx"),
        "an invalid name was shown"
    );
    let lines: Vec<&str> = run.stdout.lines().collect();
    let summary = lines.last().unwrap();
    // 10,000 listed images, the forged line, and one entry each: the catalog's invalid
    // names, `ctrl`'s and `pages`' invalid tags, `good`'s failed tag listing, the stop.
    let total = 10_000 + 1 + 5;
    assert_eq!(
        *summary,
        format!(
            "{total} images (0 digests): 0 pass, 0 fail, {total} error (listing stopped at --max-images)"
        ),
        "{}",
        run.stderr
    );
    // One record, one line.
    assert_eq!(lines.len(), total + 1);
    for want in [
        format!("ERROR  {host}: 3 repository names outside the OCI distribution grammar skipped"),
        format!(
            "ERROR  {host}: listing stopped at --max-images 10000: the registry lists more images"
        ),
        format!("ERROR  {host}/pages: 90000 tags outside the OCI distribution grammar skipped"),
        format!("{host}/evil\\x1b]0;owned\\x07:v1\\u{{202e}}\\x1b[2K"),
    ] {
        assert!(
            run.stdout.contains(&want),
            "{want}\n{}",
            &run.stdout[..run.stdout.len().min(4000)]
        );
    }
    let last_page = ivory_testkit::pages_tag(99, 98);
    assert!(run.stdout.contains(&format!("{host}/pages:{last_page}")));
    assert!(!run.stdout.contains(&ivory_testkit::pages_tag(99, 99)));
    // No page was fetched past the bound, and the catalog's Link to another origin was not
    // followed.
    let requests = h.requests();
    let tag_pages = requests
        .iter()
        .filter(|r| r.path == "/v2/pages/tags/list")
        .count();
    assert_eq!(tag_pages, 100);
    assert_eq!(
        requests.iter().filter(|r| r.path == "/v2/_catalog").count(),
        2,
        "one catalog page per run"
    );

    let extra = peak.saturating_sub(base);
    eprintln!(
        "peak RSS (KiB): ctrl only = {base}, 100 hostile pages (~360 MiB of names, 10,000 images) = {peak} (+{extra}); took {took:?}"
    );
    assert!(
        extra < HOSTILE_LISTING_MIB_BOUND * 1024,
        "hostile listing: +{extra} KiB"
    );
}
