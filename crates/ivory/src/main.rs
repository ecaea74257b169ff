//! `ivory`: a Kyverno ImageValidatingPolicy-compatible admission webhook.
//!
//! This file only parses the command line, sets up logging and dispatches; each subcommand
//! lives in `cmd/<name>.rs` with its own `Args` and `run`. Adding one takes three lines: the
//! `mod` below, a `Command` variant and a `match` arm.
//!
//! The binary owns the command line (clap), the wiring of the library crates, exit codes and the
//! global allocator (mimalloc: see BENCHMARKS.md); no admission logic. `cmd/wiring.rs` builds
//! the verifier every command shares (`verifier_for`: the registry client with its bounds, the
//! persistent cache, `ivory_l2::DiskCache`); the commands judge through the engine's
//! `pipeline::run_routes` (every policy of each route, as `ivory apply` and `ivory test` run
//! it) and `report::ImageChecker` (one image, for `verify` and `audit`), and only render what
//! those return; `cmd/wiring/parity.rs` shows the webhook, the background scan and `run_routes`
//! giving one verdict for one review. `cmd/quick_policy.rs` turns `--key` and friends into a
//! policy; `cmd/audit/` walks registries and clusters and queues their images; `ivory doctor`
//! words and renders the checks `ivory_server::doctor` makes.
//!
//! `serve --supervise` (`cmd/serve/supervise.rs`): a parent process binds the listening socket,
//! hands it to the serving process by the systemd protocol (`LISTEN_FDS`,
//! `LISTEN_FDS_FIRST_FD`; taken with `listenfd`, whose `FromRawFd` is the one unsafe step, kept
//! out of this workspace, which forbids `unsafe`), starts it again at once when a signal ends
//! it, and passes SIGTERM/SIGINT on (rustix); the serving process asks for SIGTERM when its
//! parent dies.
//!
//! `ivory serve` logs through `log_writer.rs` (lines appended to a bounded buffer that one
//! thread writes out in one write: at once when the last admission in flight ends, which the
//! server reports through `ivory_server::Metrics::with_activity_hook` before its answer leaves,
//! and for any line logged while no admission runs, else every 50 ms; what does not fit is
//! dropped and counted, and stopping waits at most a second for a stalled consumer) in the
//! format of `json_log.rs` (tracing-subscriber's JSON lines, byte for byte, written in one pass
//! with the date formatted once per second). They replace tracing-appender, whose writer thread
//! spun, yielded and wrote once per line, and tracing-subscriber's JSON formatter, which
//! formats each value into a temporary string: together about a tenth of a warm admission
//! (BENCHMARKS.md).
//!
//! Files the one-shot commands write or read for the user go through `cmd/files.rs`: outputs
//! (`convert -o`, `test --junit`, `audit --policy-report`) are created new
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`) beside their target in a folder opened once and renamed over
//! it; suite inputs are resolved and checked to be inside the suite's root
//! (`TestCase::confine`), then opened along that path component by component without following
//! a link (`open_resolved`, `O_NONBLOCK` for the file) and must be regular files.
//!
//! `ivory test` runs Kyverno CLI test suites: `cmd/test.rs` is the command (flags,
//! `--test-case-selector`, the summary line); `cmd/test/report.rs` renders the table, the `-o`
//! documents and JUnit; `cmd/test/suite.rs` finds `kyverno-test.yaml` files (name order, hidden
//! folders included, links not followed, 32 levels at most) and decodes them and the files they
//! name (`Values`, `UserInfo`, `ClusterResource`) strictly through `serde_path_to_error`, so an
//! unknown or mistyped field is reported with its file and path; `cmd/test/load.rs` loads one
//! test: its policies through `ivory_policy::policy_files` and `PolicyFiles::load`, each file
//! confined to the suite's root and read by `suite::read` (documents of other kinds are noted
//! by name), its exceptions, resources, values, user info and namespaces, and its legacy
//! `kyverno.io` ClusterPolicy/Policy `verifyImages` rules converted as `ivory convert` converts
//! them (`cmd/test/legacy.rs`). `cmd/test/run.rs` runs it: every resource goes through
//! `run_routes` with `Stage::Validate` (after the converted legacy policies' mutating
//! stage, `pin_for_legacy_rules`, as Kyverno pins then verifies), once per admission operation
//! the rows ask for, with the namespace objects the test's cluster resources and values give;
//! each row is then checked against the engine's `PolicyResult`s read as Kyverno's report
//! results (`docs/kyverno-semantics.md` §15). The verifier is `wiring::verifier_for`'s, so the
//! persistent cache and every registry bound apply.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// An admission is hundreds of small, short-lived allocations (the parsed object, CEL values,
/// results) made and freed across tokio's worker threads, where mimalloc is much cheaper than
/// glibc's malloc (measured in BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod json_log;
mod log_writer;
#[cfg(test)]
mod policy_log_lines;

mod cmd {
    pub(crate) mod apply;
    pub(crate) mod audit;
    pub(crate) mod convert;
    pub(crate) mod doctor;
    pub(crate) mod files;
    pub(crate) mod output;
    pub(crate) mod quick_policy;
    pub(crate) mod serve;
    pub(crate) mod test;
    pub(crate) mod verify;
    pub(crate) mod verify_blob;
    pub(crate) mod webhooks;
    pub(crate) mod wiring;
}

#[derive(Parser)]
#[command(name = "ivory", version, about, propagate_version = true)]
struct Cli {
    /// Log format (logs go to stderr). Default: `json` for `serve` and whenever stderr is not
    /// a terminal, `text` for the other commands on a terminal.
    #[arg(long, global = true, value_enum, env = "IVORY_LOG_FORMAT")]
    log_format: Option<LogFormat>,
    /// Log level or tracing filter (e.g. `info`, `debug`, `ivory_server=debug,info`).
    #[arg(long, global = true, default_value = "info", env = "IVORY_LOG")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the admission webhook (HTTPS; HTTP/1.1 and HTTP/2).
    Serve(cmd::serve::Args),
    /// Print the Mutating- and ValidatingWebhookConfiguration for the policies, as YAML.
    Webhooks(cmd::webhooks::Args),
    /// Verify images against policies (or --key / keyless flags) and report per attestor.
    Verify(cmd::verify::Args),
    /// Verify a file or a sha256 digest against a Sigstore bundle (cosign verify-blob's flags).
    VerifyBlob(cmd::verify_blob::Args),
    /// Run the mutating then the validating stage on resource files, as the webhook would.
    Apply(cmd::apply::Args),
    /// Verify every image of a registry or an image list; table, JSON, YAML, SARIF, PolicyReport.
    Audit(cmd::audit::Args),
    /// Convert Kyverno ClusterPolicy/Policy verifyImages rules to ImageValidatingPolicies.
    Convert(cmd::convert::Args),
    /// Run Kyverno CLI test suites (kyverno-test.yaml) with ivory's engine; table and JUnit.
    Test(cmd::test::Args),
    /// Check each layer through the Kubernetes API: CRDs, policies, webhook registration, endpoint.
    Doctor(cmd::doctor::Args),
    /// Print a shell completion script (e.g. `ivory completions bash > /etc/bash_completion.d/ivory`).
    Completions {
        /// Shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Completions { shell } = cli.command {
        use clap::CommandFactory as _;
        clap_complete::generate(shell, &mut Cli::command(), "ivory", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let serve = matches!(cli.command, Command::Serve(_));
    let format = cli
        .log_format
        .unwrap_or_else(|| default_log_format(serve, std::io::stderr().is_terminal()));
    // Held to the end of main: dropping it flushes the serve log's buffered lines.
    let log = match init_tracing(format, &cli.log_level, serve) {
        Ok(log) => log,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    // reqwest, the registry client and the TLS listener must agree on one provider.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let result = match cli.command {
        Command::Serve(args) => cmd::serve::run(args, log.as_ref().map(ServeLog::hooks)).await,
        Command::Webhooks(args) => cmd::webhooks::run(args).await,
        Command::Verify(args) => cmd::verify::run(args).await,
        Command::VerifyBlob(args) => cmd::verify_blob::run(args),
        Command::Apply(args) => cmd::apply::run(args).await,
        Command::Audit(args) => cmd::audit::run(args).await,
        Command::Test(args) => cmd::test::run(args).await,
        Command::Doctor(args) => cmd::doctor::run(args).await,
        Command::Convert(args) => cmd::convert::run(args).await,
        Command::Completions { .. } => Ok(ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        // Said once: a server's collector reads the structured line; a person or a script
        // running a one-shot command reads the plain one (its log shares the terminal).
        Err(e) if serve => {
            tracing::error!(error = format!("{e:#}"), "ivory failed");
            ExitCode::from(2)
        }
        Err(e) => {
            // One line, whatever registry or user text the error carries.
            eprintln!("error: {}", cmd::output::terminal(&format!("{e:#}")));
            ExitCode::from(2)
        }
    }
}

/// A person at a terminal reads a one-shot command's logs; a server's go to a collector, and
/// so does anything piped.
fn default_log_format(serve: bool, stderr_is_terminal: bool) -> LogFormat {
    if stderr_is_terminal && !serve {
        LogFormat::Text
    } else {
        LogFormat::Json
    }
}

/// What of the serve log may wait for the log consumer before new lines are dropped.
const SERVE_LOG_BOUNDS: log_writer::Bounds = log_writer::Bounds {
    lines: 8192,
    bytes: 16 << 20,
};

/// The serve log's writer thread (writes out what is buffered when dropped).
struct ServeLog {
    log: log_writer::BatchedLog,
}

impl ServeLog {
    /// Its count of dropped lines, and what it is told when admissions start and stop running.
    fn hooks(&self) -> (ivory_server::LogDropsSource, ivory_server::ActivityHook) {
        (
            std::sync::Arc::new(self.log.dropped()),
            std::sync::Arc::new(self.log.activity()),
        )
    }
}

/// Logs to stderr. `serve` writes from a thread of its own: a log consumer that stalls (a full
/// pipe, a slow collector) must not stall admissions, so lines beyond the buffer are dropped and
/// counted (`ivory_log_lines_dropped_total`). One-shot commands write directly.
fn init_tracing(format: LogFormat, level: &str, serve: bool) -> anyhow::Result<Option<ServeLog>> {
    let filter = EnvFilter::try_new(level)
        .map_err(|e| anyhow::anyhow!("invalid --log-level {level:?}: {e}"))?;
    let (writer, log) = if serve {
        let (log, sink) = log_writer::BatchedLog::start(std::io::stderr(), SERVE_LOG_BOUNDS)
            .map_err(|e| anyhow::anyhow!("starting the log writer thread: {e}"))?;
        if format == LogFormat::Json {
            // The server's result and admission lines, written as their events would be.
            let lines = json_log::MembersLines::new(sink.clone());
            let _ = ivory_plumbing::json_text::set_members_log(Box::new(lines));
        }
        (BoxMakeWriter::new(sink), Some(ServeLog { log }))
    } else {
        (BoxMakeWriter::new(std::io::stderr), None)
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    match format {
        LogFormat::Json => builder
            .json()
            .with_current_span(false)
            .event_format(json_log::JsonLines::new())
            .init(),
        LogFormat::Text => builder.init(),
    }
    Ok(log)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn cli_definition_is_consistent() {
        // Checks every `requires`/`conflicts_with` names a real argument, among others.
        super::Cli::command().debug_assert();
    }

    #[test]
    fn every_command_that_reaches_registries_takes_the_same_registry_flags() {
        use clap::Parser as _;
        let flags = [
            "--registry-ca",
            "/nonexistent/ca.pem",
            "--docker-config",
            "/nonexistent/config.json",
            "--registry-concurrency",
            "3",
            "--allow-http-registry",
        ];
        for command in ["serve", "verify", "apply", "audit"] {
            let parsed = super::Cli::try_parse_from(["ivory", command].iter().chain(&flags));
            // Parsing may stop at the command's own required arguments, never at these flags.
            if let Err(e) = &parsed {
                assert!(
                    e.kind() == clap::error::ErrorKind::MissingRequiredArgument,
                    "{command}: {e}"
                );
            }
            let zero =
                super::Cli::try_parse_from(["ivory", command, "--registry-concurrency", "0"]);
            let err = zero.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                err.contains("--registry-concurrency"),
                "{command} accepted 0: {err}"
            );
        }
    }

    #[test]
    fn logs_are_text_only_for_one_shot_commands_on_a_terminal() {
        use super::{LogFormat, default_log_format};
        assert_eq!(default_log_format(false, true), LogFormat::Text);
        assert_eq!(default_log_format(true, true), LogFormat::Json);
        assert_eq!(default_log_format(false, false), LogFormat::Json);
        assert_eq!(default_log_format(true, false), LogFormat::Json);
    }
}
