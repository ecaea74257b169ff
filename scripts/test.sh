#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need (Debian packages, and
# the Go-built tools in .tools/; says in one line what it cannot install), then shellcheck on
# every shell script, format check, clippy (with the workspace's lints: missing_docs,
# unreachable_pub, ...), the API docs and every test of the workspace. `.ci/run` calls exactly
# this, after scripts/e2e.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/lib/needs.sh
source scripts/lib/needs.sh
# The tests' harnesses (crates/ivory-testkit), the deploy/ tests, scripts/demo.sh, scripts/image.sh
# and deploy/certs/make-certs.sh, run by tests. script_needs.rs checks this list against them.
needs_pkgs docker-registry:docker-registry htpasswd:apache2-utils redis-server:redis-server \
  redis-cli:redis-tools openssl:openssl jq:jq curl:curl git:git python3:python3 kill:procps
# scripts/sigstore-conformance.sh (the Sigstore conformance suite, run by a test) installs the suite's
# pinned Python packages from PyPI with pip.
needs_pkgs pip3:python3-pip
# The hardening tests: a FIFO for the CLI's refusal of non-regular files (mkfifo), another local user
# for the disk cache's ownership checks (setpriv), private network namespaces with a metadata-address
# listener for the egress rule (unshare).
needs_pkgs mkfifo:coreutils setpriv:util-linux unshare:util-linux
# The review of the shell scripts.
needs_pkgs shellcheck:shellcheck
# The monitoring assets: promtool's checks and unit tests (scripts/monitoring-check.sh) and the
# live Prometheus that integration::monitoring scrapes ivory with.
needs_pkgs prometheus:prometheus promtool:prometheus
# Debian's own python3 draws the dashboard's picture when the monitoring test is asked to
# (scripts/monitoring/render-dashboard.sh; with python3-matplotlib).
needs_pkgs /usr/bin/python3:python3
# kustomize + helm for the deploy/ tests; crane, cosign v2, cargo-cyclonedx for the dogfood test
# (ivory's own image); cargo-deny and cargo-machete for the dependency checks. Built from the Go
# module proxy or crates.io into .tools/ (skipped when built; Go is needed only to build one).
needs_tools kustomize helm crane cosign2 cargo-cyclonedx cargo-deny cargo-machete
needs_done

# Every shell script of the repository: those with a sh/bash shebang, and the sourced ones, which
# carry a `# shellcheck shell=bash` line. -x follows the `source`s their directives name.
mapfile -t shell_scripts < <(git ls-files -z | xargs -0 awk \
  'FNR == 1 { if (/^#!.*[\/ ](ba)?sh( |$)|^# shellcheck shell=/) print FILENAME; nextfile }')
shellcheck -x "${shell_scripts[@]}"
cargo fmt --all -- --check
# Bans, licenses and sources of every crate in the graph (deny.toml); not advisories: the RustSec
# database is a git clone this machine cannot fetch.
.tools/bin/cargo-deny --locked check bans licenses sources
# Unused dependencies of every crate, fuzz/ included (a crate's source never names them;
# [package.metadata.cargo-machete] lists, with the reason, those it names otherwise).
.tools/bin/cargo-machete
# No import circles between the modules of a crate (what a module names, followed through
# re-exports to the module that defines it), and the gate's own tests.
python3 -m unittest discover -s scripts/review -p 'test_*.py'
scripts/review/module-cycles.py
# Functions of at most 150 lines, files of at most 800, errors typed (no Result<_, String> outside
# clap value parsers); what broke a rule when it came is listed in code-shape.baseline and may only shrink.
scripts/review/code-shape.py
# The alert rules (promtool check and unit tests), their generated copies and runbook sections.
scripts/monitoring-check.sh
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings # --all-features: ivory-e2e's e2e tests too
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --locked # broken intra-doc links, bad doc markup
cargo test --workspace --locked "$@"
