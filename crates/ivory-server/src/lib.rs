//! ivory-server: the admission webhook over HTTPS (axum + rustls, HTTP/1.1 and HTTP/2).
//!
//! [`router`] builds the routes over an [`AppState`]; [`serve`] runs them with TLS reload and
//! graceful shutdown; [`policies`] holds the hot-reloaded policy set; [`webhooks`] renders the
//! webhook configurations that point the API server at those routes.

pub mod background;
pub mod budget;
pub mod cluster_resources;
pub mod connection;
mod error;
pub mod kube_source;
pub mod limits;
pub mod metrics;
pub mod policies;
pub mod policy_results;
pub mod reports;
mod routes;
mod serve;
pub mod sources;
pub mod webhooks;

pub use error::{Error, Result};
pub use kube_source::KubeSource;
pub use limits::{DEFAULT_BODY_LIMIT, HttpLimits};
pub use metrics::{
    ActivityHook, CacheCounts, CacheStatsSource, CrlCount, L2Counts, L2StatsSource, LogDropsSource,
    Metrics, RegistryStatsSource, ResourceWatchStatsSource, RevocationCounts,
    RevocationStatsSource, WatchStats,
};
pub use policies::{FileSource, PolicyStore, Snapshot};
pub use routes::{AppState, ExceptionSettings, READYZ_POLICY_ERRORS, router};
pub use serve::{Listen, ServeOptions, serve, shutdown_signal};
pub use sources::{CredentialError, CredentialSource, NamespaceSource, SecretProblem};
