//! The end-to-end suite: ivory against a real kube-apiserver and etcd (see scripts/e2e.sh),
//! one test binary whose modules share one cluster ([`ivory_e2e::Cluster::shared`]). Needs
//! `--features e2e` and the binaries from scripts/e2e/build.sh. Each module's tests keep to
//! their own namespaces and uniquely named webhook configurations, so they run side by side.

mod admission_scope;
mod audit_cluster;
mod cluster;
mod cluster_reads;
mod failure_matrix;
mod gitops;
mod pod_images;
mod reports;
mod setup;
mod static_manifests;
