#!/usr/bin/env bash
# The end-to-end suite: a real kube-apiserver + etcd on 127.0.0.1, driven by kube-rs tests.
#
#   scripts/e2e.sh [extra cargo test args]
#
# Builds what is missing first (scripts/e2e/build.sh: kube-apiserver and etcd from the Go module
# proxy, into ${IVORY_E2E_CACHE:-~/.cache/ivory-e2e}), then runs
# `cargo test -p ivory-e2e --features e2e`, whose tests start the cluster themselves
# (scripts/e2e/cluster.sh: a few seconds) and stop it when they end.
#
# Timings on the 2-core machine: first build ~19 min (kube-apiserver ~17 min, etcd ~1 min, module
# downloads included); with Go's caches warm but no binaries ~30 s; binaries present: 0 s. The
# cluster tests themselves take ~12 s. The Go caches take ~5 GB, the binaries 140 MB.
#
# IVORY_E2E_KUBECONFIG=<kubeconfig> runs the tests against a cluster started by hand
# (scripts/e2e/cluster.sh start DIR); IVORY_E2E_KEEP=1 keeps each cluster's folder (logs, certs).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v openssl >/dev/null || need_pkgs+=(openssl)
command -v curl >/dev/null || need_pkgs+=(curl)
command -v ss >/dev/null || need_pkgs+=(iproute2)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "installing: ${need_pkgs[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

started=$SECONDS
scripts/e2e/build.sh all
echo "e2e: binaries ready after $((SECONDS - started))s" >&2
# The matrix tests run target/debug/ivory (serve --kube, webhooks).
cargo build -p ivory --locked
cargo test -p ivory-e2e --features e2e --locked "$@"
echo "e2e: done in $((SECONDS - started))s" >&2
