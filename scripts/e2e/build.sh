#!/usr/bin/env bash
# Builds the real Kubernetes API server and etcd used by the end-to-end tests, from the Go module
# proxy, into a cache folder outside the repo. Idempotent: a binary already built for the pinned
# version is kept. Prints nothing but progress; the binaries end up in "$CACHE/bin".
#
# k8s.io/kubernetes' go.mod points its k8s.io/* staging modules at ./staging/src/..., which the
# module zip does not contain, and its own replace lines do not apply to a dependency anyway. So
# a throwaway main module requires k8s.io/kubernetes and replaces every staging module with its
# published k8s.io/* v0.X.Y release (the list is read from kubernetes' own go.mod).
set -euo pipefail

# shellcheck source=scripts/e2e/versions.sh
source "$(dirname "$0")/versions.sh"

CACHE="${IVORY_E2E_CACHE:-$HOME/.cache/ivory-e2e}"
BIN="$CACHE/bin"
mkdir -p "$BIN" "$CACHE/src"

# shellcheck source=scripts/lib/needs.sh
source "$(dirname "$0")/../lib/needs.sh"
needs_cmds go # kube-apiserver and etcd are built from the Go module proxy
needs_done

log() { echo "[e2e build $(date -u +%H:%M:%S)] $*" >&2; }

# A fresh module folder with GOFLAGS that let `go build` complete go.mod/go.sum on its own.
new_module() {
  local dir="$1" name="$2"
  rm -rf "$dir"
  mkdir -p "$dir"
  (cd "$dir" && go mod init "$name" >/dev/null 2>&1)
}

# Builds k8s.io/kubernetes/cmd/$1 (kube-apiserver, kubelet, kube-controller-manager, ...) into
# "$BIN/$1-$KUBE_VERSION", each in its own throwaway module.
build_kube_cmd() {
  local cmd="$1"
  local out="$BIN/$cmd-$KUBE_VERSION"
  if [ -x "$out" ]; then log "$cmd $KUBE_VERSION: cached"; return; fi
  local dir="$CACHE/src/$cmd-$KUBE_VERSION"
  local started=$SECONDS
  log "$cmd $KUBE_VERSION: building (the first Kubernetes build takes 15-30 minutes on 2 cores, later ones 3-10)"
  new_module "$dir" "ivory-e2e/$cmd"

  local gomod
  gomod="$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
  [ -f "$gomod" ] || { echo "build.sh: could not download k8s.io/kubernetes@$KUBE_VERSION's go.mod" >&2; exit 1; }
  local staging
  staging="$(sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\1#p' "$gomod")"
  [ -n "$staging" ] || { echo "build.sh: no staging replace lines found in $gomod" >&2; exit 1; }

  {
    echo "module ivory-e2e/$cmd"
    echo
    echo "go $(sed -n 's/^go \(.*\)/\1/p' "$gomod")"
    # Same GODEBUG defaults as the upstream build (they follow the main module's go.mod).
    sed -n 's/^\(godebug .*\)/\1/p' "$gomod"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m $STAGING_VERSION"; done
    echo ")"
  } >"$dir/go.mod"

  local pkg=k8s.io/component-base/version
  local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  (
    cd "$dir"
    go get "k8s.io/kubernetes/cmd/$cmd@$KUBE_VERSION"
    CGO_ENABLED=0 nice go build -trimpath -o "$out.tmp" \
      -ldflags "-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
      "k8s.io/kubernetes/cmd/$cmd"
  )
  mv "$out.tmp" "$out"
  ln -sfn "$cmd-$KUBE_VERSION" "$BIN/$cmd"
  log "$cmd $KUBE_VERSION: built in $((SECONDS - started))s"
}

build_etcd() {
  local out="$BIN/etcd-$ETCD_VERSION"
  if [ -x "$out" ]; then log "etcd $ETCD_VERSION: cached"; return; fi
  local dir="$CACHE/src/etcd-$ETCD_VERSION"
  local started=$SECONDS
  log "etcd $ETCD_VERSION: building"
  new_module "$dir" ivory-e2e/etcd
  (
    cd "$dir"
    # go.etcd.io/etcd/server/v3's root package is etcd's main (a wrapper around etcdmain).
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    CGO_ENABLED=0 nice go build -trimpath -ldflags "-s -w" -o "$out.tmp" go.etcd.io/etcd/server/v3
  )
  mv "$out.tmp" "$out"
  log "etcd $ETCD_VERSION: built in $((SECONDS - started))s"
}

# The node components used by scripts/cluster.sh (the end-to-end tests need only etcd and
# kube-apiserver).
CLUSTER_CMDS="kubelet kube-controller-manager kube-scheduler kube-proxy kubectl"

case "${1:-all}" in
  all) build_etcd; build_kube_cmd kube-apiserver ;;
  cluster) build_etcd; for c in kube-apiserver $CLUSTER_CMDS; do build_kube_cmd "$c"; done ;;
  etcd) build_etcd ;;
  kube-apiserver | kubelet | kube-controller-manager | kube-scheduler | kube-proxy | kubectl) build_kube_cmd "$1" ;;
  *) echo "usage: build.sh [all|cluster|etcd|kube-apiserver|kubelet|kube-controller-manager|kube-scheduler|kube-proxy|kubectl]" >&2; exit 2 ;;
esac

ln -sfn "etcd-$ETCD_VERSION" "$BIN/etcd"
ln -sfn "kube-apiserver-$KUBE_VERSION" "$BIN/kube-apiserver"
printf 'kube-apiserver\t%s\nk8s.io staging modules\t%s\netcd\t%s\ngo\t%s\n' \
  "$KUBE_VERSION" "$STAGING_VERSION" "$ETCD_VERSION" "$(go env GOVERSION)" >"$CACHE/versions.tsv"
