#!/usr/bin/env bash
# Runs every coverage-guided fuzz target of fuzz/ (cargo-fuzz, libFuzzer, nightly toolchain).
#
#   scripts/fuzz.sh [--minutes N] [--parallel P] [--cmin] [TARGET...]
#   scripts/fuzz.sh --smoke [TARGET...]
#
# --minutes N   fuzz each target N minutes (default 10)
# --smoke       fuzz each target 20 seconds (CI); fails on any crash like a full run
# --parallel P  run P targets at once, one libFuzzer process each (default 1)
# --cmin        minimise each corpus after its run (cargo fuzz cmin)
#
# Installs the nightly toolchain (rustup, minimal profile) and cargo-fuzz (pinned, from crates.io)
# when missing; says in one line when it cannot.
# Inputs that once crashed a target (fuzz/regressions/<target>/) are replayed before it is
# fuzzed. New corpus entries land in fuzz/corpus/<target>/ (commit them); crashes in
# fuzz/artifacts/<target>/; one log per target and a summary (executions, coverage, crashes)
# in fuzz/logs/. Exits non-zero when any target crashed, timed out or ran out of memory.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION="0.13.2"
ALL_TARGETS=(admission_review image_reference policy_load cel_compile cosign_envelope
  sigstore_bundle oci_manifest go_duration resp_reply registry_listing notation_jws notation_cose
  egress_judge)

seconds=600
parallel=1
cmin=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) seconds=$(($2 * 60)); shift 2 ;;
    --smoke) seconds=20; shift ;;
    --parallel) parallel="$2"; shift 2 ;;
    --cmin) cmin=1; shift ;;
    -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")

# Largest input worth trying per target: a little above the biggest realistic document.
max_len() {
  case "$1" in
    image_reference) echo 512 ;;
    go_duration) echo 128 ;;
    resp_reply) echo 8192 ;;
    cel_compile) echo 4096 ;;
    sigstore_bundle) echo 32768 ;;
    # A page of a few hundred names plus its Link header.
    registry_listing) echo 8192 ;;
    *) echo 16384 ;;
  esac
}

# shellcheck source=scripts/lib/needs.sh
source scripts/lib/needs.sh
needs_cmds rustup # the nightly toolchain comes from rustup's distribution server
if ! rustup toolchain list | grep -q '^nightly'; then
  if [ -n "${IVORY_NEEDS_CHECK:-}" ]; then
    echo "fuzz.sh: needs: the nightly toolchain (would run rustup toolchain install nightly)" >&2
  elif ! rustup toolchain install nightly --profile minimal; then
    echo "fuzz.sh: needs the nightly toolchain; rustup could not install it (no access to static.rust-lang.org?)" >&2
    exit 1
  fi
fi
needs_done
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  echo "fuzz.sh: installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

mkdir -p fuzz/logs
echo "fuzz.sh: building ${#targets[@]} target(s)"
# One build of every target up front, so that parallel runs do not race to build.
if [ ${#targets[@]} = ${#ALL_TARGETS[@]} ]; then
  nice -n 10 cargo +nightly fuzz build --fuzz-dir fuzz
else
  for t in "${targets[@]}"; do nice -n 10 cargo +nightly fuzz build --fuzz-dir fuzz "$t"; done
fi

# run TARGET: fuzzes one target for $seconds, then writes fuzz/logs/TARGET.summary.
run() {
  local t="$1" log="fuzz/logs/$1.log"
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  local start=$SECONDS status=0
  : >"$log"
  # Every input that once crashed the target is replayed first: it must pass again.
  if compgen -G "fuzz/regressions/$t/*" >/dev/null; then
    nice -n 10 cargo +nightly fuzz run --fuzz-dir fuzz "$t" "fuzz/regressions/$t"/* -- \
      -rss_limit_mb=2048 -timeout=10 -detect_leaks=0 >>"$log" 2>&1 || status=$?
  fi
  if [ "$status" = 0 ]; then
    nice -n 10 cargo +nightly fuzz run --fuzz-dir fuzz "$t" "fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -max_len="$(max_len "$t")" -timeout=10 \
      -print_final_stats=1 -detect_leaks=0 >>"$log" 2>&1 || status=$?
  fi
  local execs cov ft
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  if [ "$cmin" = 1 ] && [ "$status" = 0 ]; then
    # One input per covered edge (not per hit-count bucket) keeps the committed corpus small.
    nice -n 10 cargo +nightly fuzz cmin --fuzz-dir fuzz "$t" "fuzz/corpus/$t" -- \
      -use_counters=0 -rss_limit_mb=2048 -timeout=10 -detect_leaks=0 >>"$log" 2>&1 || status=$?
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$((SECONDS - start))" "${execs:-0}" "${cov:-0}" \
    "${ft:-0}" "$(find "fuzz/corpus/$t" -type f | wc -l)" "$status" >"fuzz/logs/$t.summary"
}

running=0
for t in "${targets[@]}"; do
  echo "fuzz.sh: $t for ${seconds}s"
  run "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=0
printf '%-18s %8s %12s %7s %7s %7s %s\n' target seconds executions cov ft corpus result
for t in "${targets[@]}"; do
  IFS=$'\t' read -r name secs execs cov ft corpus status <"fuzz/logs/$t.summary"
  result=ok
  if [ "$status" != 0 ]; then
    result="FAILED (exit $status, see fuzz/logs/$t.log and fuzz/artifacts/$t/)"
    failed=1
  fi
  printf '%-18s %8s %12s %7s %7s %7s %s\n' "$name" "$secs" "$execs" "$cov" "$ft" "$corpus" "$result"
done
exit "$failed"
