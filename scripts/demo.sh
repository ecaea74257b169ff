#!/usr/bin/env bash
# ivory's job in one run, offline: starts the real local registry (Debian's docker-registry) with
# the signed and the unsigned fixture image, starts `ivory serve` with the sample key policy
# (policies/samples/cosign-key.yaml, pointed at that registry and the fixtures' key), and sends Pod
# AdmissionReviews through the mutating then the validating webhook, as the API server would.
#
#   scripts/demo.sh            builds (release) first; installs curl, jq and docker-registry
#                              (Debian packages) when missing
#
# IVORY_DEMO_PROFILE=debug uses debug builds (the test suite does); IVORY_BIN and
# IVORY_REGISTRY_BIN give the ivory and ivory-testkit-registry binaries, and with both nothing is
# built (the test suite's own binaries: a `cargo build` here would relink them under tests that
# are running them). Everything it starts is stopped on exit.
set -euo pipefail
[ -n "${IVORY_DEMO_TRACE:-}" ] && set -x
cd "$(dirname "$0")/.."

# shellcheck source=scripts/lib/needs.sh
source scripts/lib/needs.sh
# docker-registry runs under ivory-testkit-registry.
needs_pkgs curl:curl jq:jq docker-registry:docker-registry
needs_done

profile=${IVORY_DEMO_PROFILE:-release}
build_flags=()
[ "$profile" = release ] && build_flags=(--release)
if [ -z "${IVORY_BIN:-}" ] || [ -z "${IVORY_REGISTRY_BIN:-}" ]; then
  cargo build --quiet --locked "${build_flags[@]}" -p ivory -p ivory-testkit --bins
fi
target=${CARGO_TARGET_DIR:-target}/$profile
ivory=${IVORY_BIN:-$target/ivory}
registry=${IVORY_REGISTRY_BIN:-$target/ivory-testkit-registry}

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# wait_for FILE PATTERN: until a line of FILE matches (10 s at most).
wait_for() {
  for _ in $(seq 100); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "demo: timed out waiting for '$2' in $1:" >&2
  cat "$1" >&2
  exit 1
}

# The registry, with both fixture images pushed.
"$registry" fixtures/oci/ivory/sig-p256 fixtures/oci/ivory/unsigned \
  >"$work/registry.out" 2>&1 &
pids+=($!)
wait_for "$work/registry.out" '^ready '
host=$(sed -n 's/^ready //p' "$work/registry.out")
signed=$host/ivory/sig-p256:v1
unsigned=$host/ivory/unsigned:v1

# The sample policy, for this registry and the fixtures' key.
mkdir "$work/policies"
awk -v host="$host" -v keyfile=fixtures/keys/cosign-p256.pub '
  /BEGIN PUBLIC KEY/ {
    indent = substr($0, 1, index($0, "-") - 1)
    while ((getline line < keyfile) > 0) print indent line
    skipping = 1; next
  }
  skipping && /END PUBLIC KEY/ { skipping = 0; next }
  skipping { next }
  { gsub("ghcr.io/acme", host "/ivory"); gsub("the acme release key", "fixtures/keys/cosign-p256.pub"); print }
' policies/samples/cosign-key.yaml >"$work/policies/cosign-key.yaml"

"$ivory" serve --insecure-http --listen 127.0.0.1:0 --policies "$work/policies" \
  --log-format json --log-level info 2>"$work/ivory.log" &
pids+=($!)
wait_for "$work/ivory.log" '"message":"listening"'
addr=$(jq -rR 'fromjson? | select(.fields.message == "listening") | .fields.addr' "$work/ivory.log" | head -1)
webhook=http://$addr/ivpol

# review UID IMAGE: a Pod CREATE AdmissionReview with one container.
review() {
  jq -n --arg uid "$1" --arg image "$2" '{
    apiVersion: "admission.k8s.io/v1", kind: "AdmissionReview",
    request: {
      uid: $uid, operation: "CREATE", name: "web", namespace: "default",
      kind: {group: "", version: "v1", kind: "Pod"},
      resource: {group: "", version: "v1", resource: "pods"},
      userInfo: {username: "demo"},
      object: {apiVersion: "v1", kind: "Pod", metadata: {name: "web", namespace: "default"},
               spec: {containers: [{name: "app", image: $image}]}}}}'
}

# send STAGE UID IMAGE: posts the review; sets $response (the AdmissionResponse) and $ms.
send() {
  review "$2" "$3" >"$work/review.json"
  local out
  out=$(curl -sS -o "$work/response.json" -w '%{time_total}' -XPOST \
    -H 'content-type: application/json' --data @"$work/review.json" \
    "$webhook/$1/sample-cosign-key?timeout=10s")
  ms=$(awk -v s="$out" 'BEGIN { printf "%.1f", s * 1000 }')
  response=$(jq -c .response "$work/response.json")
}

# mutate UID IMAGE: prints the pin and sets $pinned.
mutate() {
  send mutate "$1" "$2"
  pinned=$(jq -r '.patch // empty' <<<"$response" | base64 -d | jq -r '.[0].value // empty')
  if [ -n "$pinned" ]; then
    echo "  mutate    pinned the tag to its digest: $pinned"
  else
    echo "  mutate    $(jq -r '.status.message // "no change"' <<<"$response")"
  fi
}

# validate UID IMAGE: prints the decision.
validate() {
  send validate "$1" "$2"
  if [ "$(jq -r .allowed <<<"$response")" = true ]; then
    echo "  validate  admitted ($ms ms)"
  else
    echo "  validate  denied: $(jq -r .status.message <<<"$response")"
  fi
}

cache_hits() {
  curl -s "http://$addr/metrics" |
    awk '/^ivory_verify_cache_hits_total\{cache="results"\}/ { print $2 }'
}

echo "registry  $host (Debian's docker-registry, plain HTTP)"
echo "            $signed  signed with fixtures/keys/cosign-p256.pub"
echo "            $unsigned  not signed"
echo "ivory     serve on $addr, policy policies/samples/cosign-key.yaml for $host/ivory/*"
echo
echo "Pod web running $signed:"
mutate demo-1 "$signed"
signed_pinned=$pinned
validate demo-2 "$signed_pinned"
first_ms=$ms
echo
echo "Pod web running $unsigned:"
mutate demo-3 "$unsigned"
validate demo-4 "$pinned"
echo
echo "The same Pod again ($signed_pinned):"
hits=$(cache_hits)
send validate demo-5 "$signed_pinned"
[ "$(jq -r .allowed <<<"$response")" = true ] || { echo "demo: the signed Pod was not admitted again: $response" >&2; exit 1; }
echo "  validate  admitted from the verification cache in $ms ms (first time $first_ms ms; cache hits $hits -> $(cache_hits))"
