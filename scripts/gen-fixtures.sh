#!/usr/bin/env bash
# Regenerates fixtures/ (signed OCI image layouts + manifest.json + captured third-party data) with
# real tools: docker-registry (Distribution 2.8), crane, cosign v2, cosign v3, sigstore-js.
# Installs what it needs when missing: Debian packages, and the pinned tools in .tools/ and npm ci in
# fixtures/gen/js (by scripts/install-tools.sh; Go needed); says in one line what it cannot install.
# Usage: scripts/gen-fixtures.sh            (needs /work/shared-like captured data at
#        IVORY_CAPTURED_DIR, default ../shared/data/captured; skipped with a warning if absent)
#        scripts/gen-fixtures.sh hash       only fixtures/hash/ (P-384 signed by cosign v2.5 and
#        v2.6)
#        scripts/gen-fixtures.sh notation   only fixtures/notation/ (notation v1.3.2 signatures, a test
#        PKI and a local RFC 3161 TSA; pip installs asn1crypto and cryptography, pinned, from PyPI)
#        scripts/gen-fixtures.sh blob       only fixtures/blob/ (cosign v3 sign-blob --bundle with a key, a
#        local openssl TSA; no network but loopback)
#        scripts/gen-fixtures.sh notation-revocation   only fixtures/notation-revocation/ (notation
#        v1.3.2 signatures by leaves with a CRL distribution point, their CRLs, an RSA TSA; needs
#        127.0.0.1:39517 free)
#        scripts/gen-fixtures.sh discovery  only fixtures/discovery/ (cosign v3 signatures and
#        attestations behind the referrers fallback tag, as written and relabelled, in another
#        repository, and under another image's tag)
#        scripts/gen-fixtures.sh tuf        only fixtures/tuf/ (TUF repository states laid out as
#        Sigstore's, by python-tuf; pip installs tuf and securesystemslib, pinned, from PyPI)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FIX="$ROOT/fixtures"
CAPTURED="${IVORY_CAPTURED_DIR:-$ROOT/../shared/data/captured}"

ONLY="${1:-all}"
# shellcheck source=scripts/lib/needs.sh
source "$ROOT/scripts/lib/needs.sh"
# fixtures/gen/*.py run crane, cosign and (gen.py) node with sigstore-js.
needs_pkgs docker-registry:docker-registry curl:curl python3:python3
if [[ "$ONLY" == "blob" ]]; then
  needs_pkgs openssl:openssl unshare:util-linux ip:iproute2
  needs_tools cosign3
elif [[ "$ONLY" == "hash" ]]; then
  needs_tools crane cosign2 cosign25
elif [[ "$ONLY" == "discovery" ]]; then
  needs_tools crane cosign3
elif [[ "$ONLY" == "tuf" ]]; then
  needs_pkgs pip3:python3-pip # gen_tuf.py installs tuf and securesystemslib (pinned) from PyPI
elif [[ "$ONLY" == "notation" || "$ONLY" == "notation-revocation" ]]; then
  needs_pkgs pip3:python3-pip # gen_notation.py installs asn1crypto and cryptography (pinned) from PyPI
  needs_tools crane notation
  # gen_notation_revocation.py builds fixtures/gen/go-notation (notation-core-go) for its
  # signing-authority signature.
  if [[ "$ONLY" == "notation-revocation" ]]; then needs_cmds go; fi
else
  needs_pkgs node:nodejs
  needs_tools crane cosign2 cosign25 cosign3 sigstore-js
fi
needs_done

if [[ "$ONLY" == "blob" ]]; then
  # A network namespace of its own, only loopback up: cosign asks the public TUF repository for a
  # trusted root at start-up, and must reach nothing but the generator's own TSA.
  # shellcheck disable=SC2016 # $1 is the inner shell's argument
  unshare -rn bash -c 'ip link set lo up && exec python3 "$1"' gen-blob "$FIX/gen/gen_blob.py"
  exit 0
fi

WORK="$(mktemp -d -t ivory-fixtures.XXXXXX)"
if [[ "$ONLY" == "tuf" ]]; then
  # No registry: the TUF repositories are files.
  trap 'rm -rf "$WORK"' EXIT
  IVORY_FIXTURE_WORK="$WORK" python3 "$FIX/gen/gen_tuf.py"
  exit 0
fi
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
if [[ "$ONLY" == "discovery" ]]; then
  IVORY_FIXTURE_REGISTRY="127.0.0.1:$PORT" IVORY_FIXTURE_WORK="$WORK" python3 "$FIX/gen/gen_discovery.py"
  exit 0
fi
if [[ "$ONLY" == "notation" ]]; then
  IVORY_FIXTURE_REGISTRY="127.0.0.1:$PORT" IVORY_FIXTURE_WORK="$WORK" python3 "$FIX/gen/gen_notation.py"
  exit 0
fi
if [[ "$ONLY" == "notation-revocation" ]]; then
  IVORY_FIXTURE_REGISTRY="127.0.0.1:$PORT" IVORY_FIXTURE_WORK="$WORK" python3 "$FIX/gen/gen_notation_revocation.py"
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
IVORY_FIXTURE_REGISTRY="127.0.0.1:$PORT" IVORY_FIXTURE_WORK="$WORK" python3 "$FIX/gen/gen_discovery.py"
du -sh "$FIX" --exclude=node_modules >&2
