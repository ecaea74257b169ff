//! End-to-end test support: a real kube-apiserver and etcd on 127.0.0.1, and kube-rs clients for it.
//!
//! The binaries are built by `scripts/e2e/build.sh` (from the Go module proxy, into
//! `~/.cache/ivory-e2e`) and the processes are started by `scripts/e2e/cluster.sh`, which this
//! crate runs. `scripts/e2e.sh` does both and runs the cluster tests
//! (`cargo test -p ivory-e2e --features e2e`).

mod cluster;
mod ivory;
mod matrix;
mod metrics;
mod support;

pub use cluster::{Cluster, KEEP_ENV, KUBECONFIG_ENV};
pub use ivory::{IvoryServer, ivory_binary, run_ivory};
pub use matrix::{FailureMatrix, Row, report_path};
pub use metrics::metric_value;
pub use support::{create_namespace, eventually, unique_name, unused_local_port};

use std::path::PathBuf;
use std::time::Duration;

/// Errors of the end-to-end support code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating a folder for the test cluster: {0}")]
    TempDir(#[source] std::io::Error),
    #[error("running {script}: {source}")]
    Spawn {
        script: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{script} start failed ({status}); its output:\n{output}")]
    Start {
        script: PathBuf,
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("building a Kubernetes client from {path}: {source}")]
    Client {
        path: PathBuf,
        #[source]
        source: kube::Error,
    },
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("building a request: {0}")]
    Request(String),
    #[error("finding a free port on 127.0.0.1: {0}")]
    Port(#[source] std::io::Error),
    #[error("running {binary} (build it with `cargo build -p ivory`): {source}")]
    Ivory {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("ivory serve did not start listening; its log:\n{logs}")]
    IvoryStart { logs: String },
    #[error("the ivory process is gone")]
    IvoryGone,
    #[error("timed out after {timeout:?} waiting for {what}; last attempt: {last}")]
    Timeout {
        what: String,
        timeout: Duration,
        last: String,
    },
}

/// Result of the end-to-end support code.
pub type Result<T, E = Error> = std::result::Result<T, E>;
