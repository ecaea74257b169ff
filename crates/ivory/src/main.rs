//! `ivory`: a Kyverno ImageValidatingPolicy-compatible admission webhook.
//!
//! This file only parses the command line, sets up logging and dispatches; each subcommand
//! lives in `cmd/<name>.rs` with its own `Args` and `run`. Adding one takes three lines: the
//! `mod` below, a `Command` variant and a `match` arm.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

/// An admission is hundreds of small, short-lived allocations (the parsed object, CEL values,
/// results) made and freed across tokio's worker threads, where mimalloc is much cheaper than
/// glibc's malloc (measured in BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cmd {
    pub mod apply;
    pub mod audit;
    pub mod check;
    pub mod doctor;
    pub mod output;
    pub mod serve;
    pub mod verify;
    pub mod webhooks;
    pub mod wiring;
}

#[derive(Parser)]
#[command(name = "ivory", version, about, propagate_version = true)]
struct Cli {
    /// Log format (logs go to stderr).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Json, env = "IVORY_LOG_FORMAT")]
    log_format: LogFormat,
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
    /// Run the mutating then the validating stage on resource files, as the webhook would.
    Apply(cmd::apply::Args),
    /// Verify every image of a registry or an image list; table, JSON, YAML, SARIF, PolicyReport.
    Audit(cmd::audit::Args),
    /// Check each layer through the Kubernetes API: CRDs, policies, webhook registration, endpoint.
    Doctor(cmd::doctor::Args),
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_tracing(cli.log_format, &cli.log_level) {
        eprintln!("error: {e:#}");
        return ExitCode::from(2);
    }
    // reqwest, the registry client and the TLS listener must agree on one provider.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let result = match cli.command {
        Command::Serve(args) => cmd::serve::run(args).await,
        Command::Webhooks(args) => cmd::webhooks::run(args).await,
        Command::Verify(args) => cmd::verify::run(args).await,
        Command::Apply(args) => cmd::apply::run(args).await,
        Command::Audit(args) => cmd::audit::run(args).await,
        Command::Doctor(args) => cmd::doctor::run(args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "ivory failed");
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn init_tracing(format: LogFormat, level: &str) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(level)
        .map_err(|e| anyhow::anyhow!("invalid --log-level {level:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().with_current_span(false).init(),
        LogFormat::Text => builder.init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn cli_definition_is_consistent() {
        // Checks every `requires`/`conflicts_with` names a real argument, among others.
        super::Cli::command().debug_assert();
    }
}
