//! Errors of the test harness; messages say which step failed.

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a test harness (registry, redis, signing, layouts) could not be set up or driven.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Filesystem or process I/O failed.
    #[error("{context}: {source}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// Certificate or key generation failed.
    #[error("pki: {0}")]
    Pki(String),
    /// An HTTP exchange with the harness registry failed.
    #[error("http: {0}")]
    Http(String),
    /// The OCI layout is malformed.
    #[error("oci layout {path}: {detail}")]
    Layout {
        /// The layout directory or file.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The registry process did not become ready.
    #[error("registry did not start: {0}")]
    Startup(String),
}

pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}
