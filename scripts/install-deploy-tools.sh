#!/usr/bin/env bash
# Builds the tools the deploy/ tests render with (kustomize, helm) into the git-ignored .tools/bin.
# Idempotent: a tool whose binary already reports the pinned version is skipped. Built from source
# with `go install` because only the Go module proxy is reachable (no release downloads).
# Cold cost on the 2-core machine (empty Go caches, downloads included): kustomize ~2.5 min,
# helm ~4 min; see deploy/README.md ("Tests").
set -euo pipefail
cd "$(dirname "$0")/.."

KUSTOMIZE_VERSION=v5.8.1
HELM_VERSION=v3.22.0

bin_dir="$PWD/.tools/bin"
mkdir -p "$bin_dir"
export GOBIN="$bin_dir"
# The machine's own Go; never fetch another toolchain behind our back.
export GOTOOLCHAIN=local
# go install -buildvcs has nothing to stamp here.
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

# shellcheck source=scripts/lib/needs.sh
source scripts/lib/needs.sh
# Go only to build a tool that is missing (install_tool checks again for a new pin).
if [ ! -x "$bin_dir/kustomize" ] || [ ! -x "$bin_dir/helm" ]; then
  needs_cmds go # built from the Go module proxy
fi
needs_done

# install_tool NAME VERSION PACKAGE LDFLAGS VERSION-ARGS...: skipped when NAME VERSION-ARGS prints VERSION.
install_tool() {
  local name=$1 version=$2 pkg=$3 ldflags=$4
  shift 4
  if [ -x "$bin_dir/$name" ] && "$bin_dir/$name" "$@" 2>/dev/null | grep -F -- "$version" >/dev/null; then
    return 0
  fi
  needs_cmds go
  echo "install-deploy-tools: building $name $version (go install; minutes when cold)"
  local start=$SECONDS
  # CGO off: static binaries, no C toolchain needed.
  CGO_ENABLED=0 go install -trimpath -ldflags "$ldflags" "$pkg@$version"
  echo "install-deploy-tools: $name $version built in $((SECONDS - start))s"
}

install_tool kustomize "$KUSTOMIZE_VERSION" sigs.k8s.io/kustomize/kustomize/v5 \
  "-s -w -X sigs.k8s.io/kustomize/api/provenance.version=$KUSTOMIZE_VERSION" version
install_tool helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
  "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" version --short
