#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (Debian packages),
# then format check, clippy, the API docs and every test of the workspace. `.ci/run` calls
# exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v docker-registry >/dev/null || need_pkgs+=(docker-registry)
command -v redis-server >/dev/null || need_pkgs+=(redis-server) # the shared L2 cache's tests (redis-cli comes with it)
command -v redis-cli >/dev/null || need_pkgs+=(redis-tools)
command -v htpasswd >/dev/null || need_pkgs+=(apache2-utils)
command -v openssl >/dev/null || need_pkgs+=(openssl)
command -v jq >/dev/null || need_pkgs+=(jq)     # scripts/demo.sh, run by a test
command -v curl >/dev/null || need_pkgs+=(curl)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "installing: ${need_pkgs[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

bash scripts/install-deploy-tools.sh # kustomize + helm for the deploy/ tests; skips when built
# crane, cosign v2, cargo-cyclonedx for the dogfood test (ivory's own image); skips when built.
bash scripts/install-tools.sh image
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --locked # broken intra-doc links, bad doc markup
cargo test --workspace --locked "$@"
