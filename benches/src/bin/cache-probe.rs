//! `cache-probe --verdicts N`: the verdict cache of `ivory serve` (`CosignVerifier`, the same
//! allocator) holding N verified verdicts: its resident memory per verdict and the time of a
//! cache-hit verification through `ImageVerifier::verify`, printed as one JSON line. One fresh
//! process per size, so each figure starts from the same empty heap (`ivory-bench curves`).
//!
//! The verdicts are put in the cache directly (`seed_verified_verdicts`, feature
//! `bench-support`): verifying a million images through a registry would take hours. Every
//! lookup must be a hit, or the probe fails (a wrong seed key would otherwise measure misses).

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use clap::Parser;
use ivory_engine::verifier::{ImageVerifier as _, Verification, VerifyRequest};
use ivory_policy::types::Attestor;
use ivory_reference::ImageReference;
use serde_json::json;

/// The same allocator as `ivory`, so that the memory per verdict is the product's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A registry nobody listens on: a lookup that missed the cache would fail, not hide.
const REPOSITORY: &str = "127.0.0.1:1/bench/cached";
/// A P-256 public key (any valid key: nothing is verified, only the attestor's hash is used).
const KEY: &str = include_str!("../../../fixtures/keys/cosign-p256.pub");

#[derive(Parser)]
#[command(about = "Memory and lookup time of ivory's verdict cache holding N verdicts")]
struct Args {
    /// Verified verdicts held by the cache.
    #[arg(long)]
    verdicts: usize,
    /// Cache-hit verifications timed (random images among the N).
    #[arg(long, default_value_t = 200_000)]
    lookups: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting tokio")?;
    let line = runtime.block_on(probe(&args))?;
    println!("{line}");
    Ok(())
}

async fn probe(args: &Args) -> Result<serde_json::Value> {
    let attestor: Attestor = serde_json::from_value(json!({
        "name": "bench",
        "cosign": {"key": {"data": KEY}},
    }))
    .context("the bench attestor")?;
    let config = ivory_verify::VerifierConfig {
        // Room above N: the figure is N verdicts held, not the cache's eviction.
        max_results: (args.verdicts + args.verdicts / 8 + 16) as u64,
        ..ivory_verify::VerifierConfig::default()
    };
    let registry = ivory_registry::Registry::new(ivory_registry::Config::default())
        .context("registry client")?;
    let verifier = ivory_verify::CosignVerifier::new(
        registry,
        config,
        ivory_verify::CosignVerifier::anonymous_credentials(),
    );
    let digests: Vec<String> = (0..args.verdicts).map(digest_of).collect();
    let rss_before = rss_kib()?;
    verifier
        .seed_verified_verdicts(REPOSITORY, &attestor, &digests)
        .await;
    let rss_after = rss_kib()?;

    // Parsed before the clock starts, as the engine parses a request's images before it asks.
    let requests: Vec<VerifyRequest> = random_indexes(args.lookups, args.verdicts)
        .map(|i| -> Result<VerifyRequest> {
            let image = format!("{REPOSITORY}@{}", digests[i]);
            Ok(VerifyRequest {
                image: ImageReference::parse(&image)
                    .map_err(|e| anyhow::anyhow!("{image}: {e}"))?,
                attestor: attestor.clone(),
                attestation: None,
                credentials: None,
                platforms: Default::default(),
            })
        })
        .collect::<Result<_>>()?;
    let deadline = ivory_clock::now() + Duration::from_secs(3600);
    let started = ivory_clock::now();
    let mut verified = 0usize;
    for request in &requests {
        if let Ok(Verification::Verified { .. }) = verifier.verify(request, deadline).await {
            verified += 1;
        }
    }
    let elapsed = started.elapsed();
    ensure!(
        verified == requests.len(),
        "{} of {} lookups verified: the seeded verdicts were not hit",
        verified,
        requests.len()
    );
    let added_kib = rss_after.saturating_sub(rss_before);
    Ok(json!({
        "verdicts": args.verdicts,
        "lookups": requests.len(),
        "lookup_ns": (elapsed.as_nanos() / requests.len().max(1) as u128) as u64,
        "rss_mib": round(rss_after as f64 / 1024.0),
        "rss_mib_added": round(added_kib as f64 / 1024.0),
        "bytes_per_verdict": (added_kib * 1024) / args.verdicts.max(1) as u64,
    }))
}

/// A distinct `sha256:` digest per index.
fn digest_of(i: usize) -> String {
    format!("sha256:{i:064x}")
}

/// `count` indexes below `below`, spread by a fixed linear congruential sequence (the same in
/// every run, so two runs look up the same images).
fn random_indexes(count: usize, below: usize) -> impl Iterator<Item = usize> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..count).map(move |_| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) as usize) % below.max(1)
    })
}

/// VmRSS of this process, KiB.
fn rss_kib() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmRSS missing in /proc/self/status")
}

fn round(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}
