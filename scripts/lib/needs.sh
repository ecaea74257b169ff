# shellcheck shell=bash
# What a script needs, installed when missing, or one line saying what is needed. Sourced by every
# script in scripts/ (deploy/certs/make-certs.sh, shipped to users, keeps its own openssl check):
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib/needs.sh"
#   needs_pkgs CMD:PACKAGE...  Debian packages, each named with a command it provides: the missing
#                              ones are installed with one `apt-get update` and one `apt-get install`
#                              (as root, or with sudo); otherwise one line names them and the script stops.
#   needs_tools NAME...        pinned tools in .tools/bin (crane, cosign2, cosign25, cosign3, notation,
#                              cargo-cyclonedx, cargo-deny, cargo-machete, kustomize, helm;
#                              sigstore-js in fixtures/gen/js): runs the script that builds them
#                              (idempotent; see needs_tool_builder).
#   needs_cmds CMD...          commands no Debian package here provides at the version needed (go):
#                              one line naming the missing ones, and the script stops.
#
# One declaration per line, as `needs_* word…` (a trailing `\` continues it): the test
# crates/ivory-testkit/tests/script_needs.rs reads these lines and fails when a script, or a test
# a script runs, invokes a command its script does not declare.
#
#   needs_done                 after the declarations: with IVORY_NEEDS_CHECK set, the script stops here.
#
# IVORY_NEEDS_CHECK=1: install nothing, build nothing, print one line per missing need ("needs: …")
# and stop at needs_done. With a PATH that hides tools it shows what a fresh machine lacks, e.g.
#   env -i HOME="$HOME" PATH=/some/minimal/dir IVORY_NEEDS_CHECK=1 /bin/bash scripts/e2e.sh

_needs_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
_needs_self="$(basename "$0")"

_needs_say() { echo "$_needs_self: $*" >&2; }

# needs_pkgs CMD:PACKAGE...
needs_pkgs() {
  local spec missing=()
  for spec in "$@"; do
    type -P "${spec%%:*}" >/dev/null || missing+=("${spec#*:}")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  # One package can provide several of the commands asked for (redis-server, redis-check-rdb).
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  if [ -n "${IVORY_NEEDS_CHECK:-}" ]; then
    _needs_say "needs: Debian packages ${missing[*]} (would run apt-get install)"
    return 0
  fi
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo)
    else
      _needs_say "needs the Debian packages ${missing[*]}: run as root, or with sudo, or install them (apt-get install ${missing[*]})"
      exit 1
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    _needs_say "needs the packages ${missing[*]} (Debian names; no apt-get here: install them by hand)"
    exit 1
  fi
  _needs_say "installing ${missing[*]}"
  # One `apt-get update` per script run, and only when something is missing.
  if [ -z "${_needs_updated:-}" ]; then
    "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 ||
      { _needs_say "needs the Debian packages ${missing[*]}: apt-get update failed (no network to the Debian mirror?)"; exit 1; }
    _needs_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { _needs_say "needs the Debian packages ${missing[*]}: apt-get install failed"; exit 1; }
}

# needs_tool_builder NAME: the script in scripts/ that builds NAME (into .tools/bin, or for
# sigstore-js fixtures/gen/js/node_modules). script_needs.rs reads this table: a builder does not
# declare the tools it builds.
needs_tool_builder() {
  case "$1" in
    crane | cosign2 | cosign25 | cosign3 | notation | cargo-cyclonedx | cargo-deny | cargo-machete | sigstore-js) echo install-tools.sh ;;
    kustomize | helm) echo install-deploy-tools.sh ;;
    *) return 1 ;;
  esac
}

# needs_tools NAME...: one run of each builder, with the names it builds; the builders skip a tool
# already built at its pinned version.
needs_tools() {
  local name builder tools
  for builder in install-tools.sh install-deploy-tools.sh; do
    tools=()
    for name in "$@"; do
      needs_tool_builder "$name" >/dev/null || { _needs_say "needs_tools: no builder known for $name"; exit 2; }
      [ "$(needs_tool_builder "$name")" != "$builder" ] || tools+=("$name")
    done
    [ ${#tools[@]} -gt 0 ] || continue
    if [ -n "${IVORY_NEEDS_CHECK:-}" ]; then
      for name in "${tools[@]}"; do
        if [ "$name" = sigstore-js ]; then
          [ -d "$_needs_root/fixtures/gen/js/node_modules" ] || _needs_say "needs: sigstore-js (would run scripts/$builder $name)"
        else
          [ -x "$_needs_root/.tools/bin/$name" ] || _needs_say "needs: .tools/bin/$name (would run scripts/$builder ${tools[*]})"
        fi
      done
      continue
    fi
    # On stderr: a script's stdout is often its result (image.sh prints the pushed reference).
    bash "$_needs_root/scripts/$builder" "${tools[@]}" >&2
  done
}

# needs_cmds CMD...: what cannot be installed from here; the hint says where it comes from.
needs_cmds() {
  local cmd missing=()
  for cmd in "$@"; do
    type -P "$cmd" >/dev/null || missing+=("$cmd")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  local hints=() hint
  for cmd in "${missing[@]}"; do
    case "$cmd" in
      go) hint="go (Go >= 1.25 from https://go.dev/dl, on PATH; the Go module proxy must be reachable)" ;;
      cargo | rustc | rustup) hint="$cmd (the Rust toolchain: https://rustup.rs)" ;;
      *) hint="$cmd" ;;
    esac
    hints+=("$hint")
  done
  if [ -n "${IVORY_NEEDS_CHECK:-}" ]; then
    _needs_say "needs: ${hints[*]}"
    return 0
  fi
  _needs_say "needs ${hints[*]}"
  exit 1
}

# needs_done: the end of a script's declarations.
needs_done() {
  if [ -n "${IVORY_NEEDS_CHECK:-}" ]; then
    _needs_say "needs check done"
    exit 0
  fi
}
