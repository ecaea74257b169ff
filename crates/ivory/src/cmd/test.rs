//! `ivory test DIR…`: runs Kyverno CLI test suites (`kyverno-test.yaml`) unchanged with
//! ivory's engine: each test's image policies, exceptions and resources go through the
//! validating stage as the webhook runs it, and each `results` row is checked. Output like
//! `kyverno test`: a table per test, `Test Summary: N tests passed and M tests failed`;
//! `--junit FILE` writes one JUnit testcase per row. Exit 0 when every row passed, 1 when
//! any failed, 2 when a test could not be loaded or run (usage, files, registry setup).

mod legacy;
mod load;
mod report;
mod run;
mod suite;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};

use self::report::{OutputFormat, Unrun, document, junit, table};
use self::run::{Outcome, Row};
use self::suite::ResultRow;
use super::output;
use super::wiring::{RegistryOpts, duration};

#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 every result as expected, 1 any result not as expected (Kyverno's \
`kyverno test` exits 1 too), 2 a test could not be loaded or run (a malformed kyverno-test.yaml, a \
missing file, an invalid policy, a legacy ClusterPolicy that needs `ivory convert`). Rows about \
policies that are not image policies (ValidatingPolicy, MutatingPolicy, …) are shown as not run \
and change no exit status."
)]
pub(crate) struct Args {
    /// Folders searched recursively for test files (hidden folders included), or test files.
    #[arg(value_name = "DIR", required = true)]
    paths: Vec<PathBuf>,
    /// Name of the test files to look for.
    #[arg(
        long,
        short = 'f',
        value_name = "NAME",
        default_value = "kyverno-test.yaml"
    )]
    file_name: String,
    /// Which results to check: `policy=<glob>,rule=<glob>,resource=<glob>` (`*` and `?`).
    /// A resource other than `*` replaces every selected row's resources, as in Kyverno.
    #[arg(
        long,
        short = 't',
        value_name = "SELECTOR",
        default_value = "policy=*,rule=*,resource=*"
    )]
    test_case_selector: String,
    /// Add each result's message to the table (and to the JUnit output).
    #[arg(long)]
    detailed_results: bool,
    /// Print only the failed results, after the summary.
    #[arg(long)]
    fail_only: bool,
    /// Let tests read files outside their root: the folder given (links resolved), or a given
    /// test file's folder. Without it, a test naming `../..` or a link out of its folder is
    /// refused, so a suite from a pull request cannot print the CI runner's files.
    #[arg(long)]
    allow_outside_root: bool,
    /// Fail (exit 2) when no test file is found.
    #[arg(long)]
    require_tests: bool,
    /// Also write the results as JUnit XML to FILE (one testcase per result row).
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Print the results to stdout as this document instead of tables (progress and the
    /// summary go to stderr): Kyverno's `-o`.
    #[arg(long, short = 'o', value_enum, value_name = "FORMAT")]
    output_format: Option<OutputFormat>,
    /// Accepted for `kyverno test` command lines; ivory always asks the registries.
    #[arg(long, hide = true)]
    registry: bool,
    /// Accepted for `kyverno test` command lines; ivory's table has no colours.
    #[arg(long, hide = true)]
    remove_color: bool,
    /// Time budget per resource (Go duration), like the webhook's timeout.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration)]
    timeout: Duration,
    #[command(flatten)]
    registry_opts: RegistryOpts,
}

/// `--test-case-selector`: globs on a row's policy, rule and resources.
#[derive(Debug, Default)]
struct Selector {
    policy: Vec<String>,
    rule: Vec<String>,
    resource: Vec<String>,
}

