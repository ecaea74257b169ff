#!/usr/bin/env bash
# Installs the pinned signing tools used to generate fixtures/ into the git-ignored .tools/.
# Idempotent: a tool is built only when its pinned binary is missing.
# Go builds are slow (several minutes each on a small machine); npm ci is quick.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"

COSIGN_V2_VERSION="v2.6.5"
COSIGN_V3_VERSION="v3.1.3"
# Fixture generator only: the last cosign before v2.6 signs every key with SHA-256 (P-384 and
# P-521 included), the behaviour the hash-algorithm fixtures capture.
COSIGN_V25_VERSION="v2.5.0"
CRANE_VERSION="v0.22.1"
CARGO_CYCLONEDX_VERSION="0.5.9"

export GOTOOLCHAIN=local
export GOFLAGS="${GOFLAGS:-} -trimpath"
export CGO_ENABLED=0

# install NAME VERSION MODULE_PATH: builds into .tools/NAME-VERSION/ and symlinks .tools/bin/NAME.
install_go_tool() {
  local name="$1" version="$2" pkg="$3"
  local dir="$TOOLS/$name-$version"
  local bin="$dir/$(basename "$pkg")"
  mkdir -p "$TOOLS/bin"
  if [[ -x "$bin" ]]; then
    echo "install-tools: $name $version already present ($bin)"
  else
    echo "install-tools: building $name $version (go install $pkg@$version) ..."
    GOBIN="$dir" go install "$pkg@$version"
  fi
  ln -sfn "$bin" "$TOOLS/bin/$name"
}

# install_cargo_tool NAME VERSION: `cargo install --locked` into .tools/NAME-VERSION/ and symlinks .tools/bin/NAME.
install_cargo_tool() {
  local name="$1" version="$2"
  local dir="$TOOLS/$name-$version"
  mkdir -p "$TOOLS/bin"
  if [[ -x "$dir/bin/$name" ]]; then
    echo "install-tools: $name $version already present ($dir/bin/$name)"
  else
    echo "install-tools: building $name $version (cargo install --locked) ..."
    # Its own target dir: the workspace's target/ is keyed to the workspace's toolchain file and flags.
    (cd "$TOOLS" && CARGO_TARGET_DIR="$TOOLS/.cargo-target" \
      cargo install --locked --quiet --root "$dir" "$name" --version "=$version")
    rm -rf "$TOOLS/.cargo-target"
  fi
  ln -sfn "$dir/bin/$name" "$TOOLS/bin/$name"
}

# `install-tools.sh image` builds what scripts/image.sh and the dogfood test need: crane (pushes the
# OCI layout), cosign v2 (signs and attests), cargo-cyclonedx (the SBOM).
if [[ "${1:-}" == "image" ]]; then
  install_go_tool crane "$CRANE_VERSION" github.com/google/go-containerregistry/cmd/crane
  install_go_tool cosign2 "$COSIGN_V2_VERSION" github.com/sigstore/cosign/v2/cmd/cosign
  install_cargo_tool cargo-cyclonedx "$CARGO_CYCLONEDX_VERSION"
  exit 0
fi

# `install-tools.sh cosign2` builds only cosign v2 (what scripts/bench.sh needs).
if [[ "${1:-}" == "cosign2" ]]; then
  install_go_tool cosign2 "$COSIGN_V2_VERSION" github.com/sigstore/cosign/v2/cmd/cosign
  "$TOOLS/bin/cosign2" version 2>/dev/null | grep -E '^GitVersion' || true
  exit 0
fi

# `install-tools.sh hash-fixtures` builds what scripts/gen-fixtures.sh hash needs.
if [[ "${1:-}" == "hash-fixtures" ]]; then
  install_go_tool cosign25 "$COSIGN_V25_VERSION" github.com/sigstore/cosign/v2/cmd/cosign
  install_go_tool cosign2 "$COSIGN_V2_VERSION" github.com/sigstore/cosign/v2/cmd/cosign
  install_go_tool crane "$CRANE_VERSION" github.com/google/go-containerregistry/cmd/crane
  exit 0
fi

install_go_tool crane "$CRANE_VERSION" github.com/google/go-containerregistry/cmd/crane
install_go_tool cosign25 "$COSIGN_V25_VERSION" github.com/sigstore/cosign/v2/cmd/cosign
install_go_tool cosign2 "$COSIGN_V2_VERSION" github.com/sigstore/cosign/v2/cmd/cosign
install_go_tool cosign3 "$COSIGN_V3_VERSION" github.com/sigstore/cosign/v3/cmd/cosign

# Node helpers (sigstore-js signing with @sigstore/mock, @sigstore/oci attachment).
JS_DIR="$ROOT/fixtures/gen/js"
if [[ -f "$JS_DIR/package-lock.json" ]]; then
  if [[ -d "$JS_DIR/node_modules" && "$JS_DIR/node_modules/.package-lock.json" -nt "$JS_DIR/package-lock.json" ]]; then
    echo "install-tools: node_modules up to date"
  else
    echo "install-tools: npm ci in fixtures/gen/js"
    (cd "$JS_DIR" && npm ci --no-audit --no-fund)
  fi
fi

"$TOOLS/bin/crane" version
"$TOOLS/bin/cosign25" version 2>/dev/null | grep -E '^GitVersion' || true
"$TOOLS/bin/cosign2" version 2>/dev/null | grep -E '^GitVersion' || true
"$TOOLS/bin/cosign3" version 2>/dev/null | grep -E '^GitVersion' || true
