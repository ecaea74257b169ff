//! `ivory serve` as a process over HTTPS, against the real registry (ivory-testkit) with the
//! cosign-signed fixtures in `fixtures/oci/ivory`.

use std::time::Duration;

use futures::StreamExt as _;

use base64::Engine as _;
use ivory_testkit::{
    HOSTILE_SECRET, Harness, HostileOptions, HostileServer, HungRegistry, RegistryHarness,
};
use serde_json::{Value, json};

use crate::util::{Ivory, Tls, VERIFY_SIGNED, key_attestor, pod_review, policies_dir, policy};
use ivory_testkit::eventually;
use ivory_testkit::fixtures_dir;

async fn push(h: &Harness, layout: &str) -> (String, String) {
    h.push_fixture(layout).await.unwrap()
}

fn write(dir: &std::path::Path, file: &str, text: &str) {
    std::fs::write(dir.join(file), text).unwrap();
}

const NO_DIGEST_RULES: &str = "  validationConfigurations:
    mutateDigest: false
    verifyDigest: false
";

fn signed_policy(name: &str, glob: &str, actions: &str, failure: &str) -> String {
    policy(
        name,
        glob,
        &format!(
            "  validationActions: [{actions}]\n  failurePolicy: {failure}\n{NO_DIGEST_RULES}{}{VERIFY_SIGNED}",
            key_attestor()
        ),
    )
}

