#!/usr/bin/env bash
# Installs the pinned signing tools used to generate fixtures/ into the git-ignored .tools/.
#
#   scripts/install-tools.sh [all]         crane, cosign v2.5, v2, v3, sigstore-js (npm ci): gen-fixtures
#   scripts/install-tools.sh image         crane, cosign v2, cargo-cyclonedx: image.sh, the dogfood test
#   scripts/install-tools.sh hash-fixtures cosign v2.5, v2, crane: `gen-fixtures.sh hash`
#   scripts/install-tools.sh review        cargo-deny, cargo-machete: the dependency checks of scripts/test.sh
#   scripts/install-tools.sh notation      notation v1.3.2, crane: scripts/gen-notation-fixtures.sh
#   scripts/install-tools.sh TOOL...       just these (crane cosign2 cosign25 cosign3 notation cargo-cyclonedx
#                                          cargo-deny cargo-machete sigstore-js)
#
# Idempotent: a tool is built only when its pinned binary is missing. Needs Go for the Go tools and
# installs npm (Debian package) for sigstore-js; says so in one line when it cannot.
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
# Notation fixtures (scripts/gen-notation-fixtures.sh): the Notary Project's CLI signs JWS and COSE envelopes.
NOTATION_VERSION="v1.3.2"
CARGO_CYCLONEDX_VERSION="0.5.9"
# scripts/test.sh: bans, licenses and sources of the dependency graph (deny.toml), unused dependencies.
CARGO_DENY_VERSION="0.20.2"
CARGO_MACHETE_VERSION="0.9.2"

export GOTOOLCHAIN=local
export GOFLAGS="${GOFLAGS:-} -trimpath"
export CGO_ENABLED=0

# install NAME VERSION MODULE_PATH: builds into .tools/NAME-VERSION/ and symlinks .tools/bin/NAME.
install_go_tool() {
  local name="$1" version="$2" pkg="$3"
  local dir="$TOOLS/$name-$version"
  local bin
  bin="$dir/$(basename "$pkg")"
  mkdir -p "$TOOLS/bin"
  if [[ -x "$bin" ]]; then
    echo "install-tools: $name $version already present ($bin)"
  else
    needs_cmds go
    echo "install-tools: building $name $version (go install $pkg@$version) ..."
    GOBIN="$dir" go install "$pkg@$version"
  fi
  ln -sfn "$bin" "$TOOLS/bin/$name"
}

# install_go_module_tool NAME VERSION MODULE CMD_DIR: like install_go_tool, for a module whose `go install
# mod@version` the proxy refuses (it also asks for the module's version list, to look for a deprecation):
# downloads that exact version and builds CMD_DIR inside it with the module's own go.mod and go.sum.
install_go_module_tool() {
  local name="$1" version="$2" module="$3" cmd_dir="$4"
  local dir="$TOOLS/$name-$version"
  local bin
  bin="$dir/$(basename "$cmd_dir")"
  mkdir -p "$TOOLS/bin"
  if [[ -x "$bin" ]]; then
    echo "install-tools: $name $version already present ($bin)"
  else
    needs_cmds go
    echo "install-tools: building $name $version (go mod download $module@$version; go build ./$cmd_dir) ..."
    local src
    src="$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -n "$src" && -d "$src" ]] || { echo "install-tools: go mod download $module@$version failed" >&2; exit 1; }
    mkdir -p "$dir"
    (cd "$src" && go build -o "$bin" "./$cmd_dir")
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

# What to build: a mode or tool names.
case "${1:-all}" in
  # Everything scripts/gen-fixtures.sh needs.
  all) set -- crane cosign25 cosign2 cosign3 sigstore-js ;;
  # What scripts/image.sh and the dogfood test need: crane (pushes the OCI layout), cosign v2
  # (signs and attests), cargo-cyclonedx (the SBOM).
  image) set -- crane cosign2 cargo-cyclonedx ;;
  # What `scripts/gen-fixtures.sh hash` needs.
  hash-fixtures) set -- cosign25 cosign2 crane ;;
  # What scripts/test.sh's dependency checks need.
  review) set -- cargo-deny cargo-machete ;;
  # What scripts/gen-notation-fixtures.sh needs.
  notation) set -- notation crane ;;
esac
need_go=0 need_npm=0
for tool in "$@"; do
  case "$tool" in
    # Go only to build one that is missing (install_go_tool checks again for a new pin).
    crane | cosign2 | cosign25 | cosign3 | notation) [[ -x "$TOOLS/bin/$tool" ]] || need_go=1 ;;
    cargo-cyclonedx | cargo-deny | cargo-machete) ;;
    sigstore-js) need_npm=1 ;;
    *) echo "usage: install-tools.sh [all|image|hash-fixtures|review|notation|crane|cosign2|cosign25|cosign3|cargo-cyclonedx|cargo-deny|cargo-machete|sigstore-js...]" >&2; exit 2 ;;
  esac
done
# shellcheck source=scripts/lib/needs.sh
source "$ROOT/scripts/lib/needs.sh"
[[ $need_go == 0 ]] || needs_cmds go # the Go tools are built from the Go module proxy
[[ $need_npm == 0 ]] || needs_pkgs npm:npm node:nodejs # sigstore-js, from the npm registry
needs_done

# Node helpers (sigstore-js signing with @sigstore/mock, @sigstore/oci attachment).
install_sigstore_js() {
  local js_dir="$ROOT/fixtures/gen/js"
  [[ -f "$js_dir/package-lock.json" ]] || return 0
  if [[ -d "$js_dir/node_modules" && "$js_dir/node_modules/.package-lock.json" -nt "$js_dir/package-lock.json" ]]; then
    echo "install-tools: node_modules up to date"
  else
    echo "install-tools: npm ci in fixtures/gen/js"
    (cd "$js_dir" && npm ci --no-audit --no-fund)
  fi
}

for tool in "$@"; do
  case "$tool" in
    crane) install_go_tool crane "$CRANE_VERSION" github.com/google/go-containerregistry/cmd/crane ;;
    cosign2) install_go_tool cosign2 "$COSIGN_V2_VERSION" github.com/sigstore/cosign/v2/cmd/cosign ;;
    cosign25) install_go_tool cosign25 "$COSIGN_V25_VERSION" github.com/sigstore/cosign/v2/cmd/cosign ;;
    cosign3) install_go_tool cosign3 "$COSIGN_V3_VERSION" github.com/sigstore/cosign/v3/cmd/cosign ;;
    notation) install_go_module_tool notation "$NOTATION_VERSION" github.com/notaryproject/notation cmd/notation ;;
    cargo-cyclonedx) install_cargo_tool cargo-cyclonedx "$CARGO_CYCLONEDX_VERSION" ;;
    cargo-deny) install_cargo_tool cargo-deny "$CARGO_DENY_VERSION" ;;
    cargo-machete) install_cargo_tool cargo-machete "$CARGO_MACHETE_VERSION" ;;
    sigstore-js) install_sigstore_js ;;
  esac
done
for tool in "$@"; do
  case "$tool" in
    crane) "$TOOLS/bin/$tool" version ;;
    cosign*) "$TOOLS/bin/$tool" version 2>/dev/null | grep -E '^GitVersion' || true ;;
    notation) "$TOOLS/bin/$tool" version 2>/dev/null | grep -E '^Version' || true ;;
  esac
done
