//! `ivory test` over Kyverno CLI test suites (`kyverno-test.yaml`), against the real registry
//! harness: the suites name `ghcr.io/…` images, which `--registry-mirror ghcr.io=<harness>`
//! fetches from the harness (the suite files are never rewritten). Our own suites
//! (`tests/data/ivory-test-suites/`) pass, fail on a wrong expectation (exit 1, JUnit
//! failure), select rows, show messages, run legacy `verifyImages` rules through the converter
//! and refuse malformed input (exit 2);
//! Kyverno 1.19.1's own ImageValidatingPolicy suites (`fixtures/kyverno-cli-tests/`) run
//! unchanged; a second run with the persistent cache asks the registry nothing.

use std::path::{Path, PathBuf};

use ivory_testkit::{Harness, RegistryHarness};

use crate::cli_util::{Run, ivory, retag_fixture, write_ca};
use ivory_testkit::cases::Failures;
use ivory_testkit::fixtures_dir;

fn suites() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ivory-test-suites")
}

/// The harness with the fixture images our suites name: `ghcr.io/ivory-test/signed:v1`
/// (cosign, P-256 key) and `ghcr.io/ivory-test/unsigned:v1`.
async fn registry() -> Harness {
    let h = RegistryHarness::start_default().await.unwrap();
    for (layout, repo) in [
        ("sig-p256", "ivory-test/signed"),
        ("unsigned", "ivory-test/unsigned"),
    ] {
        h.push_oci_layout(&fixtures_dir().join("oci/ivory").join(layout), repo)
            .await
            .unwrap();
    }
    h
}

/// `ivory test` arguments reaching the harness for `ghcr.io`.
fn test_args(h: &Harness, dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "test".to_owned(),
        "--registry-ca".into(),
        write_ca(dir, h).display().to_string(),
        "--registry-mirror".into(),
        format!("ghcr.io={}", h.host()),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

fn show(run: &Run) -> String {
    format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr)
}

/// The table line of `resource` (panics with the output when there is none).
fn line<'a>(run: &'a Run, resource: &str) -> &'a str {
    run.stdout
        .lines()
        .find(|l| l.contains(resource))
        .unwrap_or_else(|| panic!("no row for {resource}\n{}", show(run)))
}

/// One `ivory test` run of a suite: its exit code, what its output must and must not contain,
/// and what the table line of a resource must contain.
struct SuiteRun {
    name: &'static str,
    args: Vec<String>,
    allow_outside_root: bool,
    code: i32,
    stdout: Vec<String>,
    not_stdout: Vec<&'static str>,
    stderr: Vec<String>,
    /// (resource, text): the first line naming the resource contains the text.
    rows: Vec<(&'static str, &'static str)>,
}

impl SuiteRun {
    fn new(name: &'static str, args: &[&str], code: i32) -> Self {
        Self {
            name,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            allow_outside_root: false,
            code,
            stdout: Vec::new(),
            not_stdout: Vec::new(),
            stderr: Vec::new(),
            rows: Vec::new(),
        }
    }

    fn outside_root(mut self) -> Self {
        self.allow_outside_root = true;
        self
    }

    fn stdout(mut self, texts: &[&str]) -> Self {
        self.stdout = texts.iter().map(|t| (*t).to_owned()).collect();
        self
    }

