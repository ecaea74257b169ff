//! End-to-end test support: a real kube-apiserver and etcd on 127.0.0.1, and kube-rs clients for it.
//!
//! The binaries are built by `scripts/e2e/build.sh` (from the Go module proxy, into
//! `~/.cache/ivory-e2e`) and the processes are started by `scripts/e2e/cluster.sh`, which this
//! crate runs. `scripts/e2e.sh` does both and runs the cluster tests
//! (`cargo test -p ivory-e2e --features e2e`): one test binary, `tests/e2e/main.rs`, one module
//! per area. Their common set-up (CRDs from the repository, fixture pushes, TLS for ivory,
//! `ivory serve`, the webhooks `ivory webhooks` prints, objects and policies applied
//! server-side) is in `tests/e2e/setup.rs`; the tests read the API server's audit
//! log, where the `verified-images` annotation is the evidence of what ivory verified.

mod cluster;
mod ivory;
mod matrix;
mod metrics;
mod support;

pub use cluster::{Cluster, KEEP_ENV, KUBECONFIG_ENV};
pub use ivory::{IvoryServer, ivory_binary, run_ivory};
pub use matrix::{FailureMatrix, Row, report_path};
pub use metrics::metric_value;
pub use support::{create_labelled_namespace, create_namespace, eventually, unique_name};

use std::path::PathBuf;
use std::time::Duration;

/// Errors of the end-to-end support code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The temporary folder for the cluster could not be created.
    #[error("creating a folder for the test cluster: {0}")]
    TempDir(#[source] std::io::Error),
    /// A cluster script could not be started.
    #[error("running {script}: {source}")]
    Spawn {
        /// The script.
        script: PathBuf,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// A cluster script ran and failed.
    #[error("{script} start failed ({status}); its output:\n{output}")]
    Start {
        /// The script.
        script: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed.
        output: String,
    },
    /// The cluster's kubeconfig could not be read.
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No client could be built from the kubeconfig.
    #[error("building a Kubernetes client from {path}: {source}")]
    Client {
        /// The kubeconfig file.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: kube::Error,
    },
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// An API request could not be built.
    #[error("building a request: {0}")]
    Request(String),
    /// The ivory binary could not be started.
    #[error("running {binary} (build it with `cargo build -p ivory`): {source}")]
    Ivory {
        /// The binary.
        binary: PathBuf,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// `ivory serve` exited or never listened.
    #[error("ivory serve did not start listening; its log:\n{logs}")]
    IvoryStart {
        /// What it logged.
        logs: String,
    },
    /// The ivory process exited while a test still needed it.
    #[error("the ivory process is gone")]
    IvoryGone,
    /// A wait for the cluster or ivory ran out.
    #[error("timed out after {timeout:?} waiting for {what}; last attempt: {last}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the wait was.
        timeout: Duration,
        /// The last attempt's failure.
        last: String,
    },
}

/// Result of the end-to-end support code.
pub type Result<T, E = Error> = std::result::Result<T, E>;
