#!/usr/bin/env bash
# Builds Kyverno's admission controller (cmd/kyverno) for the side-by-side benchmark
# (`scripts/bench.sh --peers`), from the Go module proxy, into a cache folder outside the repo:
# ${IVORY_KYVERNO_CACHE:-~/.cache/ivory-kyverno}. Idempotent: a binary already built for the
# pinned version is kept. The binary ends up in "$CACHE/bin/kyverno-$KYVERNO_VERSION"; the
# module's source (CRDs included) stays in "$CACHE/src/kyverno-$KYVERNO_VERSION".
#
# Kyverno's go.mod has a `replace` line, so `go install github.com/kyverno/kyverno/cmd/kyverno@v…`
# refuses it; instead the module is downloaded (`go mod download`), copied to a writable folder
# and built there as the main module, which is how Kyverno's own Makefile builds it.
set -euo pipefail

KYVERNO_VERSION=v1.19.1  # scripts/bench.sh --peers and benches/src/peers.rs name it too
CACHE="${IVORY_KYVERNO_CACHE:-$HOME/.cache/ivory-kyverno}"
BIN="$CACHE/bin"
SRC="$CACHE/src/kyverno-$KYVERNO_VERSION"
OUT="$BIN/kyverno-$KYVERNO_VERSION"

log() { echo "[kyverno build $(date -u +%H:%M:%S)] $*" >&2; }
# shellcheck source=scripts/lib/needs.sh
source "$(dirname "$0")/../lib/needs.sh"
needs_cmds go # Kyverno is built from the Go module proxy
needs_done

if [ -x "$OUT" ] && [ -d "$SRC/config/crds" ]; then
  log "kyverno $KYVERNO_VERSION: cached ($OUT)"
  exit 0
fi
mkdir -p "$BIN" "$CACHE/src"
started=$SECONDS

if [ ! -f "$SRC/go.mod" ]; then
  # `go mod download -json` prints the module's folder in the module cache (read-only files).
  mod_dir="$(cd "$CACHE" && go mod download -json "github.com/kyverno/kyverno@$KYVERNO_VERSION" |
    sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
  [ -f "$mod_dir/go.mod" ] || { echo "build-kyverno.sh: could not download github.com/kyverno/kyverno@$KYVERNO_VERSION" >&2; exit 1; }
  rm -rf "$SRC.tmp"
  cp -r "$mod_dir" "$SRC.tmp"
  chmod -R u+w "$SRC.tmp"
  mv "$SRC.tmp" "$SRC"
fi

log "kyverno $KYVERNO_VERSION: building cmd/kyverno (15-30 minutes on 2 cores the first time)"
(
  cd "$SRC"
  # The version string Kyverno's Makefile sets (pkg/version), so `kyverno --version` and its
  # start-up log say which release runs.
  CGO_ENABLED=0 nice go build -trimpath -o "$OUT.tmp" \
    -ldflags "-s -w -X github.com/kyverno/kyverno/pkg/version.BuildVersion=$KYVERNO_VERSION" \
    ./cmd/kyverno
)
mv "$OUT.tmp" "$OUT"
ln -sfn "kyverno-$KYVERNO_VERSION" "$BIN/kyverno"
log "kyverno $KYVERNO_VERSION: built in $((SECONDS - started))s"