    fn not_stdout(mut self, texts: &[&'static str]) -> Self {
        self.not_stdout = texts.to_vec();
        self
    }

    fn stderr(mut self, texts: &[&str]) -> Self {
        self.stderr = texts.iter().map(|t| (*t).to_owned()).collect();
        self
    }

    fn rows(mut self, rows: &[(&'static str, &'static str)]) -> Self {
        self.rows = rows.to_vec();
        self
    }

    /// What `run` got wrong, if anything.
    fn problems(&self, run: &Run) -> Vec<String> {
        let mut problems = Vec::new();
        if run.code != self.code {
            problems.push(format!("exit {} instead of {}", run.code, self.code));
        }
        let missing = |out: &str, texts: &[String], stream: &str, problems: &mut Vec<String>| {
            for text in texts.iter().filter(|t| !out.contains(t.as_str())) {
                problems.push(format!("{stream} lacks {text:?}"));
            }
        };
        missing(&run.stdout, &self.stdout, "stdout", &mut problems);
        missing(&run.stderr, &self.stderr, "stderr", &mut problems);
        for text in self.not_stdout.iter().filter(|t| run.stdout.contains(*t)) {
            problems.push(format!("stdout has {text:?}"));
        }
        for (resource, text) in &self.rows {
            match run.stdout.lines().find(|l| l.contains(resource)) {
                Some(row) if row.contains(text) => {}
                Some(row) => problems.push(format!("the row of {resource} lacks {text:?}: {row}")),
                None => problems.push(format!("no row for {resource}")),
            }
        }
        problems
    }
}

/// Selection, messages, refusals and legacy rules: runs whose exit code and output say it all.
fn suite_runs(payloads: &Path) -> Vec<SuiteRun> {
    let dir = |name: &str| suites().join(name).display().to_string();
    let (passing, wrong, malformed) = (dir("passing"), dir("wrong-expectation"), dir("malformed"));
    let malformed_file = suites()
        .join("malformed/kyverno-test.yaml")
        .display()
        .to_string();
    let payloads = payloads.display().to_string();
    vec![
        // --fail-only: the failures alone, after Kyverno's other summary line.
        SuiteRun::new("--fail-only", &[&wrong, "--fail-only"], 1)
            .outside_root()
            .stdout(&["Test Summary: 1 out of 2 tests failed"])
            .not_stdout(&["/default/signed-pod"])
            .rows(&[("unsigned-pod", "Want pass, got fail")]),
        // The selector keeps the rows naming the resource; detailed results show messages.
        SuiteRun::new(
            "selector and detailed results",
            &[
                &passing,
                "--test-case-selector",
                "policy=require-*,resource=unsigned-pod",
                "--detailed-results",
            ],
            0,
        )
        .stdout(&[
            "Test Summary: 3 tests passed and 0 tests failed",
            "│ MESSAGE",
        ])
        .not_stdout(&["/default/signed-pod", "excepted-pod"])
        .rows(&[("unsigned-pod", "failed the image Signature verification")]),
        SuiteRun::new("unknown selector key", &[&passing, "-t", "kind=Pod"], 2)
            .stderr(&["--test-case-selector: unknown key \"kind\""]),
        // Malformed test file: exit 2, naming the file and the field.
        SuiteRun::new("malformed test file", &[&malformed], 2).stderr(&[
            &malformed_file,
            "field results[0]",
            "reslt",
        ]),
        // Inputs an image policy row would need and ivory cannot give: refused, naming the
        // field.
        SuiteRun::new("json payloads", &[&payloads], 2)
            .outside_root()
            .stderr(&["field jsonPayloads: not supported"]),
        // A legacy ClusterPolicy with verifyImages: converted as `ivory convert` converts it,
        // the rows answered by the policy written for their rule (tags pinned first, as
        // Kyverno's legacy rules pin them).
        SuiteRun::new("legacy", &[&dir("legacy"), "--detailed-results"], 0)
            .outside_root()
            .rows(&[
                ("signed-pod", "check-image"),
                ("signed-pod", "verify-signature"),
                ("signed-pod", "Ok"),
                ("signed-pod", "success"),
                ("unsigned-pod", "check-image"),
                ("unsigned-pod", "verify-signature"),
                ("unsigned-pod", "Ok"),
                ("unsigned-pod", "failed to verify image signatures"),
            ]),
        // A legacy rule the converter refuses is never judged by nothing: the test cannot run.
        SuiteRun::new("legacy rule refused", &[&dir("legacy-refused")], 2)
            .outside_root()
            .stderr(&["rule verify-with-kms: refused", "kms"]),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_suites_pass_fail_select_and_refuse_as_kyverno_test_does() {
    let h = registry().await;
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("junit.xml");
    let passing = suites().join("passing").display().to_string();

    // Every row as expected: verified, not verified, excluded (matchConditions, and the
    // namespace labels of the values file), skipped by a PolicyException.
    let run = ivory(test_args(
        &h,
        dir.path(),
        &[&passing, "--junit", &junit.display().to_string()],
    ))
    .await;
    assert_eq!(run.code, 0, "{}", show(&run));
    assert!(
        run.stdout
            .contains("Test Summary: 7 tests passed and 0 tests failed"),
        "{}",
        show(&run)
    );
    assert!(line(&run, "v1/Pod/default/signed-pod").contains("│ Pass   │ Ok"));
    assert!(line(&run, "v1/Pod/default/unsigned-pod").contains("│ Pass   │ Ok"));
    assert!(
        line(&run, "opted-out-pod").contains("Excluded"),
        "{}",
        show(&run)
    );
    assert!(line(&run, "v1/Pod/sandbox/sandbox-pod").contains("Excluded"));
    // UPDATE is judged like CREATE; the policy does not match DELETE.
    let unsigned: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.contains("v1/Pod/default/unsigned-pod"))
        .collect();
    assert_eq!(unsigned.len(), 3, "{}", show(&run));
    assert!(unsigned[1].contains("│ Pass   │ Ok") && unsigned[2].contains("Excluded"));
    let excepted = line(&run, "excepted-pod");
    assert!(
        excepted.contains("│ exception ") && excepted.contains("│ Ok"),
        "{excepted}"
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("tests=\"7\" failures=\"0\" errors=\"0\" skipped=\"0\"")
            && !xml.contains("<failure"),
        "{xml}"
    );

    // Values (operation), user info, cluster resources, the default namespace, and a second
    // document in the older form (run with a note).
    let inputs = suites().join("inputs").display().to_string();
    let run = ivory(test_args(&h, dir.path(), &[&inputs])).await;
    assert_eq!(run.code, 0, "{}", show(&run));
    assert!(
        run.stdout
            .contains("Test Summary: 4 tests passed and 0 tests failed"),
        "{}",
        show(&run)
    );
    let rows: Vec<&str> = run.stdout.lines().filter(|l| l.contains("/app ")).collect();
    assert_eq!(rows.len(), 4, "{}", show(&run));
    assert!(rows[0].contains("v1/Pod/default/app") && rows[0].contains("│ Pass   │ Ok"));
    assert!(rows[1].contains("v1/Pod/quarantine/app") && rows[1].contains("Excluded"));
    assert!(rows[2].contains("v1/Pod/default/app") && rows[2].contains("Excluded"));
    assert!(rows[3].contains("v1/Pod/default/app") && rows[3].contains("Excluded"));
    assert!(
        run.stderr.contains("deprecated test schema"),
        "{}",
        show(&run)
    );

    // -o json: stdout is the document alone (Kyverno's keys), the summary on stderr.
    let run = ivory(test_args(&h, dir.path(), &[&passing, "-o", "json"])).await;
    assert_eq!(run.code, 0, "{}", show(&run));
    let doc = run.json();
    let rows = doc.as_array().unwrap();
    assert_eq!(rows.len(), 7, "{doc}");
    assert_eq!(rows[0]["RESOURCE"], "v1/Pod/default/signed-pod");
    assert_eq!(
        (rows[0]["RESULT"].as_str(), rows[0]["REASON"].as_str()),
        (Some("Pass"), Some("Ok"))
    );
    assert!(
        run.stderr
            .contains("Test Summary: 7 tests passed and 0 tests failed")
    );

    // A deliberately wrong expectation: exit 1, and the JUnit failure says want vs got.
    let wrong = suites().join("wrong-expectation").display().to_string();
    let run = ivory(test_args(
        &h,
        dir.path(),
        &[
            &wrong,
            "--allow-outside-root",
            "--junit",
            &junit.display().to_string(),
        ],
    ))
    .await;
    assert_eq!(run.code, 1, "{}", show(&run));
    assert!(
        run.stdout
            .contains("Test Summary: 1 tests passed and 1 tests failed"),
        "{}",
        show(&run)
    );
    assert!(line(&run, "unsigned-pod").contains("│ Fail   │ Want pass, got fail"));
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"2\" failures=\"1\""), "{xml}");
    assert!(
        xml.contains("<testcase classname=\"require-signed\" name=\"v1/Pod/default/unsigned-pod (require-signed)\"><failure message=\"Want pass, got fail\">failed the image Signature verification</failure></testcase>"),
        "{xml}"
    );

