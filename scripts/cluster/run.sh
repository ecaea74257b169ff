#!/usr/bin/env bash
# The whole real-cluster run of docs/CLUSTER.md in one command: builds what is missing (the
# Kubernetes binaries, crane and helm, ivory's static release binary), starts the one-node cluster
# of scripts/cluster.sh, installs ivory with kustomize (checked, then removed) and with Helm,
# verifies signed and unsigned Deployments, the controllers' workloads, the failures-under-load
# matrix, the static registration (scripts/cluster/static.sh) with its own matrix, and the sharded
# registry audit (scripts/cluster/audit.sh); writes target/cluster/matrix.md,
# target/cluster/static/matrix.md, target/cluster/audit/ and target/cluster/run.log, then stops the
# cluster.
#
#   scripts/cluster/run.sh            everything (~15 min once built; first run: builds, ~40 min)
#   scripts/cluster/run.sh --smoke    CI's part: the image of the debug binary (which the test
#                                     suite built), Helm install, doctor, signed/unsigned, the
#                                     static registration without its matrix (~5 min)
#   scripts/cluster/run.sh --keep     leave the cluster up at the end (scripts/cluster.sh down)
#
# IVORY_BIN: package this binary instead of building the release one. Needs root.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=scripts/lib/needs.sh
source "$ROOT/scripts/lib/needs.sh"
needs_pkgs file:file
needs_cmds cargo
needs_done

smoke=0 keep=0
for arg in "$@"; do
  case "$arg" in
    --smoke) smoke=1 ;;
    --keep) keep=1 ;;
    *) sed -n '2,18p' "$0" >&2; exit 2 ;;
  esac
done
OUT="$ROOT/target/cluster"
mkdir -p "$OUT"
LOG="$OUT/run.log"
: >"$LOG"
log() { echo "[run.sh $(date -u +%H:%M:%S)] $*" | tee -a "$LOG" >&2; }
# phase NAME CMD…: CMD (in this shell: a function may set variables) with its output also in
# run.log; the phase's time is logged.
phase() {
  local name="$1" started=$SECONDS; shift
  log "── $name"
  if ! "$@" > >(tee -a "$LOG") 2>&1; then
    log "── $name FAILED after $((SECONDS - started)) s (log: $LOG)"
    return 1
  fi
  log "── $name done in $((SECONDS - started)) s"
}

ivory_binary() {
  if [ -n "${IVORY_BIN:-}" ]; then return; fi
  if [ "$smoke" = 1 ]; then
    IVORY_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/ivory"
    [ -x "$IVORY_BIN" ] || (cd "$ROOT" && cargo build --locked -p ivory) || return 1
    return
  fi
  # scripts/image.sh without --binary builds the release binary the way a release is built:
  # static (musl) when the musl target and musl-gcc can be had, glibc otherwise. `phase` runs
  # this function under `if !`, where `set -e` does not apply: a failed build must say so, or
  # an older binary would be tested.
  "$ROOT/scripts/image.sh" --out "$OUT/image" --tag cluster >/dev/null || return 1
  local musl="${CARGO_TARGET_DIR:-$ROOT/target}/x86_64-unknown-linux-musl/release/ivory"
  if [ -x "$musl" ] && [ "$musl" -nt "$ROOT/Cargo.lock" ]; then IVORY_BIN="$musl"
  else IVORY_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/ivory"; fi
}

in_cluster() { "$ROOT/scripts/cluster.sh" exec "$@"; }

main() {
  local started=$SECONDS
  phase "ivory binary" ivory_binary
  export IVORY_BIN
  log "ivory binary: $IVORY_BIN ($(file -b "$IVORY_BIN" | grep -o 'static-pie linked\|statically linked\|dynamically linked'))"
  if [ -f "${IVORY_CLUSTER_DIR:-$HOME/.cache/ivory-cluster}/run/holder.pid" ]; then
    phase "cluster down (left from an earlier run)" "$ROOT/scripts/cluster.sh" down
  fi
  phase "cluster up" "$ROOT/scripts/cluster.sh" up
  [ "$keep" = 1 ] || trap '"$ROOT/scripts/cluster.sh" down >>"$LOG" 2>&1' EXIT
  if [ "$smoke" = 0 ]; then
    phase "kustomize install" in_cluster "$ROOT/scripts/cluster/ivory.sh" kustomize
  fi
  phase "helm install" in_cluster "$ROOT/scripts/cluster/ivory.sh" install
  phase "signed and unsigned Deployments" in_cluster "$ROOT/scripts/cluster/ivory.sh" verify
  if [ "$smoke" = 0 ]; then
    phase "workloads" in_cluster "$ROOT/scripts/cluster/workloads.sh"
    phase "failures under load" in_cluster env MATRIX_OUT="$OUT" "$ROOT/scripts/cluster/matrix.sh"
    phase "static registration and its failure matrix" in_cluster env MATRIX_OUT="$OUT" \
      "$ROOT/scripts/cluster/static.sh" matrix
    phase "sharded audit" in_cluster env MATRIX_OUT="$OUT" "$ROOT/scripts/cluster/audit.sh"
  else
    phase "static registration" in_cluster "$ROOT/scripts/cluster/static.sh"
  fi
  log "all phases passed in $((SECONDS - started)) s$([ "$smoke" = 0 ] && echo "; matrix: $OUT/matrix.md")"
}

main
