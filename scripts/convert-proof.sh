#!/usr/bin/env bash
# The side-by-side proof of `ivory convert` (not part of scripts/test.sh: Kyverno takes 15-30
# minutes to build the first time):
#
#   scripts/convert-proof.sh
#
# Builds Kyverno v1.19.1 (scripts/bench/build-kyverno.sh, cached), the e2e kube-apiserver
# (scripts/e2e/build.sh) and ivory, starts the cluster, and runs `ivory-bench convert-proof`: the
# legacy ClusterPolicies of fixtures/legacy/corpus/ (their REGISTRY_HOST replaced by a real
# docker-registry holding the signed fixture images) are converted by `ivory convert`; the
# legacy policies and the converted ImageValidatingPolicies are created as custom resources
# (the API server checks them against Kyverno's CRDs); Kyverno judges every Pod of
# fixtures/legacy/cases.json with the legacy policies (/mutate, then /validate with the patch
# applied), `ivory serve` with the converted ones (/ivpol/mutate, /ivpol/validate). The
# verdicts are written to fixtures/legacy/verdicts.json, which the main suite's test
# (crates/ivory/tests/cli_convert.rs) checks ivory against. Exits non-zero when a verdict differs.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/needs.sh
source scripts/lib/needs.sh
needs_pkgs docker-registry:docker-registry htpasswd:apache2-utils kill:procps
needs_cmds go
needs_pkgs openssl:openssl curl:curl ss:iproute2
needs_done

scripts/bench/build-kyverno.sh
scripts/e2e/build.sh all
cargo build --release -p ivory -p ivory-bench
target="${CARGO_TARGET_DIR:-target}"
kyverno_cache="${IVORY_KYVERNO_CACHE:-$HOME/.cache/ivory-kyverno}"
cluster="$(mktemp -d "${TMPDIR:-/tmp}/ivory-convert-proof.XXXXXX")"
# The cluster's watchdog stops it when this process (ivory-bench, after exec) exits.
IVORY_E2E_OWNER_PID=$$ scripts/e2e/cluster.sh start "$cluster" >/dev/null
exec "$target/release/ivory-bench" convert-proof --cluster "$cluster" \
    --ivory "$target/release/ivory" \
    --kyverno "$kyverno_cache/bin/kyverno-v1.19.1" \
    --kyverno-crds "$kyverno_cache/src/kyverno-v1.19.1/config/crds" \
    --date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$@"