    // Inputs an image policy row would need and ivory cannot give: refused, naming the field.
    let payloads = dir.path().join("payloads");
    std::fs::create_dir(&payloads).unwrap();
    std::fs::write(
        payloads.join("kyverno-test.yaml"),
        format!(
            "apiVersion: cli.kyverno.io/v1alpha1\nkind: Test\nmetadata: {{name: payloads}}\npolicies: [{}]\njsonPayloads: [payload.json]\nresults:\n- {{policy: require-signed, resources: [payload.json], result: pass}}\n",
            suites().join("passing/policy.yaml").display()
        ),
    )
    .unwrap();
    let mut failures = Failures::new();
    for case in suite_runs(&payloads) {
        let mut args: Vec<&str> = case.args.iter().map(String::as_str).collect();
        if case.allow_outside_root {
            args.push("--allow-outside-root");
        }
        let run = ivory(test_args(&h, dir.path(), &args)).await;
        let problems = case.problems(&run);
        failures.check(case.name, problems.is_empty(), || {
            format!("{}\n{}", problems.join("; "), show(&run))
        });
    }
    failures.assert_none();

    // No test file at all: nothing to fail, unless tests are required.
    let empty = tempfile::tempdir().unwrap();
    let path = empty.path().display().to_string();
    let run = ivory(["test", path.as_str()]).await;
    assert_eq!(run.code, 0, "{}", show(&run));
    let run = ivory(["test", "--require-tests", path.as_str()]).await;
    assert_eq!(run.code, 2, "{}", show(&run));
}

