#!/usr/bin/env bash
# Regenerates fixtures/ (signed OCI image layouts + manifest.json + captured third-party data) with
# real tools: docker-registry (Distribution 2.8), crane, cosign v2, cosign v3, sigstore-js.
# Prerequisite: scripts/install-tools.sh (pinned tools in .tools/, npm ci in fixtures/gen/js).
# Usage: scripts/gen-fixtures.sh            (needs /work/shared-like captured data at
#        IVORY_CAPTURED_DIR, default ../shared/data/captured; skipped with a warning if absent)
#        scripts/gen-fixtures.sh hash       only fixtures/hash/ (P-384 signed by cosign v2.5 and
#        v2.6; needs `scripts/install-tools.sh hash-fixtures`)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FIX="$ROOT/fixtures"
BIN="$ROOT/.tools/bin"
CAPTURED="${IVORY_CAPTURED_DIR:-$ROOT/../shared/data/captured}"

ONLY="${1:-all}"
TOOLS_NEEDED="crane cosign2 cosign25"
[[ "$ONLY" == "hash" ]] || TOOLS_NEEDED="$TOOLS_NEEDED cosign3"
for tool in $TOOLS_NEEDED; do
  [[ -x "$BIN/$tool" ]] || { echo "gen-fixtures: $BIN/$tool missing; run scripts/install-tools.sh" >&2; exit 1; }
done
[[ "$ONLY" == "hash" || -d "$FIX/gen/js/node_modules" ]] || { echo "gen-fixtures: run scripts/install-tools.sh (npm ci)" >&2; exit 1; }
command -v docker-registry >/dev/null || { echo "gen-fixtures: docker-registry not installed (apt-get install docker-registry)" >&2; exit 1; }

WORK="$(mktemp -d -t ivory-fixtures.XXXXXX)"
REGISTRY_PID=""
cleanup() {
  if [[ -n "$REGISTRY_PID" ]]; then kill "$REGISTRY_PID" 2>/dev/null || true; wait "$REGISTRY_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# Free port chosen by the kernel (tiny race window is acceptable for a generator).
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
mkdir -p "$WORK/registry" "$WORK/home"
cat > "$WORK/registry.yml" <<YML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $WORK/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$PORT
YML
docker-registry serve "$WORK/registry.yml" > "$WORK/registry.log" 2>&1 &
REGISTRY_PID=$!
for _ in $(seq 1 50); do
  curl -fsS "http://127.0.0.1:$PORT/v2/" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$PORT/v2/" >/dev/null || { cat "$WORK/registry.log" >&2; exit 1; }
echo "gen-fixtures: registry on 127.0.0.1:$PORT (pid $REGISTRY_PID)" >&2

if [[ "$ONLY" == "hash" ]]; then
  IVORY_FIXTURE_REGISTRY="127.0.0.1:$PORT" IVORY_FIXTURE_WORK="$WORK" python3 "$FIX/gen/gen_hash.py"
  exit 0
fi

# Captured data first: some oracle checks use fixtures/captured/trust/public-good.trusted_root.json.
if [[ -f "$CAPTURED/sources.json" ]]; then
  python3 "$FIX/gen/copy_captured.py" "$CAPTURED" "$FIX/captured"
else
  echo "gen-fixtures: WARNING $CAPTURED not found; fixtures/captured/ left as is" >&2
fi

IVORY_FIXTURE_REGISTRY="127.0.0.1:$PORT" IVORY_FIXTURE_WORK="$WORK" python3 "$FIX/gen/gen.py"
IVORY_FIXTURE_REGISTRY="127.0.0.1:$PORT" IVORY_FIXTURE_WORK="$WORK" python3 "$FIX/gen/gen_hash.py"
du -sh "$FIX" --exclude=node_modules >&2
