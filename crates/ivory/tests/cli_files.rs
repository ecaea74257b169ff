//! The one-shot commands' files and terminals, as a process, against a hostile folder or
//! suite: `ivory convert -o DIR` replaces links planted in DIR and never writes through them;
//! `ivory test` reads only regular files inside the suite's root (a `../` path or a link out
//! is refused naming the path, a FIFO is refused at once instead of hanging, a file that is
//! not YAML is named without being quoted); names carrying escape sequences, C1 controls or
//! bidi overrides reach stdout, stderr and JUnit written visibly.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::cli_util::Run;
use crate::util::BIN;
use ivory_testkit::fixtures_dir;

/// Generous: the point is that the run ends at all (a FIFO read would block forever).
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// Runs `ivory <args>` in `cwd`, killed (and the test failed) when it has not ended within
/// [`RUN_LIMIT`].
async fn ivory_in(cwd: &Path, args: &[&str]) -> Run {
    let cache = tempfile::tempdir().unwrap();
    let child = tokio::process::Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env("IVORY_LOG", "warn")
        .env("IVORY_CACHE_DIR", cache.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("ivory {args:?} did not end within {RUN_LIMIT:?}"))
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn show(run: &Run) -> String {
    format!(
        "code {}\nstdout:\n{}\nstderr:\n{}",
        run.code, run.stdout, run.stderr
    )
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// Characters that must never reach a terminal or a report raw: C0 controls but line feed,
/// DEL, C1 controls, bidi embeddings, overrides and isolates.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
        })
        .collect()
}

/// A legacy ClusterPolicy of the convert corpus, its registry placeholder filled in.
fn legacy_policy() -> String {
    std::fs::read_to_string(fixtures_dir().join("legacy/corpus/key-enforce.yaml"))
        .unwrap()
        .replace("REGISTRY_HOST", "127.0.0.1:5000")
}

fn files_of(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn convert_replaces_links_planted_in_the_output_folder_and_never_writes_through_them() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("legacy.yaml");
    write(&input, &legacy_policy());
    let input = input.display().to_string();
    // A clean run says which files convert writes.
    let clean = dir.path().join("clean");
    let run = ivory_in(
        dir.path(),
        &["convert", &input, "-o", &clean.display().to_string()],
    )
    .await;
    assert_eq!(run.code, 0, "{}", show(&run));
    let names = files_of(&clean);
    assert!(!names.is_empty(), "{}", show(&run));

    // Another user's links in the folder: at every target and at the temporary name a
    // writer would pick beside it (`.<name>.tmp`), each to a file of its own.
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let mut victims: Vec<PathBuf> = Vec::new();
    for name in &names {
        for planted in [name.clone(), format!(".{name}.tmp")] {
            let victim = dir.path().join(format!("victim-{}", victims.len()));
            write(&victim, "precious\n");
            std::os::unix::fs::symlink(&victim, out.join(&planted)).unwrap();
            victims.push(victim);
        }
    }
    let run = ivory_in(
        dir.path(),
        &["convert", &input, "-o", &out.display().to_string()],
    )
    .await;
    assert_eq!(run.code, 0, "{}", show(&run));
    for victim in &victims {
        assert_eq!(
            std::fs::read_to_string(victim).unwrap(),
            "precious\n",
            "{} was written through a link\n{}",
            victim.display(),
            show(&run)
        );
    }
    for name in &names {
        let written = out.join(name);
        let meta = std::fs::symlink_metadata(&written).unwrap();
        assert!(meta.is_file(), "{name} is still a link");
        assert_eq!(
            std::fs::read(&written).unwrap(),
            std::fs::read(clean.join(name)).unwrap(),
            "{name}"
        );
    }
}

/// A suite folder `suite` in `dir` with the passing suite's policy and a test naming
/// `resources` (YAML flow list items) and one row about `resource`.
fn suite(dir: &Path, resources: &str, resource: &str) -> PathBuf {
    let suite = dir.join("suite");
    std::fs::create_dir_all(&suite).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/ivory-test-suites/passing/policy.yaml"),
        suite.join("policy.yaml"),
    )
    .unwrap();
    write(
        &suite.join("kyverno-test.yaml"),
        &format!(
            "apiVersion: cli.kyverno.io/v1alpha1\nkind: Test\nmetadata: {{name: t}}\npolicies: [policy.yaml]\nresources: [{resources}]\nresults:\n- {{policy: require-signed, isImageValidatingPolicy: true, kind: Pod, resources: [{resource}], result: pass}}\n"
        ),
    );
    suite
}