impl Selector {
    /// Parses Kyverno's `key=value,…` form; a malformed part is an error naming it.
    fn parse(text: &str) -> anyhow::Result<Self> {
        let mut s = Self::default();
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            let Some((key, value)) = part.split_once('=') else {
                bail!("--test-case-selector: {part:?} is not <key>=<value>");
            };
            let value = value.trim().to_owned();
            match key.trim() {
                "policy" => s.policy.push(value),
                "rule" => s.rule.push(value),
                "resource" => s.resource.push(value),
                other => {
                    bail!("--test-case-selector: unknown key {other:?} (policy, rule or resource)")
                }
            }
        }
        Ok(s)
    }

    /// Kyverno's filter: an empty field of the row passes; otherwise every glob of that key
    /// must match it (a resource glob: any of the row's resources).
    fn selects(&self, row: &ResultRow) -> bool {
        let policy = row.policy.is_empty() || self.policy.iter().all(|g| glob(g, &row.policy));
        let rule = row.rule.is_empty() || self.rule.iter().all(|g| glob(g, &row.rule));
        let resource = row.resources.is_empty()
            || self
                .resource
                .iter()
                .all(|g| row.resources.iter().any(|r| glob(g, r)));
        policy && rule && resource
    }

    /// The row as run: a resource selector other than `*` replaces its resources.
    fn apply(&self, mut row: ResultRow) -> ResultRow {
        let named: Vec<String> = self
            .resource
            .iter()
            .take_while(|g| g.as_str() != "*")
            .cloned()
            .collect();
        if !named.is_empty() {
            row.resources = named;
        }
        row
    }
}

/// `*` (any run) and `?` (any one character) glob, as Kyverno's `wildcard.Match`.
fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let selector = Selector::parse(&args.test_case_selector)?;
    // With --output-format, stdout holds the document alone; progress goes to stderr.
    let console = Console {
        to_stderr: args.output_format.is_some(),
    };
    let files = suite::discover(&args.paths, &args.file_name)?;
    if files.is_empty() {
        if args.require_tests {
            bail!("no test files named {} found", args.file_name);
        }
        console.line("\nNo test yamls available");
    }
    let mut cases = Vec::new();
    for file in &files {
        cases.extend(suite::load(file, !args.allow_outside_root)?);
    }
    let config = args.registry_opts.config()?;
    let verifier = super::wiring::verifier_for(
        config,
        args.registry_opts.tag_cache_ttl,
        args.registry_opts.access.signature_repository(),
        args.registry_opts.cache.open(),
    )?;
    let ran = run_all(&args, &console, &selector, &cases, &verifier).await;
    for note in &ran.notes {
        eprintln!("note: {}", output::terminal(note));
    }
    let failed = summarize(&args, &console, &ran)?;
    if let Some(path) = &args.junit {
        let xml = junit(&ran.rows, &ran.unrun, args.detailed_results);
        super::files::write_replacing(path, xml.as_bytes())
            .with_context(|| format!("writing --junit {}", path.display()))?;
    }
    if !ran.unrun.is_empty() {
        let messages: Vec<&str> = ran.unrun.iter().map(|e| e.message.as_str()).collect();
        bail!(
            "{} of {} tests could not be run: {}",
            ran.unrun.len(),
            cases.len(),
            messages.join("; ")
        );
    }
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Where progress and tables go: stdout, or stderr when stdout holds `--output-format`'s
/// document.
struct Console {
    to_stderr: bool,
}