fn metric(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutate_validate_warn_audit_errors_and_metrics() {
    let h = RegistryHarness::start_default().await.unwrap();
    let (signed, signed_digest) = push(&h, "sig-p256").await;
    let (unsigned, _) = push(&h, "unsigned").await;
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let glob = format!("{}/*", h.host());
    let pin_body = "  attestors: []\n  validations:\n    - expression: \"true\"\n";
    write(&policies, "pin.yaml", &policy("pin", &glob, pin_body));
    let deny = signed_policy("require-signed", &glob, "Deny", "Fail");
    write(&policies, "deny.yaml", &deny);
    write(
        &policies,
        "warn.yaml",
        &signed_policy("warn-signed", &glob, "Warn", "Fail"),
    );
    write(
        &policies,
        "audit.yaml",
        &signed_policy("audit-signed", &glob, "Audit", "Fail"),
    );
    write(dir.path(), "registry-ca.pem", h.ca_pem());
    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;

    // Mutate pins the tag to the digest the registry serves.
    let resp = ivory
        .review("/ivpol/mutate/pin", &pod_review("m-1", &[&signed]))
        .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    assert_eq!(resp["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().unwrap())
        .unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(
        patch,
        json!([{"op": "replace", "path": "/spec/containers/0/image",
                "value": format!("{signed}@{signed_digest}")}])
    );

    // Autogen: the pod policy pins the pod template of a Deployment (captured fixture).
    let text =
        std::fs::read_to_string(fixtures_dir().join("admission/deployment-create.json")).unwrap();
    let mut deployment: Value = serde_json::from_str(&text).unwrap();
    let spec = &mut deployment["request"]["object"]["spec"]["template"]["spec"];
    spec["containers"] = json!([{"name": "c0", "image": signed}]);
    spec["initContainers"] = json!([]);
    let resp = ivory.review("/ivpol/mutate/pin", &deployment).await;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().unwrap())
        .unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(
        patch[0]["path"], "/spec/template/spec/containers/0/image",
        "{patch}"
    );
    assert_eq!(patch[0]["value"], format!("{signed}@{signed_digest}"));

    // Validate: signed allowed, unsigned denied with Kyverno's text.
    let resp = ivory
        .review(
            "/ivpol/validate/require-signed",
            &pod_review("v-1", &[&signed]),
        )
        .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    assert!(resp.get("status").is_none(), "{resp}");
    let mut review = pod_review("v-2", &[&unsigned]);
    let resp = ivory
        .review("/ivpol/validate/require-signed", &review)
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(resp["status"]["code"], 403);
    assert_eq!(
        resp["status"]["message"],
        "Policy require-signed failed: failed the image Signature verification"
    );
    // Dry-run requests get the same answer.
    review["request"]["dryRun"] = json!(true);
    let dry = ivory
        .review("/ivpol/validate/require-signed", &review)
        .await;
    assert_eq!(dry, resp);

    // Warn: allowed with the failure as a warning. Audit: allowed, nothing in the response.
    let resp = ivory
        .review(
            "/ivpol/validate/warn-signed",
            &pod_review("w-1", &[&unsigned]),
        )
        .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    assert_eq!(
        resp["warnings"],
        json!(["Policy warn-signed failed: failed the image Signature verification"])
    );
    let resp = ivory
        .review(
            "/ivpol/validate/audit-signed",
            &pod_review("a-1", &[&unsigned]),
        )
        .await;
    assert_eq!(resp, json!({"uid": "a-1", "allowed": true}));

    // Unknown policy names are an explicit error naming them.
    let resp = ivory
        .review(
            "/ivpol/validate/require-signed/no-such-policy",
            &pod_review("u-1", &[&signed]),
        )
        .await;
    assert_eq!(resp["allowed"], false);
    assert_eq!(resp["status"]["code"], 404);
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("unknown ImageValidatingPolicy policies: no-such-policy"),
        "{msg}"
    );

    // Bad bodies: 400 with the parse error; oversize: 413; the server keeps serving.
    let (status, text) = ivory
        .post("/ivpol/validate/require-signed", "{\"apiVersion\": ")
        .await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("invalid AdmissionReview JSON at line 1"),
        "{text}"
    );
    let (status, text) = ivory.post("/ivpol/validate/require-signed", "[]").await;
    assert_eq!(status, 400, "{text}");
    let mut big = pod_review("big", &[&signed]);
    big["request"]["object"]["metadata"]["annotations"] =
        json!({"filler": "x".repeat(4 * 1024 * 1024)});
    let (status, _) = ivory
        .post("/ivpol/validate/require-signed", big.to_string())
        .await;
    assert_eq!(status, 413);
    let (status, _) = ivory.get("/healthz").await;
    assert_eq!(status, 200);

    // HTTP/2 through ALPN, HTTP/1.1 for clients that only speak it.
    let h2 = ivory
        .client()
        .get(ivory.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(h2.version(), reqwest::Version::HTTP_2);
    let ca = reqwest::Certificate::from_pem(ivory.ca_pem.as_bytes()).unwrap();
    let h1 = reqwest::Client::builder()
        .tls_certs_only([ca])
        .http1_only()
        .build()
        .unwrap();
    let resp = h1.get(ivory.url("/readyz")).send().await.unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_11);
    assert_eq!(resp.headers()[ivory_server::READYZ_POLICY_ERRORS], "0");
    assert_eq!(resp.text().await.unwrap(), "ready: 4 policies loaded\n");

    let m = ivory.metrics().await;
    let count = |route: &str, outcome: &str| {
        metric(
            &m,
            &format!(
                "ivory_admission_duration_seconds_count{{route=\"{route}\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!(count("ivpol_mutate", "patched"), Some(2.0), "{m}");
    assert_eq!(count("ivpol_validate", "denied"), Some(2.0), "{m}");
    // The Warn policy's failure is a warning: that admission is `warned`.
    assert_eq!(count("ivpol_validate", "allowed"), Some(2.0), "{m}");
    assert_eq!(count("ivpol_validate", "warned"), Some(1.0), "{m}");
    assert_eq!(count("ivpol_validate", "unknown_policy"), Some(1.0), "{m}");
    assert_eq!(count("ivpol_validate", "bad_request"), Some(3.0), "{m}");
    let registry_requests = metric(
        &m,
        &format!(
            "ivory_registry_requests_total{{registry=\"{}\",status=\"2xx\"}}",
            h.host()
        ),
    );
    assert!(registry_requests.is_some_and(|n| n >= 3.0), "{m}");
    let cache = |family: &str, cache: &str| {
        metric(
            &m,
            &format!("ivory_verify_cache_{family}_total{{cache=\"{cache}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert!(cache("misses", "results") >= 1.0, "{m}");
    assert!(cache("misses", "tags") >= 1.0, "{m}");
    let lookups = cache("hits", "results") + cache("coalesced", "results");
    assert!(
        lookups >= 1.0,
        "repeated verifications are served or coalesced: {m}"
    );
    assert_eq!(metric(&m, "ivory_policies_loaded "), Some(4.0), "{m}");
    assert_eq!(metric(&m, "ivory_admission_in_flight "), Some(0.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_registry_is_answered_inside_the_api_server_timeout() {
    let hung = HungRegistry::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let glob = format!("{}/*", hung.host());
    for failure in ["Fail", "Ignore"] {
        let lower = failure.to_lowercase();
        let pin = format!(
            "  failurePolicy: {failure}\n  attestors: []\n  validations:\n    - expression: \"true\"\n"
        );
        write(
            &policies,
            &format!("pin-{lower}.yaml"),
            &policy(&format!("pin-{lower}"), &glob, &pin),
        );
        let verify = signed_policy(&format!("verify-{lower}"), &glob, "Deny", failure);
        write(&policies, &format!("verify-{lower}.yaml"), &verify);
    }
    let ivory = Ivory::start_policies(dir.path(), &policies).await;
    // Like the API server, talk over an established connection. The warm-up request also
    // makes the registry client build its (blocking, cached) HTTPS client for the hung host:
    // on a cold start concurrent first requests each pay for that build before their budget
    // logic runs (reported to ivory-registry).
    let warm = pod_review("warm", &[&format!("{}/ivory/warm:v1", hung.host())]);
    ivory
        .review("/ivpol/mutate/pin-ignore?timeout=1s", &warm)
        .await;
    // One image per request: concurrent lookups of one image would share a registry call.
    let image = |uid: &str| format!("{}/ivory/{uid}:v1", hung.host());

    let call = |path: &'static str, uid: &'static str| {
        let review = pod_review(uid, &[&image(uid)]);
        let ivory = &ivory;
        async move {
            let started = ivory_clock::now();
            let resp = ivory.review(&format!("{path}?timeout=3s"), &review).await;
            (resp, started.elapsed())
        }
    };
    let (pin_fail, pin_ignore, verify_fail, verify_ignore) = tokio::join!(
        call("/ivpol/mutate/pin-fail", "pf"),
        call("/ivpol/mutate/pin-ignore", "pi"),
        call("/ivpol/validate/verify-fail", "vf"),
        call("/ivpol/validate/verify-ignore", "vi"),
    );
    for (resp, elapsed) in [&pin_fail, &pin_ignore, &verify_fail, &verify_ignore] {
        // Answered before the API server's 3 s, after spending most of the 2.7 s budget.
        assert!(
            *elapsed < Duration::from_secs(3),
            "{elapsed:?} {resp}\n{}",
            ivory.logs()
        );
        assert!(
            *elapsed >= Duration::from_millis(2500),
            "{elapsed:?} {resp}"
        );
    }
    for (resp, _) in [&pin_fail, &verify_fail] {
        assert_eq!(resp["allowed"], false, "{resp}");
        let msg = resp["status"]["message"].as_str().unwrap();
        assert!(msg.contains(&image(resp["uid"].as_str().unwrap())), "{msg}");
        assert!(
            msg.contains(&format!("at registry {}", hung.host())),
            "{msg}"
        );
        assert!(msg.contains("time budget of 2"), "{msg}");
    }
    for (resp, _) in [&pin_ignore, &verify_ignore] {
        assert_eq!(resp["allowed"], true, "{resp}");
        assert!(resp.get("patch").is_none(), "{resp}");
        let warnings = resp["warnings"].to_string();
        assert!(warnings.contains("time budget of 2"), "{resp}");
        assert!(
            !resp["auditAnnotations"].as_object().unwrap().is_empty(),
            "{resp}"
        );
    }
    let m = ivory.metrics().await;
    assert_eq!(
        metric(&m, "ivory_deadline_expiries_total{route=\"ivpol_mutate\"}"),
        Some(3.0), // with the warm-up
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "ivory_deadline_expiries_total{route=\"ivpol_validate\"}"
        ),
        Some(2.0),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_hot_reload_and_certificate_reload() {
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let deny_all = |name: &str, msg: &str| {
        policy(
            name,
            "*",
            &format!(
                "{NO_DIGEST_RULES}  attestors: []\n  validations:\n    - expression: \"false\"\n      message: {msg}\n"
            ),
        )
    };
    write(&policies, "a.yaml", &deny_all("first", "first version"));
    let ivory = Ivory::start_policies(dir.path(), &policies).await;
    let pinned = "registry.example/app@sha256:0000000000000000000000000000000000000000000000000000000000000000";
    let message = |resp: Value| resp["status"]["message"].as_str().unwrap_or("").to_owned();

    let resp = ivory
        .review("/ivpol/validate/first", &pod_review("r-1", &[pinned]))
        .await;
    assert_eq!(message(resp), "Policy first failed: first version");

    // A changed policy is picked up.
    write(&policies, "a.yaml", &deny_all("first", "second version"));
    let reloaded = eventually(
        "the changed policy to be picked up",
        Duration::from_secs(10),
        || async {
            let resp = ivory
                .review("/ivpol/validate/first", &pod_review("r-2", &[pinned]))
                .await;
            message(resp) == "Policy first failed: second version"
        },
    )
    .await
    .is_ok();
    assert!(reloaded, "{}", ivory.logs());

    // A broken file keeps the last good set, and says so on /readyz and in the metrics.
    write(
        &policies,
        "b.yaml",
        "apiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata: {name: broken}\nspec: {validations: 1}\n",
    );
    let reported = eventually(
        "/readyz to report b.yaml",
        Duration::from_secs(10),
        || async { ivory.get("/readyz").await.1.contains("b.yaml") },
    )
    .await
    .is_ok();
    assert!(reported, "{}", ivory.logs());
    let (status, text) = ivory.get("/readyz").await;
    assert_eq!(status, 200, "{text}");
    assert!(
        text.starts_with("ready: 1 policies loaded\npolicy errors"),
        "{text}"
    );
    let resp = ivory
        .client()
        .get(ivory.url("/readyz"))
        .send()
        .await
        .unwrap();
    let errors = &resp.headers()[ivory_server::READYZ_POLICY_ERRORS];
    assert!(
        errors.to_str().unwrap().parse::<usize>().unwrap() >= 1,
        "{errors:?}"
    );
    let m = ivory.metrics().await;
    assert!(
        metric(&m, "ivory_policy_load_errors ").is_some_and(|n| n >= 1.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "ivory_policy_load_failures_total "),
        Some(1.0),
        "{m}"
    );
    let resp = ivory
        .review("/ivpol/validate/first", &pod_review("r-3", &[pinned]))
        .await;
    assert_eq!(message(resp), "Policy first failed: second version");
    assert!(
        ivory.logs().contains("keeping the last good set"),
        "{}",
        ivory.logs()
    );

    // The served certificate's notAfter is a metric, as openssl reads it.
    let end = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-enddate", "-dateopt", "iso_8601", "-in"])
        .arg(dir.path().join("tls.crt"))
        .output()
        .unwrap();
    let end = String::from_utf8_lossy(&end.stdout);
    let end = end.trim().trim_start_matches("notAfter=");
    let expected = chrono::DateTime::parse_from_rfc3339(&end.replace(' ', "T"))
        .unwrap()
        .timestamp() as f64;
    let series = format!(
        "ivory_tls_certificate_expiry_timestamp_seconds{{file=\"{}\"}} ",
        dir.path().join("tls.crt").display()
    );
    assert_eq!(metric(&m, &series), Some(expected), "{m}");

    // The scrape's own connection is open while the metrics are written.
    assert!(
        metric(&m, "ivory_http_connections_open ").is_some_and(|n| n >= 1.0),
        "{m}"
    );

    // A new certificate (from a new CA) is served without a restart.
    let first_ca = ivory.ca_pem.clone();
    let second = Tls::write(dir.path(), "second CA");
    let swapped = eventually(
        "the second CA's certificate to be served",
        Duration::from_secs(10),
        || async {
            Ivory::client_for(&second.ca_pem)
                .get(ivory.url("/healthz"))
                .send()
                .await
                .is_ok()
        },
    )
    .await
    .is_ok();
    assert!(swapped, "{}", ivory.logs());
    let old = Ivory::client_for(&first_ca)
        .get(ivory.url("/healthz"))
        .send()
        .await;
    assert!(
        old.is_err(),
        "the old CA must no longer verify the served certificate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_requests() {
    let hung = HungRegistry::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pin.yaml");
    let pin = "  attestors: []\n  validations:\n    - expression: \"true\"\n";
    std::fs::write(&file, policy("pin", &format!("{}/*", hung.host()), pin)).unwrap();
    let mut ivory = Ivory::start_in(
        dir.path(),
        &[
            "--policies".into(),
            file.display().to_string(),
            "--grace-period".into(),
            "10s".into(),
        ],
    )
    .await;
    let review = pod_review("s-1", &[&format!("{}/ivory/app:v1", hung.host())]);
    let in_flight = ivory.review("/ivpol/mutate/pin?timeout=2s", &review);
    let terminate = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let pid = ivory.child.id().unwrap().to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success());
    };
    let (resp, ()) = tokio::join!(in_flight, terminate);
    assert_eq!(resp["allowed"], false, "{resp}");
    let status = tokio::time::timeout(Duration::from_secs(10), ivory.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}\n{}", ivory.logs());
    assert!(ivory.logs().contains("shutting down"), "{}", ivory.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_ready_until_policies_load_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, "apiVersion: policies.kyverno.io/v1\nkind: ImageValidatingPolicy\nmetadata: {name: p}\nspec: {validations: 1}\n").unwrap();
    let ivory = Ivory::start_policies(dir.path(), &file).await;
    let (status, text) = ivory.get("/readyz").await;
    assert_eq!(status, 503, "{text}");
    assert!(
        text.starts_with("not ready: no policy set loaded\npolicy errors"),
        "{text}"
    );
    assert!(text.contains("p.yaml"), "{text}");
    assert_eq!(ivory.get("/healthz").await.0, 200);
    let (status, _) = ivory
        .post("/ivpol/validate/p", pod_review("x", &["nginx"]).to_string())
        .await;
    assert_eq!(status, 503);

    let pin = "  attestors: []\n  validations:\n    - expression: \"true\"\n";
    std::fs::write(&file, policy("p", "*", pin)).unwrap();
    let ready = eventually("/readyz to be ready", Duration::from_secs(10), || async {
        ivory.get("/readyz").await.0 == 200
    })
    .await
    .is_ok();
    assert!(ready, "{}", ivory.logs());
}

#[tokio::test]
async fn insecure_http_works_and_warns() {
    let mut child = tokio::process::Command::new(crate::util::BIN)
        .args([
            "serve",
            "--insecure-http",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "text",
        ])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stderr));
    let mut warned = false;
    let addr = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .expect("ivory exited before listening");
        warned |= line.starts_with("WARNING: --insecure-http");
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    assert!(warned);
    let text = reqwest::get(format!("http://{addr}/readyz"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(text, "ready: 1 policies loaded\n");
}

/// Admissions past this many log lines need the log writer to keep up (the pipe holds far
/// fewer lines), and past `SERVE_LOG_BUFFERED_LINES` (8192) lines some are dropped.
const STALLED_LOG_ADMISSIONS: usize = 9_000;

/// A log consumer that stops reading (a full stderr pipe, a stuck collector) must not stall
/// admissions: every one is answered, and the lines that did not fit are counted as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_log_consumer_never_stalls_admissions() {
    let mut child = tokio::process::Command::new(crate::util::BIN)
        .args(["serve", "--insecure-http", "--listen", "127.0.0.1:0"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stderr));
    let addr = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .expect("ivory exited before listening");
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        if v["fields"]["message"] == "listening" {
            break v["fields"]["addr"].as_str().unwrap().to_owned();
        }
    };
    // From here on nobody reads stderr: `lines` stays open and unread until the end.
    let digest = format!("sha256:{}", "a".repeat(64));
    let image = format!("registry.test/app@{digest}");
    let review = pod_review("stalled-log", &[&image]).to_string();
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/ivpol/mutate/ivory-pin-digests");
    let answers = futures::stream::iter(0..STALLED_LOG_ADMISSIONS)
        .map(|_| {
            let (client, url, review) = (&client, &url, review.clone());
            async move {
                let resp = tokio::time::timeout(
                    Duration::from_secs(10),
                    client
                        .post(url)
                        .header("content-type", "application/json")
                        .body(review)
                        .send(),
                )
                .await
                .expect("an admission waited for the log consumer")
                .unwrap();
                let body: Value = resp.json().await.unwrap();
                body["response"]["allowed"] == true
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<bool>>()
        .await;
    assert!(answers.iter().all(|allowed| *allowed));
    let metrics = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let dropped: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("ivory_log_lines_dropped_total "))
        .expect("the dropped-lines metric is exported")
        .parse()
        .unwrap();
    assert!(
        dropped > 0,
        "{STALLED_LOG_ADMISSIONS} lines all fit: {metrics}"
    );
    drop(lines);
}

/// A verifyDigest policy (`failurePolicy`) on `glob` that checks signatures.
fn digest_policy(name: &str, glob: &str, failure: &str) -> String {
    policy(
        name,
        glob,
        &format!(
            "  failurePolicy: {failure}\n{}{VERIFY_SIGNED}",
            key_attestor()
        ),
    )
}

/// Ignore scope: an extra container on a hung registry outside the policy's globs must not
/// make the policy skip, whatever its CEL reads (here: image data too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_scope_hung_registry_never_skips_the_policy() {
    let h = RegistryHarness::start_default().await.unwrap();
    let hung = HungRegistry::start().await.unwrap();
    let (signed, _) = push(&h, "sig-p256").await;
    let (unsigned, _) = push(&h, "unsigned").await;
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let body = format!(
        "  failurePolicy: Ignore\n{NO_DIGEST_RULES}{}{VERIFY_SIGNED}    - expression: images.containers.all(i, image.GetMetadata(i).digest != '')\n",
        key_attestor()
    );
    let glob = format!("{}/*", h.host());
    write(&policies, "scoped.yaml", &policy("scoped", &glob, &body));
    write(dir.path(), "registry-ca.pem", h.ca_pem());
    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;
    let extra = format!("{}/ivory/sidecar:v1", hung.host());

    let resp = ivory
        .review(
            "/ivpol/validate/scoped?timeout=3s",
            &pod_review("u", &[&unsigned, &extra]),
        )
        .await;
    assert_eq!(resp["allowed"], false, "{resp}\n{}", ivory.logs());
    let msg = resp["status"]["message"].as_str().unwrap_or_default();
    assert_eq!(
        msg, "Policy scoped failed: failed the image Signature verification",
        "{resp}"
    );

    let resp = ivory
        .review(
            "/ivpol/validate/scoped?timeout=3s",
            &pod_review("s", &[&signed, &extra]),
        )
        .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    assert!(resp.get("warnings").is_none(), "{resp}");
    let m = ivory.metrics().await;
    assert_eq!(
        metric(
            &m,
            "ivory_deadline_expiries_total{route=\"ivpol_validate\"}"
        )
        .unwrap_or(0.0),
        0.0,
        "{m}"
    );
}

/// An image outside the policy's globs whose image data an expression reads (an architecture
/// check on every container) is fetched; when its registry hangs, only that expression fails,
/// and the policy's failurePolicy decides as for any answer the budget did not allow. A
/// definite failure of another validation still denies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_scope_hung_registry_an_expression_reads_follows_the_failure_policy() {
    let h = RegistryHarness::start_default().await.unwrap();
    let hung = HungRegistry::start().await.unwrap();
    let (signed, _) = push(&h, "sig-p256").await;
    let (unsigned, _) = push(&h, "unsigned").await;
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let glob = format!("{}/*", h.host());
    for failure in ["Ignore", "Fail"] {
        let name = format!("arch-{}", failure.to_lowercase());
        let body = format!(
            "  failurePolicy: {failure}\n{NO_DIGEST_RULES}{}{VERIFY_SIGNED}    - expression: object.spec.containers.all(c, image.GetMetadata(c.image).config.os != 'windows')\n",
            key_attestor()
        );
        write(
            &policies,
            &format!("{name}.yaml"),
            &policy(&name, &glob, &body),
        );
    }
    write(dir.path(), "registry-ca.pem", h.ca_pem());
    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;
    let extra = format!("{}/ivory/sidecar:v1", hung.host());

    let resp = ivory
        .review(
            "/ivpol/validate/arch-ignore?timeout=3s",
            &pod_review("i", &[&signed, &extra]),
        )
        .await;
    assert_eq!(resp["allowed"], true, "{resp}\n{}", ivory.logs());
    let warnings = resp["warnings"].to_string();
    assert!(
        warnings.contains("verification skipped") && warnings.contains(&extra),
        "{resp}"
    );
    let resp = ivory
        .review(
            "/ivpol/validate/arch-fail?timeout=3s",
            &pod_review("f", &[&signed, &extra]),
        )
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
    let msg = resp["status"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("Policy arch-fail error: ") && msg.contains(&hung.host()),
        "{resp}"
    );
    let resp = ivory
        .review(
            "/ivpol/validate/arch-ignore?timeout=3s",
            &pod_review("u", &[&unsigned, &extra]),
        )
        .await;
    assert_eq!(
        resp["status"]["message"],
        "Policy arch-ignore failed: failed the image Signature verification",
        "{resp}"
    );
    let m = ivory.metrics().await;
    assert!(
        metric(
            &m,
            "ivory_deadline_expiries_total{route=\"ivpol_validate\"}"
        )
        .unwrap_or(0.0)
            >= 2.0,
        "{m}"
    );
}

/// verifyDigest under failurePolicy: a tag whose registry cannot answer follows the failure
/// policy (Fail names the registry, Ignore warns); a tag whose registry answers was simply not
/// pinned and is denied under either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_digest_on_an_unreachable_registry_follows_the_failure_policy() {
    let h = RegistryHarness::start_default().await.unwrap();
    let hung = HungRegistry::start().await.unwrap();
    let (signed, _) = push(&h, "sig-p256").await;
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let hung_glob = format!("{}/*", hung.host());
    for failure in ["Fail", "Ignore"] {
        let lower = failure.to_lowercase();
        let name = format!("digest-{lower}");
        write(
            &policies,
            &format!("{name}.yaml"),
            &digest_policy(&name, &hung_glob, failure),
        );
    }
    let reachable = digest_policy("digest-reachable", &format!("{}/*", h.host()), "Ignore");
    write(&policies, "reachable.yaml", &reachable);
    write(dir.path(), "registry-ca.pem", h.ca_pem());
    let ivory = Ivory::start_with_policies(dir.path(), &policies).await;
    let image = format!("{}/ivory/app:v1", hung.host());
    let review = pod_review("d", &[&image]);

    let fail = ivory
        .review("/ivpol/validate/digest-fail?timeout=3s", &review)
        .await;
    assert_eq!(fail["allowed"], false, "{fail}");
    let msg = fail["status"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(&format!(
            "image {image} does not have a digest and its tag could not be resolved"
        )) && msg.contains(&format!("at registry {}", hung.host())),
        "{msg}"
    );

    let ignore = ivory
        .review("/ivpol/validate/digest-ignore?timeout=3s", &review)
        .await;
    assert_eq!(ignore["allowed"], true, "{ignore}");
    let warnings = ignore["warnings"].to_string();
    assert!(
        warnings.contains(&format!("digest check skipped for image {image}")),
        "{ignore}"
    );
    assert!(
        !ignore["auditAnnotations"].as_object().unwrap().is_empty(),
        "{ignore}"
    );

    let resp = ivory
        .review(
            "/ivpol/validate/digest-reachable?timeout=3s",
            &pod_review("r", &[&signed]),
        )
        .await;
    assert_eq!(resp["allowed"], false, "{resp}");
    assert_eq!(
        resp["status"]["message"],
        format!("Policy digest-reachable failed: image {signed} does not have a digest"),
        "{resp}"
    );
}

/// `--tag-cache-ttl`: a moved tag is pinned to its new digest once the TTL has passed, and
/// not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_tag_is_pinned_anew_after_the_tag_cache_ttl() {
    let h = RegistryHarness::start_default().await.unwrap();
    let layout = |name: &str| fixtures_dir().join("oci/ivory").join(name);
    let first = h
        .push_oci_layout(&layout("sig-p256"), "ivory/moving")
        .await
        .unwrap()["v1"]
        .clone();
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let pin_body = "  attestors: []\n  validations:\n    - expression: \"true\"\n";
    write(
        &policies,
        "pin.yaml",
        &policy("pin", &format!("{}/*", h.host()), pin_body),
    );
    write(dir.path(), "registry-ca.pem", h.ca_pem());
    let ivory = Ivory::start_in(
        dir.path(),
        &[
            "--policies".into(),
            policies.display().to_string(),
            "--registry-ca".into(),
            dir.path().join("registry-ca.pem").display().to_string(),
            "--tag-cache-ttl".into(),
            "3s".into(),
        ],
    )
    .await;
    let image = format!("{}/ivory/moving:v1", h.host());
    let pinned = |resp: &Value| -> String {
        let patch = base64::engine::general_purpose::STANDARD
            .decode(resp["patch"].as_str().unwrap_or_default())
            .unwrap_or_default();
        let patch: Value = serde_json::from_slice(&patch).unwrap_or(Value::Null);
        patch[0]["value"].as_str().unwrap_or_default().to_owned()
    };
    let resp = ivory
        .review("/ivpol/mutate/pin", &pod_review("m1", &[&image]))
        .await;
    assert_eq!(pinned(&resp), format!("{image}@{first}"), "{resp}");
    let cached_at = ivory_clock::now();

    let second = h
        .push_oci_layout(&layout("unsigned"), "ivory/moving")
        .await
        .unwrap()["v1"]
        .clone();
    assert_ne!(first, second);
    let resp = ivory
        .review("/ivpol/mutate/pin", &pod_review("m2", &[&image]))
        .await;
    // On a very slow machine the push may outlast the TTL; the fresh pin is checked below.
    if cached_at.elapsed() < Duration::from_secs(2) {
        assert_eq!(
            pinned(&resp),
            format!("{image}@{first}"),
            "within the TTL the cached digest is pinned: {resp}"
        );
    }
    tokio::time::sleep(
        Duration::from_secs(3).saturating_sub(cached_at.elapsed()) + Duration::from_millis(500),
    )
    .await;
    let resp = ivory
        .review("/ivpol/mutate/pin", &pod_review("m3", &[&image]))
        .await;
    assert_eq!(pinned(&resp), format!("{image}@{second}"), "{resp}");
}

/// A hostile registry's words (error bodies, endless answers) never reach the Pod's
/// creator, and a digest it forges is never patched into the Pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_registry_text_never_reaches_the_response_and_forged_digests_are_not_patched() {
    let h = HostileServer::start(HostileOptions::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policies = policies_dir(dir.path());
    let glob = format!("{}/*", h.host());
    let insecure = "  credentials:\n    allowInsecureRegistry: true\n";
    let pin = format!(
        "  failurePolicy: Fail\n{insecure}  attestors: []\n  validations:\n    - expression: \"true\"\n"
    );
    write(&policies, "pin.yaml", &policy("pin", &glob, &pin));
    let verify = format!(
        "  validationActions: [Deny]\n  failurePolicy: Fail\n{insecure}{NO_DIGEST_RULES}{}{VERIFY_SIGNED}",
        key_attestor()
    );
    write(&policies, "verify.yaml", &policy("verify", &glob, &verify));
    let ivory = Ivory::start_policies(dir.path(), &policies).await;

    // The control: an honest answer from the same server is pinned.
    let good = format!("{}/good:v1", h.host());
    let resp = ivory
        .review("/ivpol/mutate/pin", &pod_review("good", &[&good]))
        .await;
    assert_eq!(resp["allowed"], true, "{resp}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().unwrap())
        .unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(patch[0]["value"], format!("{good}@{}", h.good_digest()));

    let cases = [
        ("secret-400", "/ivpol/mutate/pin", "HTTP 400"),
        ("secret-403", "/ivpol/mutate/pin", "HTTP 403"),
        ("secret-500", "/ivpol/mutate/pin", "HTTP 500"),
        ("secret-404", "/ivpol/validate/verify", "HTTP 404"),
        ("endless", "/ivpol/mutate/pin", "exceeds the limit"),
        ("upperdigest", "/ivpol/mutate/pin", "invalid digest"),
        ("shortdigest", "/ivpol/mutate/pin", "invalid digest"),
        ("md5digest", "/ivpol/validate/verify", "invalid digest"),
    ];
    for (repo, path, why) in cases {
        let image = format!("{}/{repo}:v1", h.host());
        let resp = ivory.review(path, &pod_review(repo, &[&image])).await;
        let text = resp.to_string();
        assert_eq!(resp["allowed"], false, "{repo}: {text}");
        assert!(resp.get("patch").is_none(), "{repo}: {text}");
        assert!(!text.contains(HOSTILE_SECRET), "{repo}: {text}");
        assert!(!text.contains("xxxxxxxx"), "{repo}: {text}");
        let forged = h.good_digest()[7..].to_uppercase();
        assert!(
            !text.contains(&forged) && !text.contains("md5:"),
            "{repo}: {text}"
        );
        let msg = resp["status"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(&h.host()), "{repo}: {msg}");
        assert!(msg.contains(why), "{repo}: {msg}");
    }
}
