#!/usr/bin/env bash
# The official Sigstore conformance suite's verification cases (fixtures/sigstore-conformance, a
# copy of sigstore/sigstore-conformance: see its PROVENANCE), run offline against `ivory verify-blob`
# through scripts/sigstore-conformance-client. Each case runs twice (the artifact as a file and as
# a `sha256:` digest). Prints one closing line, `sigstore-conformance: N passed, N failed`, after
# the failed cases by name, and exits 0 only when every case passed and every case ran (twice the
# case folders: a client that always refuses passes the `_fail` cases, so passes are counted).
#
# Usage: scripts/sigstore-conformance.sh [IVORY_BINARY]   (default: cargo builds target/debug/ivory)
#
# The suite's Python packages (pinned with hashes in its requirements.txt) come from PyPI into
# .cache/sigstore-conformance/python (git-ignored), once per requirements.txt. The suite asks the
# network for a signing token even when it only verifies: scripts/lib/conformance_offline.py
# answers it with a placeholder and refuses any other request.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SUITE="$ROOT/fixtures/sigstore-conformance"
# shellcheck source=scripts/lib/needs.sh
source "$ROOT/scripts/lib/needs.sh"
needs_pkgs python3:python3 pip3:python3-pip
needs_done

ivory="${1:-}"
if [[ -z "$ivory" ]]; then
  (cd "$ROOT" && cargo build -p ivory --locked --quiet)
  ivory="$ROOT/target/debug/ivory"
fi
ivory="$(realpath "$ivory")"

deps="$ROOT/.cache/sigstore-conformance/python"
stamp="$deps/.requirements.sha256"
want="$(sha256sum < "$SUITE/requirements.txt")"
if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]]; then
  rm -rf "$deps"
  # requirements.txt pins every package with its hashes: pip installs nothing else.
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$deps" -r "$SUITE/requirements.txt" >&2
  echo "$want" > "$stamp"
fi

report="$(mktemp -t ivory-conformance.XXXXXX.json)"
trap 'rm -f "$report"' EXIT
cd "$SUITE"
# Not pytest's exit status: the count below decides, case by case.
IVORY_BIN="$ivory" PYTHONPATH="$deps:$ROOT/scripts/lib" PYTHONDONTWRITEBYTECODE=1 \
  python3 -m pytest test -p conformance_offline -p no:cacheprovider --skip-signing \
  --entrypoint="$ROOT/scripts/sigstore-conformance-client" \
  --json-report --json-report-file="$report" -q -rf >&2 || true

python3 - "$report" "$SUITE/test/assets/bundle-verify" <<'PY'
import json, pathlib, sys

report = json.loads(pathlib.Path(sys.argv[1]).read_text())
cases = [d for d in pathlib.Path(sys.argv[2]).iterdir() if d.is_dir()]
verify = [t for t in report.get("tests", []) if "::test_verify[" in t["nodeid"]]
passed = [t for t in verify if t["outcome"] == "passed"]
failed = [t for t in verify if t["outcome"] != "passed"]
for t in failed:
    print(f"FAILED {t['nodeid']}")
expected = 2 * len(cases)
if len(verify) != expected:
    print(f"sigstore-conformance: {len(verify)} verification cases ran, {expected} expected")
print(f"sigstore-conformance: {len(passed)} passed, {len(failed)} failed")
sys.exit(0 if len(passed) == expected and not failed else 1)
PY
