//! `ivory-bench`: the load harness behind `scripts/bench.sh`.
//!
//! `ivory-bench load` starts a real docker-registry, pushes the signed fixture and synthetic
//! signed images, runs `ivory serve` (TLS) and the `null-webhook` ceiling, drives them from a
//! loopback load generator and writes every figure of one run to `target/bench/results.json`
//! and `target/bench/results.md`. See BENCHMARKS.md.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cache_probe;
mod convert_proof;
mod curves;
mod fleet;
mod loadgen;
mod peers;
mod phases;
mod procs;
mod report;
mod sign;
mod stack;

#[derive(Parser)]
#[command(about = "ivory load harness (see BENCHMARKS.md)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every load figure and write target/bench/results.{json,md}.
    Load(LoadArgs),
    /// Three `ivory serve` replicas sharing one redis-server: add the fleet figures to
    /// target/bench/results.json (`--cached-images` default 100000, 3000 with --quick).
    Fleet(LoadArgs),
    /// Kyverno's admission controller side by side with ivory (same registry, images, policies
    /// and reviews), run out of cluster against the e2e kube-apiserver: add the `kyverno_*`
    /// figures to target/bench/results.json (`scripts/bench.sh --peers`).
    Peers(peers::PeersArgs),
    /// The `ivory convert` proof: the legacy corpus of fixtures/legacy/ judged by Kyverno
    /// v1.19.1 (legacy ClusterPolicies) and by `ivory serve` (their conversions), side by side;
    /// writes fixtures/legacy/verdicts.json (`scripts/convert-proof.sh`).
    ConvertProof(convert_proof::ProofArgs),
    /// Cost curves: warm latency and CPU per admission for 1, 10, 100 containers per Pod and
    /// 1, 10, 50 matching policies; cold admissions of 1, 10, 100 never-seen images in one Pod;
    /// the verdict cache's lookup time and memory at 10k, 100k (and in a full run 1M) verdicts.
    /// Added to target/bench/results.json (`curve_*` keys, `details.curves`).
    Curves(LoadArgs),
}

/// Load harness settings.
#[derive(clap::Args, Clone, Debug)]
pub struct LoadArgs {
    /// Short run (under 3 minutes): fewer concurrencies, shorter steps, fewer cached images.
    #[arg(long)]
    pub quick: bool,
    /// The release `ivory` binary.
    #[arg(long, default_value = "target/release/ivory")]
    pub ivory: PathBuf,
    /// The `null-webhook` binary (default: next to this binary).
    #[arg(long)]
    pub null_webhook: Option<PathBuf>,
    /// cosign v2 binary for the cold-verification comparison.
    #[arg(long, default_value = ".tools/bin/cosign2")]
    pub cosign: PathBuf,
    /// The repository's fixtures folder.
    #[arg(long, default_value = "fixtures")]
    pub fixtures: PathBuf,
    /// Output folder.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// Distinct images verified (and cached) before peak RSS is read (default 10000; 3000
    /// with --quick).
    #[arg(long)]
    pub cached_images: Option<usize>,
    /// `fleet`: the replicas' `--cache-redis-timeout` (default: ivory's own).
    #[arg(long)]
    pub cache_redis_timeout: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ivory-bench: starting tokio: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Load(args) => phases::run(args).await,
            Command::Fleet(args) => fleet::run(args).await,
            Command::Peers(args) => peers::run(args).await,
            Command::ConvertProof(args) => convert_proof::run(args).await,
            Command::Curves(args) => curves::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ivory-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
