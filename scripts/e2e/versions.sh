# shellcheck shell=bash disable=SC2034  # sourced: the variables are used by the sourcing script
# Pinned versions of the end-to-end test cluster (sourced by build.sh and cluster.sh).
# kube-rs 5 / k8s-openapi 0.29 support Kubernetes 1.33-1.37; crates/ivory-e2e enables k8s-openapi's
# v1_37 feature to match. STAGING_VERSION is the k8s.io/* release published with KUBE_VERSION.
KUBE_VERSION=v1.37.2
STAGING_VERSION=v0.37.2
# The etcd minor version kubernetes v1.37 is tested with (its build/dependencies.yaml: 3.7.0).
ETCD_VERSION=v3.7.3