const SECRET: &str = "SECRET-TOKEN-6f1c9a";

#[tokio::test]
async fn ivory_test_reads_only_files_inside_the_suite_and_never_quotes_them() {
    let dir = tempfile::tempdir().unwrap();
    // A CI runner's kubeconfig, beside the checked-out suite.
    let kubeconfig = dir.path().join("kubeconfig");
    write(
        &kubeconfig,
        &format!(
            "apiVersion: v1\nkind: Config\nmetadata: {{name: {SECRET}}}\nusers:\n- name: ci\n  user: {{token: {SECRET}}}\n"
        ),
    );
    let junit = dir.path().join("junit.xml");
    let junit_arg = junit.display().to_string();
    let absolute = kubeconfig.display().to_string();
    for (how, resources) in [
        ("../", "../kubeconfig"),
        ("absolute", absolute.as_str()),
        ("link", "link.yaml"),
        ("../ after a folder", "sub/../../kubeconfig"),
    ] {
        let suite = suite(dir.path(), resources, SECRET);
        std::fs::create_dir_all(suite.join("sub")).unwrap();
        let _ = std::fs::remove_file(suite.join("link.yaml"));
        std::os::unix::fs::symlink(&kubeconfig, suite.join("link.yaml")).unwrap();
        let _ = std::fs::remove_file(&junit);
        let run = ivory_in(
            dir.path(),
            &["test", "suite", "--detailed-results", "--junit", &junit_arg],
        )
        .await;
        assert_eq!(run.code, 2, "{how}: {}", show(&run));
        assert!(
            run.stderr.contains("outside the suite's folder")
                && run.stderr.contains("--allow-outside-root"),
            "{how}: {}",
            show(&run)
        );
        let xml = std::fs::read_to_string(&junit).unwrap();
        for (what, text) in [
            ("stdout", &run.stdout),
            ("stderr", &run.stderr),
            ("junit", &xml),
        ] {
            assert!(
                !text.contains(SECRET),
                "{how}: {what} shows the secret\n{text}"
            );
        }
    }
    // `--allow-outside-root` widens it: the file is read (its object is a resource of the test).
    let run = ivory_in(dir.path(), &["test", "suite", "--allow-outside-root"]).await;
    assert!(
        !run.stderr.contains("outside the suite's folder") && run.stdout.contains(SECRET),
        "{}",
        show(&run)
    );

    // A file inside the suite that is not YAML: named with its line and column, not quoted.
    let folder = suite(dir.path(), "bad.yaml", "x");
    write(&folder.join("bad.yaml"), &format!("token: \"{SECRET}\n"));
    let run = ivory_in(dir.path(), &["test", "suite"]).await;
    assert_eq!(run.code, 2, "{}", show(&run));
    assert!(
        run.stderr
            .contains("bad.yaml: document 1: not valid YAML at line 1 column 8"),
        "{}",
        show(&run)
    );
    assert!(
        !run.stderr.contains(SECRET) && !run.stdout.contains(SECRET),
        "{}",
        show(&run)
    );
}

#[tokio::test]
async fn ivory_test_refuses_a_fifo_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let folder = suite(dir.path(), "fifo.yaml", "x");
    let made = std::process::Command::new("mkfifo")
        .arg(folder.join("fifo.yaml"))
        .status()
        .unwrap();
    assert!(made.success());
    // Nothing ever opens the FIFO for writing: a blocking open would wait forever.
    let run = ivory_in(dir.path(), &["test", "suite"]).await;
    assert_eq!(run.code, 2, "{}", show(&run));
    assert!(
        run.stderr
            .contains("fifo.yaml: not a regular file (a FIFO)"),
        "{}",
        show(&run)
    );
    // A folder or a device where a file is named: refused alike.
    suite(dir.path(), "/dev/zero", "x");
    let run = ivory_in(dir.path(), &["test", "suite", "--allow-outside-root"]).await;
    assert_eq!(run.code, 2, "{}", show(&run));
    assert!(
        run.stderr.contains("not a regular file (a device)"),
        "{}",
        show(&run)
    );
}