impl Console {
    fn line(&self, text: &str) {
        if self.to_stderr {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }
}

/// What running every selected test gave.
struct Ran {
    rows: Vec<Row>,
    unrun: Vec<Unrun>,
    notes: Vec<String>,
}

/// Runs each test's selected rows, printing its table; a test that cannot be run is
/// recorded and the others still run.
async fn run_all(
    args: &Args,
    console: &Console,
    selector: &Selector,
    cases: &[suite::TestCase],
    verifier: &dyn ivory_engine::verifier::ImageVerifier,
) -> Ran {
    let mut ran = Ran {
        rows: Vec::new(),
        unrun: Vec::new(),
        notes: Vec::new(),
    };
    for case in cases {
        if case.test.api_version.is_none() {
            ran.notes.push(format!(
                "{}: no apiVersion/kind: the deprecated test schema (Kyverno 1.19 refuses it; add apiVersion: cli.kyverno.io/v1alpha1, kind: Test)",
                case.path.display()
            ));
        }
        let rows: Vec<ResultRow> = case
            .test
            .results
            .iter()
            .filter(|r| selector.selects(r))
            .cloned()
            .map(|r| selector.apply(r))
            .collect();
        if rows.is_empty() {
            continue;
        }
        console.line(&format!(
            "Loading test {} ( {} ) ...",
            output::terminal(&case.name()),
            output::terminal(&case.path.display().to_string())
        ));
        match run::run_case(case, &rows, verifier, args.timeout, console, &mut ran.notes).await {
            Ok(results) => {
                console.line("  Checking results ...");
                if !args.fail_only {
                    console.line(&format!("\n{}", table(&results, args.detailed_results, 1)));
                }
                ran.rows.extend(results);
            }
            // One test that cannot run does not hide the others' results; the run ends 2.
            Err(e) => {
                let message = format!(
                    "test {:?} ({}, document {}) could not be run: {e:#}",
                    case.name(),
                    case.path.display(),
                    case.document
                );
                console.line(&format!("  Error: {}", output::terminal(&message)));
                ran.unrun.push(Unrun {
                    test: run::suite_name(case),
                    message,
                });
            }
        }
    }
    ran
}

/// Prints the summary (and `--fail-only`'s failures, `--output-format`'s document); returns
/// how many rows failed.
fn summarize(args: &Args, console: &Console, ran: &Ran) -> anyhow::Result<usize> {
    let rows = &ran.rows;
    let count = |o: Outcome| rows.iter().filter(|r| r.outcome == o).count();
    let (passed, failed, not_run) = (
        count(Outcome::Pass),
        count(Outcome::Fail),
        count(Outcome::NotRun),
    );
    if not_run > 0 {
        console.line(&format!(
            "\n{not_run} results not run: their policies are not image policies"
        ));
    }
    let shown: Vec<Row> = if args.fail_only {
        console.line(&format!(
            "\nTest Summary: {failed} out of {} tests failed\n",
            passed + failed
        ));
        let failures: Vec<Row> = rows
            .iter()
            .filter(|r| r.outcome == Outcome::Fail)
            .cloned()
            .collect();
        if !failures.is_empty() && args.output_format.is_none() {
            console.line("Aggregated Failed Test Cases : ");
            console.line(&table(&failures, args.detailed_results, 1));
        }
        failures
    } else {
        console.line(&format!(
            "\nTest Summary: {passed} tests passed and {failed} tests failed\n"
        ));
        rows.to_vec()
    };
    if let Some(format) = args.output_format {
        print!(
            "{}",
            document(format, &shown, &ran.unrun, args.detailed_results)?
        );
    }
    Ok(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: &str, rule: &str, resources: &[&str]) -> ResultRow {
        let mut r: ResultRow = suite::strict(serde_json::json!({
            "policy": policy, "rule": rule, "result": "pass", "resources": resources,
        }))
        .unwrap();
        r._kind = "Pod".into();
        r
    }

    #[test]
    fn globs_match_as_kyverno_wildcards() {
        assert!(glob("*", "") && glob("*", "abc") && glob("a*c", "abbbc"));
        assert!(glob("ivpol-?", "ivpol-1") && !glob("ivpol-?", "ivpol-12"));
        assert!(!glob("a*d", "abc") && glob("*-pod", "bad-pod"));
    }

    #[test]
    fn selectors_filter_rows_and_name_resources() {
        let s = Selector::parse("policy=ivpol-*, resource=bad-pod").unwrap();
        assert!(s.selects(&row("ivpol-sample", "", &["bad-pod", "good-pod"])));
        assert!(!s.selects(&row("other", "", &["bad-pod"])));
        assert!(!s.selects(&row("ivpol-sample", "", &["good-pod"])));
        assert_eq!(
            s.apply(row("ivpol-sample", "", &["bad-pod", "good-pod"]))
                .resources,
            vec!["bad-pod"]
        );
        let all = Selector::parse("policy=*,rule=*,resource=*").unwrap();
        assert_eq!(all.apply(row("p", "", &["a", "b"])).resources.len(), 2);
        for bad in ["policy", "kind=Pod"] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
    }
}
