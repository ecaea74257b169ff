#!/usr/bin/env bash
# `kyverno test` beside `ivory test` on one suite, twice each, against the real docker-registry
# (ivory-testkit-registry, plain HTTP on 127.0.0.1, which both treat as a local registry): wall
# time of every run and the result lines, for BENCHMARKS.md ("`kyverno test` beside `ivory test`").
#
#   KYVERNO_CLI=path/to/kyverno scripts/bench/kyverno-test.sh
#
# KYVERNO_CLI is a Kyverno v1.19.1 CLI binary, built from the source scripts/bench/build-kyverno.sh
# fetches (3 minutes on 2 cores once that build has warmed Go's cache):
#   cd ~/.cache/ivory-kyverno/src/kyverno-v1.19.1 &&
#     CGO_ENABLED=0 go build -trimpath -o "$OLDPWD/.tools/kyverno-cli-v1.19.1" ./cmd/cli/kubectl-kyverno
# IVORY_BIN and IVORY_REGISTRY_BIN default to the debug binaries under
# CARGO_TARGET_DIR (`cargo build -p ivory -p ivory-testkit` first). The suite is
# crates/ivory/tests/data/ivory-test-suites/passing, its rows about a signed, an unsigned and an
# excepted Pod, with `ghcr.io/ivory-test/…` rewritten to the local registry (Kyverno has no mirror
# option): a copy in a temporary folder, the committed suite is not touched.
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=scripts/lib/needs.sh
source scripts/lib/needs.sh
# ivory-testkit-registry runs Debian's docker-registry.
needs_pkgs docker-registry:docker-registry
needs_done

: "${KYVERNO_CLI:?set KYVERNO_CLI to a kyverno CLI binary}"
target=${CARGO_TARGET_DIR:-target}/debug
ivory=${IVORY_BIN:-$target/ivory}
registry=${IVORY_REGISTRY_BIN:-$target/ivory-testkit-registry}
runs=${RUNS:-2}

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$registry" fixtures/oci/ivory/sig-p256 fixtures/oci/ivory/unsigned >"$work/registry.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q '^ready ' "$work/registry.out" && break; sleep 0.1; done
host=$(sed -n 's/^ready //p' "$work/registry.out")
[ -n "$host" ] || { cat "$work/registry.out" >&2; exit 1; }

suite=crates/ivory/tests/data/ivory-test-suites/passing
mkdir "$work/suite"
for f in policy.yaml resources.yaml exception.yaml; do
  sed -e "s|ghcr.io/ivory-test/signed|$host/ivory/sig-p256|; s|ghcr.io/ivory-test/unsigned|$host/ivory/unsigned|" \
    -e "s|ghcr.io/ivory-test/\*|$host/ivory/*|" "$suite/$f" >"$work/suite/$f"
done
cat >"$work/suite/kyverno-test.yaml" <<EOF
apiVersion: cli.kyverno.io/v1alpha1
kind: Test
metadata:
  name: bench
policies: [policy.yaml]
resources: [resources.yaml]
exceptions: [exception.yaml]
results:
  - {policy: require-signed, isImageValidatingPolicy: true, kind: Pod, resources: [signed-pod], result: pass}
  - {policy: require-signed, isImageValidatingPolicy: true, kind: Pod, resources: [unsigned-pod], result: fail}
  - {policy: require-signed, isImageValidatingPolicy: true, kind: Pod, resources: [excepted-pod], result: skip}
EOF

# timed NAME CMD…: runs CMD, prints its wall time in ms and its summary line.
timed() {
  local name=$1; shift
  local start end
  start=$(date +%s%N)
  "$@" >"$work/out" 2>&1 || true
  end=$(date +%s%N)
  echo "$name: $(( (end - start) / 1000000 )) ms, $(grep -m1 'Test Summary' "$work/out" || tail -1 "$work/out")"
}

for i in $(seq "$runs"); do
  timed "kyverno test run $i" "$KYVERNO_CLI" test "$work/suite" --remove-color
done
cache="$work/ivory-cache"
for i in $(seq "$runs"); do
  timed "ivory test run $i (--cache-dir)" "$ivory" test "$work/suite" --cache-dir "$cache"
done
timed "ivory test --no-cache" "$ivory" test "$work/suite" --no-cache