/// Kyverno v1.19.1's ImageValidatingPolicy CLI suites, unchanged (`fixtures/kyverno-cli-tests`,
/// provenance in its README). Their policies verify `ghcr.io/kyverno/test-verify-image` with a
/// notary certificate whose private key is not public, so the images cannot be signed again
/// here and their real signatures are on ghcr.io, out of reach. The harness serves the unsigned
/// image under both tags through `--registry-mirror`, so no lookup leaves the machine: ivory
/// looks for its Notation signatures there and finds none. Every row that does not need that
/// notary signature passes; the two
/// "signed image passes" rows fail; `test-context-resource-ivpol` names a `resources.yaml` its
/// folder does not hold, and cannot be run (nor can Kyverno run it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kyverno_ivpol_cli_suites_run_unchanged() {
    let h = RegistryHarness::start_default().await.unwrap();
    let repo = "kyverno/test-verify-image";
    let tags = h
        .push_oci_layout(&fixtures_dir().join("oci/ivory/unsigned"), repo)
        .await
        .unwrap();
    for tag in ["signed", "unsigned"] {
        retag_fixture(&h, "unsigned", repo, &tags["v1"], tag).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("junit.xml");
    let suites = fixtures_dir()
        .join("kyverno-cli-tests")
        .display()
        .to_string();
    h.reset_requests();
    let run = ivory(test_args(
        &h,
        dir.path(),
        &[
            &suites,
            "--detailed-results",
            "--junit",
            &junit.display().to_string(),
        ],
    ))
    .await;
    assert_eq!(run.code, 2, "{}", show(&run));
    assert!(
        run.stdout
            .contains("Test Summary: 4 tests passed and 2 tests failed"),
        "{}",
        show(&run)
    );
    for bad in ["v1/Pod/default/bad-pod", "v1/Pod/default/test-pod-bad"] {
        assert!(line(&run, bad).contains("│ Pass   │ Ok"), "{}", show(&run));
    }
    for good in ["v1/Pod/default/good-pod ", "v1/Pod/default/test-pod-good"] {
        assert!(
            line(&run, good).contains(
                "│ Fail   │ Want pass, got fail │ failed to verify image with notary cert"
            ),
            "{}",
            show(&run)
        );
    }
    assert!(
        line(&run, "skipped-pod").contains("│ exception "),
        "{}",
        show(&run)
    );
    assert!(
        line(&run, "good-pod-excluded").contains("Excluded"),
        "{}",
        show(&run)
    );
    assert!(
        line(&run, "deployment-excluded")
            .contains("Not run: ValidatingPolicy is not an image policy")
    );
    assert!(line(&run, "dev-deploy-2").contains("Not run: MutatingPolicy is not an image policy"));
    assert!(run.stdout.contains("2 results not run"), "{}", show(&run));
    assert!(
        run.stderr
            .contains("test-context-resource-ivpol/.kyverno-test/resources.yaml: No such file"),
        "{}",
        show(&run)
    );
    // Every image check of these policies goes through a notary attestor: ivory looked for
    // Notation signatures of the mirrored image, on the harness only, and found none.
    let requests = h.requests();
    assert!(
        !requests.is_empty()
            && requests
                .iter()
                .all(|(_, path, _)| path == "/v2/" || path.contains("kyverno/test-verify-image")),
        "{requests:?}"
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("tests=\"9\" failures=\"2\" errors=\"1\" skipped=\"2\""),
        "{xml}"
    );
}

/// With `--cache-dir`, a second `ivory test` over the same suite asks the registry nothing and
/// prints the same results. `--nocapture` prints the figures BENCHMARKS.md quotes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ivory_test_run_asks_the_registry_nothing() {
    let h = registry().await;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache").display().to_string();
    let passing = suites().join("passing").display().to_string();
    let args = test_args(&h, dir.path(), &[&passing, "--cache-dir", &cache]);
    let mut runs = Vec::new();
    for _ in 0..2 {
        h.reset_requests();
        let started = ivory_clock::now();
        let run = ivory(&args).await;
        let millis = started.elapsed().as_millis();
        assert_eq!(run.code, 0, "{}", show(&run));
        runs.push((run, h.requests().len(), millis));
    }
    let (first, cold, cold_ms) = &runs[0];
    let (second, warm, warm_ms) = &runs[1];
    assert_eq!(first.stdout, second.stdout);
    assert!(*cold > 0);
    assert_eq!(
        *warm,
        0,
        "the second run asked the registry: {:?}",
        h.requests()
    );
    eprintln!(
        "ivory test (5 Pods, 2 images): first run {cold} registry requests in {cold_ms} ms, second {warm} in {warm_ms} ms"
    );
}
