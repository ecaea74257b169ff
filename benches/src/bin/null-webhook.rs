//! The null webhook: the same serving stack as ivory-server (axum + axum-server rustls,
//! HTTP/1.1 and HTTP/2 via ALPN, the same certificate loading) that reads the body, parses
//! nothing and answers a fixed "allowed" AdmissionReview. Its throughput is the practical
//! ceiling of an HTTPS webhook on this machine.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::http::header::CONTENT_TYPE;
use axum_server::tls_rustls::RustlsConfig;
use clap::Parser;

/// The same allocator as `ivory`, so that the ceiling is the same stack.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ALLOWED: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":true}}"#;

#[derive(Parser)]
#[command(about = "HTTPS webhook that answers every request with a fixed allowed review")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:9444")]
    listen: SocketAddr,
    #[arg(long)]
    tls_cert: PathBuf,
    #[arg(long)]
    tls_key: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = RustlsConfig::from_pem_file(&args.tls_cert, &args.tls_key)
        .await
        .with_context(|| format!("loading {}", args.tls_cert.display()))?;
    // Drains the body like ivory does (axum's Bytes extractor), then ignores it.
    let app = Router::new()
        .fallback(|_body: Bytes| async { ([(CONTENT_TYPE, "application/json")], ALLOWED) });
    axum_server::bind_rustls(args.listen, config)
        .serve(app.into_make_service())
        .await
        .with_context(|| format!("serving on {}", args.listen))
}
