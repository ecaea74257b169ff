//! `ivory-testkit-registry [--tls] LAYOUT_DIR…`: the real `docker-registry` on a free
//! 127.0.0.1 port (plain HTTP unless `--tls`), with each OCI layout pushed as repository
//! `ivory/<dir name>`, kept running until SIGTERM or SIGINT arrives; the registry
//! and its data are removed then. For `scripts/demo.sh` and people trying ivory by hand.
//!
//! stdout, one line each: `pushed <host>/ivory/<name>:<tag> <digest>` per tag, then
//! `ready <host>` once everything is pushed.

use std::path::PathBuf;
use std::process::ExitCode;

use ivory_testkit::{Error, HarnessOptions, RegistryHarness};
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ivory-testkit-registry: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<(), Error> {
    let mut tls = false;
    let mut layouts = Vec::new();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--tls" => tls = true,
            "-h" | "--help" => {
                println!("usage: ivory-testkit-registry [--tls] LAYOUT_DIR...");
                return Ok(());
            }
            _ => layouts.push(PathBuf::from(arg)),
        }
    }
    let opts = if tls {
        HarnessOptions::default()
    } else {
        HarnessOptions::plain_http()
    };
    // Dropped on every return below, which stops the registry and removes its data.
    let harness = RegistryHarness::start(opts).await?;
    for dir in &layouts {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::Layout {
                path: dir.display().to_string(),
                detail: "not a layout directory name".to_owned(),
            })?;
        let repo = format!("ivory/{name}");
        let tags = harness.push_oci_layout(dir, &repo).await?;
        for (tag, digest) in tags.iter().filter(|(t, _)| !t.starts_with("sha256-")) {
            println!("pushed {}/{repo}:{tag} {digest}", harness.host());
        }
    }
    println!("ready {}", harness.host());
    wait_for_stop().await
}

/// Returns when SIGTERM or SIGINT arrives (handled, so the registry is stopped on the way
/// out rather than orphaned).
async fn wait_for_stop() -> Result<(), Error> {
    let handler = |what: &str| {
        let context = format!("installing the {what} handler");
        move |source| Error::Io { context, source }
    };
    let mut term = signal(SignalKind::terminate()).map_err(handler("SIGTERM"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(handler("SIGINT"))?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
