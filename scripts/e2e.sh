#!/usr/bin/env bash
# The end-to-end suite: a real kube-apiserver + etcd on 127.0.0.1, driven by kube-rs tests.
#
#   scripts/e2e.sh [extra cargo test args]
#
# Installs the Debian packages the tests use when missing (or says in one line what it needs), then
# builds what is missing (scripts/e2e/build.sh: kube-apiserver and etcd from the Go module
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

# shellcheck source=scripts/lib/needs.sh
source scripts/lib/needs.sh
# scripts/e2e/build.sh and cluster.sh (Go; openssl, curl, ss), the tests' harnesses
# (crates/ivory-testkit: docker-registry, htpasswd, redis-server) and the tests (curl, kill).
# script_needs.rs checks this list against them.
needs_pkgs openssl:openssl curl:curl ss:iproute2 docker-registry:docker-registry \
  htpasswd:apache2-utils redis-server:redis-server kill:procps
# The egress tests' private network namespaces (crates/ivory-testkit/src/netns.rs).
needs_pkgs unshare:util-linux
needs_cmds go
needs_done

started=$SECONDS
scripts/e2e/build.sh all
echo "e2e: binaries ready after $((SECONDS - started))s" >&2
# The matrix tests run target/debug/ivory (serve --kube, webhooks).
cargo build -p ivory --locked
if [ "$#" -gt 0 ]; then
  cargo test -p ivory-e2e --features e2e --locked "$@"
  echo "e2e: done in $((SECONDS - started))s" >&2
  exit 0
fi
cargo test -p ivory-e2e --features e2e --locked --lib
# One test binary (tests/e2e/main.rs), each module of it in a process of its own: a process
# starts one cluster (ivory_e2e::Cluster::shared), and the modules register cluster-wide webhook
# configurations that must not meet, as when they were separate binaries.
listed="$(cargo test -p ivory-e2e --features e2e --locked --test e2e -- --list 2>/dev/null |
  sed -n 's/^\([a-z_0-9]*::[a-z_0-9:]*\): test$/\1/p')"
modules="$(printf '%s\n' "$listed" | sed -n 's/^\([a-z_0-9]*\)::.*/\1/p' | sort -u)"
[ -n "$modules" ] || { echo "e2e: the test binary listed no tests" >&2; exit 1; }
for module in $modules; do
  # shellcheck disable=SC2046 # one argument per test name
  cargo test -p ivory-e2e --features e2e --locked --test e2e -- --exact \
    $(printf '%s\n' "$listed" | grep "^${module}::")
done
echo "e2e: done in $((SECONDS - started))s" >&2
