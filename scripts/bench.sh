#!/usr/bin/env bash
# ivory load benchmarks: one command, one run, every figure from the same run.
#
#   scripts/bench.sh            full run (10-15 minutes on 2 cores)
#   scripts/bench.sh --quick    short run (under 3 minutes after the build)
#   scripts/bench.sh --fleet [--quick]
#                               three `ivory serve` replicas sharing one redis-server
#                               (--cache-redis): fleet figures added to results.json
#   scripts/bench.sh --curves [--quick]
#                               cost curves: warm latency and CPU per admission for 1/10/100
#                               containers and 1/10/50 policies, cold admissions of 1/10/100
#                               never-seen images, the verdict cache at 10k/100k/1M verdicts:
#                               curve_* figures added to results.json (BENCHMARKS.md, "Cost curves")
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
# Installs what it needs on a fresh machine (or says in one line what it cannot): docker-registry
# and apache2-utils (Debian packages); the default mode cosign v2 at .tools/bin/cosign2 (built from
# the Go module proxy by scripts/install-tools.sh, ~3 minutes once); --fleet redis-server and
# redis-tools; --peers Go (for Kyverno and the e2e cluster), openssl, curl and iproute2.
# Extra arguments are passed to `ivory-bench load` (see `ivory-bench load --help`).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=load
if [[ "${1:-}" == "--fleet" ]]; then
    mode=fleet
    shift
elif [[ "${1:-}" == "--curves" ]]; then
    mode=curves
    shift
elif [[ "${1:-}" == "--peers" ]]; then
    mode=peers
    shift
fi
# shellcheck source=scripts/lib/needs.sh
source scripts/lib/needs.sh
# Every mode: the registry harness of ivory-bench (crates/ivory-testkit); getconf: the clock tick of
# the servers' CPU time (benches/src/procs.rs).
needs_pkgs docker-registry:docker-registry htpasswd:apache2-utils kill:procps getconf:libc-bin
# The testkit's private network namespaces (crates/ivory-testkit/src/netns.rs), linked by ivory-bench.
needs_pkgs unshare:util-linux
case $mode in
    # ivory-bench load compares cold verification with cosign v2 (.tools/bin/cosign2).
    load) needs_tools cosign2 ;;
    fleet) needs_pkgs redis-server:redis-server redis-cli:redis-tools ;;
    # Kyverno and the e2e cluster are built from the Go module proxy; the cluster needs cluster.sh's packages.
    peers)
        needs_cmds go
        needs_pkgs openssl:openssl curl:curl ss:iproute2
        ;;
esac
needs_done

if [[ $mode == peers ]]; then
    scripts/bench/build-kyverno.sh
    scripts/e2e/build.sh all
fi

# Two builds: one would unify features, and ivory-bench's `bench-support` of ivory-verify (the
# verdict-cache probe's seeding) must never reach the product binary measured here.
cargo build --release -p ivory
cargo build --release -p ivory-bench
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
