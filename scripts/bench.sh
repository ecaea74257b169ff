#!/usr/bin/env bash
# ivory load benchmarks: one command, one run, every figure from the same run.
#
#   scripts/bench.sh            full run (10-15 minutes on 2 cores)
#   scripts/bench.sh --quick    short run (under 3 minutes after the build)
#   scripts/bench.sh --fleet [--quick]
#                               three `ivory serve` replicas sharing one redis-server
#                               (--cache-redis): fleet figures added to results.json
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

cargo build --release -p ivory -p ivory-bench
# ivory-bench's defaults are these paths (target/release/ivory, the null webhook beside it,
# .tools/bin/cosign2, fixtures/, target/bench), so any of them can be overridden here.
exec target/release/ivory-bench "$mode" "$@"
