//! ivory-server: the admission webhook over HTTPS (axum + rustls, HTTP/1.1 and HTTP/2).
//!
//! [`router`] builds the routes over an [`AppState`]; [`serve`] runs them with TLS reload and
//! graceful shutdown; [`policies`] holds the hot-reloaded policy set; [`webhooks`] renders the
//! webhook configurations that point the API server at those routes.
//!
//! # What this crate owns
//!
//! * The admission routes (`/ivpol|/nivpol` × `/mutate|/validate` followed by policy names):
//!   read the body, parse the review, select the path's policies, set the budget, have the
//!   engine's [`ivory_engine::pipeline::Pipeline`] judge, encode the answer. Decisions are the
//!   engine's, never this crate's. The routes' pipeline has Namespaces from the watch, the
//!   policies' Secrets prepared, PolicyExceptions when enabled, the kept-results memo, and a
//!   backstop halfway between ivory's deadline and the API server's timeout.
//! * The budget ([`budget::Budget`]): the API server's `?timeout=` or, when tighter, the
//!   selected policies' `webhookConfiguration.timeoutSeconds`, minus a margin.
//! * Bounds on clients of the webhook port: [`limits`] (per-request body limit, a process-wide
//!   budget of body bytes in flight, body deadline) and [`connection`] (a connection cap taken
//!   before TLS; idle, header, answer and handshake timeouts; process-wide budgets of the header
//!   bytes of requests being judged and of answer bytes not yet sent, per connection too;
//!   answers handed to hyper 16 KiB at a time and charged until their last piece leaves).
//! * Readiness (`/readyz`, [`READYZ_POLICY_ERRORS`]), Prometheus [`metrics`], TLS with
//!   certificate reload, graceful shutdown, and `ivory webhooks` generation ([`webhooks`]).
//! * `ivory doctor`'s checks ([`doctor`]): what is checked in a cluster (CRDs, policies
//!   compiled, the webhooks that call ivory, their endpoints' `/readyz`, the service account's
//!   reads) and the verdict of each, as typed findings; the binary only words and renders
//!   them. Its probe of an endpoint is this crate's one outgoing HTTP request (reqwest, trusting
//!   only the webhook's caBundle).
//! * Results ([`policy_results`], [`reports`]) and background scans ([`background`]), below.
//! * Policy sources ([`policies`], [`kube_source`]), below.
//! * The cluster behind the engine's seams: [`kube_source`] implements
//!   [`ivory_engine::pipeline::NamespaceSource`] and [`ivory_engine::pipeline::CredentialSource`]
//!   from watches ([`KubeSource`]), [`sources`] says why a Secret cannot be used, and
//!   [`cluster_resources`] implements [`ivory_engine::resources::ResourceSource`] (below).
//!
//! This crate depends on ivory-registry for data types only, never to call a registry: the
//! [`ivory_registry::Credentials`] built from watched Secrets, the [`ivory_registry::Error`]
//! that refused a Secret's `.dockerconfigjson` (kept as the cause in
//! [`sources::SecretProblem::Invalid`]), and the [`ivory_registry::RegistryStats`] counters
//! [`metrics`] renders.
//!
//! # Policy sources
//!
//! The server holds a [`PolicyStore`], an `ArcSwap`'d snapshot. Files and folders
//! ([`FileSource`]) are polled (`--reload-interval`) and recompiled once a change has settled:
//! two reads a poll apart must find the same bytes, which are then the bytes loaded
//! ([`ivory_policy::PolicyFiles`]), so a file being written is never enforced half-way. A
//! broken file keeps the last good set, shown on `/readyz`, counted in its
//! [`READYZ_POLICY_ERRORS`] header (which `ivory doctor` reads, [`doctor`]) and in
//! `ivory_policy_load_errors`.
//! With `--kube`, kube-rs reflectors ([`kube_source`]) watch both policy kinds, PolicyExceptions
//! (with `--enable-policy-exceptions`: all namespaces, or only `--exception-namespace`),
//! Namespaces (the real `namespaceObject` and namespaceSelector labels) and the
//! dockerconfigjson Secrets in ivory's namespace (and, from their first use, in each namespace
//! a policy's `credentials.secrets` names). Only a Namespace the reflector has not seen yet is
//! read per request, within half the budget. When a Namespace's labels cannot be known (file
//! mode, or that read failing), namespaceSelectors are left to the API server: `ivory webhooks`
//! gives every policy with one its own webhook carrying it.
//!
//! # Cluster reads
//!
//! What policies read with `resource.*` and `globalContext.*` is known at load
//! ([`ivory_policy::ClusterReads`]). [`cluster_resources::ResourceWatches`] (`serve --kube`)
//! compares those reads with the running watches every second, starts and stops kube-runtime
//! watchers (kind and scope from discovery, once per watch) and holds each watch's objects,
//! without `managedFields`, under `--resource-watch-max-objects`/`--resource-watch-max-bytes`
//! ([`cluster_resources::WatchLimits`]) and all watches together under
//! `--resource-watch-max-total-bytes` ([`cluster_resources::TotalBytes`]). A watch answers only
//! after its first complete list; never an API call per admission. RBAC: Helm `clusterReads`,
//! kustomize ClusterRole `ivory-cluster-reads`; `ivory doctor` checks them with
//! SubjectAccessReviews. In file mode the engine's `FileResources` answers instead.
//!
//! # Results: log, metrics, PolicyReports
//!
//! [`policy_results`] takes every policy result after the answer
//! ([`policy_results::after_validation`], [`policy_results::after_background`]): one structured
//! log line per result (target `ivory::audit`, `message: "policy result"`, with the request's
//! uid, kind, namespace, name and operation and the result's policy, policy_namespace, result,
//! policy_message, properties and images, written by [`policy_results::log_results`]), the
//! counter `ivory_policy_results_total` labelled by
//! `policy_name`, `policy_namespace`, `rule_result` and `rule_execution_cause` (Kyverno's
//! `kyverno_policy_results_total`; `ivory_admission_duration_seconds` is the counterpart of
//! `kyverno_admission_review_duration_seconds`) and, with `--kube`, a report update through a
//! [`policy_results::ReportSink`]. Which admission requests are reported follows Kyverno:
//! validating stage only, no `Deny` among the evaluated policies' actions, not dry-run, not
//! DELETE, not a subresource.
//!
//! [`reports::KubeReports`] writes Kyverno-compatible `wgpolicyk8s.io/v1alpha2` PolicyReports
//! (namespaced objects) and ClusterPolicyReports (cluster-scoped ones) named by the object's
//! UID, with `scope` and an owner reference to it, the label
//! `app.kubernetes.io/managed-by: ivory`, results with `source: KyvernoImageValidatingPolicy` and
//! properties (`auditAnnotations`, `exceptions`, `process`), and a recounted summary. Admission
//! handlers only `try_send` to a bounded queue (a full queue drops and counts,
//! `ivory_reports_dropped_total`); one task gathers updates for 500 ms, merges those about one
//! object and writes each report (read, replace the updated policies' results, server-side
//! apply) four at a time, so admission latency does not move. A report holds one result per
//! policy, the latest: a background result replaces that policy's admission result for the
//! object and vice versa. The CRDs are vendored in `deploy/crds/kyverno/` (with provenance);
//! `--disable-policy-reports` turns writing off.
//!
//! # Background scans
//!
//! [`background`] (with `--kube`, unless `--disable-background-scans`) watches Pods and, at
//! start and every `--background-scan-interval` (1h), judges each running Pod against the
//! policies with `evaluation.background.enabled` (cluster ones, and namespaced ones of its
//! namespace) as a CREATE of itself whose container images are rewritten to
//! `<spec image>@<digest the kubelet reports in status.*ContainerStatuses[].imageID>`: what runs
//! is verified, not what a tag points to now. `--background-concurrency` (4) Pods at a time,
//! each under its own 30 s deadline, through the same digest-keyed caches and coalescing, so a
//! digest a thousand Pods run is verified once per cache lifetime and the first scan warms the
//! cache for admissions after a restart. Verdicts reached before the scan began are reached
//! again (the verifier's `revalidating` view). Results are reported
//! (`process: background scan`) whatever the policies' actions, as Kyverno's background scans
//! are. Unlike Kyverno, only Pods are scanned: the Pods controllers run are.

pub mod background;
pub mod budget;
pub mod cluster_resources;
pub mod connection;
pub mod doctor;
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
    Metrics, OpenConnectionsSource, RegistryStatsSource, ResourceWatchStatsSource,
    RevocationCounts, RevocationStatsSource, TrustRootCount, TrustRootStatsSource, WatchStats,
};
pub use policies::{FileSource, PolicyStore, Snapshot};
pub use routes::{AppState, ExceptionSettings, READYZ_POLICY_ERRORS, router};
pub use serve::{Listen, ServeOptions, serve, shutdown_signal};
pub use sources::{CredentialError, CredentialSource, NamespaceSource, SecretProblem};