#[tokio::test]
async fn names_with_escape_sequences_reach_terminals_and_junit_visibly() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite");
    std::fs::create_dir(&suite).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/ivory-test-suites/passing/policy.yaml"),
        suite.join("policy.yaml"),
    )
    .unwrap();
    // ESC ]0; sets a terminal's title, ESC [2J clears it, U+009B is the 8-bit CSI, U+202E
    // reverses what follows; YAML's `\u` escapes put them in the names.
    write(
        &suite.join("res.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: \"pod\\u001b]0;pwned\\u0007\"}\nspec: {containers: [{name: a, image: \"ghcr.io/x/y:1\"}]}\n",
    );
    write(
        &suite.join("kyverno-test.yaml"),
        "apiVersion: cli.kyverno.io/v1alpha1\nkind: Test\nmetadata: {name: \"t\\u001b]0;TITLE\\u0007\\u202e\\u009b31m\"}\npolicies: [policy.yaml]\nresources: [res.yaml]\nresults:\n- {policy: \"evil\\u001b]0;P\\u0007\", rule: \"r\\u001b[2J\\u202e\", isImageValidatingPolicy: true, kind: Pod, resources: [\"pod\\u001b]0;pwned\\u0007\"], result: pass}\n",
    );
    let junit = dir.path().join("junit.xml");
    let run = ivory_in(
        dir.path(),
        &[
            "test",
            "suite",
            "--detailed-results",
            "--junit",
            &junit.display().to_string(),
        ],
    )
    .await;
    assert_eq!(run.code, 1, "{}", show(&run));
    let xml = std::fs::read_to_string(&junit).unwrap();
    for (what, text) in [
        ("stdout", &run.stdout),
        ("stderr", &run.stderr),
        ("junit", &xml),
    ] {
        assert_eq!(raw_controls(text), Vec::<char>::new(), "{what}:\n{text}");
    }
    assert!(
        run.stdout
            .contains("Loading test t\\x1b]0;TITLE\\x07\\u{202e}\\u{9b}31m")
            && run.stdout.contains("evil\\x1b]0;P\\x07")
            && run.stdout.contains("r\\x1b[2J\\u{202e}"),
        "{}",
        show(&run)
    );
    assert!(
        xml.contains("<testsuite name=\"t\\x1b]0;TITLE\\x07\\u{202e}\\u{9b}31m (")
            && xml.contains("classname=\"evil\\x1b]0;P\\x07\"")
            && xml.contains("pod\\x1b]0;pwned\\x07 (r\\x1b[2J\\u{202e})"),
        "{xml}"
    );
    // Every character is one XML 1.0 allows.
    assert!(
        xml.chars().all(|c| matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)),
        "{xml}"
    );

    // `-o json`: the same names as JSON escapes, the document unchanged for a parser.
    let run = ivory_in(dir.path(), &["test", "suite", "-o", "json"]).await;
    assert_eq!(run.code, 1, "{}", show(&run));
    assert_eq!(
        raw_controls(&run.stdout),
        Vec::<char>::new(),
        "{}",
        show(&run)
    );
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(doc[0]["RULE"], "r\u{1b}[2J\u{202e}", "{}", show(&run));

    // `ivory convert`'s report names the input's policies and rules.
    let input = dir.path().join("evil.yaml");
    let evil = legacy_policy()
        .replace(
            "  name: key-enforce",
            "  name: \"key-enforce\\u001b]0;T\\u0007\\u202e\"",
        )
        .replace(
            "    - name: signed",
            "    - name: \"signed\\u001b]0;R\\u0007\"",
        );
    write(&input, &evil);
    let run = ivory_in(dir.path(), &["convert", &input.display().to_string()]).await;
    assert_eq!(run.code, 0, "{}", show(&run));
    assert_eq!(
        raw_controls(&run.stderr),
        Vec::<char>::new(),
        "{}",
        show(&run)
    );
    assert!(
        run.stderr.contains(
            "ClusterPolicy/key-enforce\\x1b]0;T\\x07\\u{202e}, rule signed\\x1b]0;R\\x07"
        ),
        "{}",
        show(&run)
    );
}
