#!/usr/bin/env bash
# ivory load benchmarks: one command, one run, every figure from the same run.
#
#   scripts/bench.sh            full run (10-15 minutes on 2 cores)
#   scripts/bench.sh --quick    short run (under 3 minutes after the build)
#   scripts/bench.sh --fleet [--quick]
#                               three `ivory serve` replicas sharing one redis-server
#                               (--cache-redis): fleet figures added to results.json
#   scripts/bench.sh --peers [--quick]
#                               Kyverno v1.19.1's admission controller side by side with ivory
#                               (same registry, images, policies, reviews): kyverno_* figures
#                               added to results.json. Kyverno is built once from the Go module
#                               proxy into ${IVORY_KYVERNO_CACHE:-~/.cache/ivory-kyverno}
#                               (scripts/bench/build-kyverno.sh) and runs out of cluster against
#                               the e2e kube-apiserver (scripts/e2e/build.sh, cluster.sh).
#
# Builds release binaries (ivory, ivory-bench, null-webhook), then `ivory-bench load` starts a
# real docker-registry on loopback, pushes the signed fixture and synthetic cosign-signed
# images, runs `ivory serve` (TLS) and the null webhook, drives both with its own loopback
# load generator, and writes target/bench/results.json and target/bench/results.md.
# Method and committed figures: BENCHMARKS.md. Micro-benchmarks: `cargo bench -p ivory-bench`.
#
# Installs what it needs on a fresh machine: docker-registry (Debian package) and cosign v2 at
# .tools/bin/cosign2 (built from the Go module proxy by scripts/install-tools.sh, ~3 minutes once).
# Extra arguments are passed to `ivory-bench load` (see `ivory-bench load --help`).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v docker-registry >/dev/null; then
    echo "bench.sh: installing docker-registry"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq docker-registry >/dev/null
fi
mode=load
if [[ "${1:-}" == "--fleet" ]]; then
    mode=fleet
    shift
elif [[ "${1:-}" == "--peers" ]]; then
    mode=peers
    shift
fi
if [[ $mode == fleet ]] && ! command -v redis-server >/dev/null; then
    echo "bench.sh: installing redis-server"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
if [[ $mode == load && ! -x .tools/bin/cosign2 ]]; then
    bash scripts/install-tools.sh cosign2
fi

if [[ $mode == peers ]]; then
    scripts/bench/build-kyverno.sh
    scripts/e2e/build.sh all
fi

cargo build --release -p ivory -p ivory-bench
if [[ $mode == peers ]]; then
    kyverno_cache="${IVORY_KYVERNO_CACHE:-$HOME/.cache/ivory-kyverno}"
    cluster="$(mktemp -d "${TMPDIR:-/tmp}/ivory-peers-cluster.XXXXXX")"
    # The cluster's watchdog stops it (and removes its folder) when this process, which
    # becomes ivory-bench below, exits. IVORY_E2E_KEEP=1 keeps the folder (logs, certs).
    IVORY_E2E_OWNER_PID=$$ scripts/e2e/cluster.sh start "$cluster" >/dev/null
    exec target/release/ivory-bench peers --cluster "$cluster" \
        --kyverno "$kyverno_cache/bin/kyverno-v1.19.1" \
        --kyverno-crds "$kyverno_cache/src/kyverno-v1.19.1/config/crds" "$@"
fi
# ivory-bench's defaults are these paths (target/release/ivory, the null webhook beside it,
# .tools/bin/cosign2, fixtures/, target/bench), so any of them can be overridden here.
exec target/release/ivory-bench "$mode" "$@"
