//! The crate's error: why the server could not start or keep serving. Per-request problems
//! are answers, not errors (see [`crate::sources::CredentialError`] for the one that
//! crosses a module boundary).

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the server, or its Kubernetes source, could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The certificate or key file could not be read or is not a usable PEM pair.
    #[error("failed to load TLS certificate {cert} / key {key}: {source}")]
    Tls {
        /// The certificate chain file.
        cert: PathBuf,
        /// The private key file.
        key: PathBuf,
        /// Why loading failed.
        #[source]
        source: std::io::Error,
    },
    /// Binding or accepting on the listen address failed.
    #[error("failed to serve on {addr}: {source}")]
    Serve {
        /// The listen address.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// A watch stream of the Kubernetes source ended before it had listed everything once.
    #[error("the {what} watch ended before its first list completed")]
    NotSynced {
        /// The watched kind (`ImageValidatingPolicy`, `Namespace`, `Secret`, ...).
        what: &'static str,
    },
    /// A watch of the Kubernetes source did not finish its first list in time (missing CRD
    /// or RBAC, usually).
    #[error(
        "the {what} watch did not complete its first list within {}s (is the CRD installed, and \
         may ivory list and watch {what}? the watch errors are in the log)",
        waited.as_secs()
    )]
    SyncTimeout {
        /// The watched kind (`ImageValidatingPolicy`, `Namespace`, `Secret`, ...).
        what: &'static str,
        /// How long the first list was waited for.
        waited: std::time::Duration,
    },
}

/// `Result` with the crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
