#!/usr/bin/env bash
# ivory registered through the API server's static manifests (Kubernetes 1.37,
# ManifestBasedAdmissionControlConfig) in the cluster of scripts/cluster.sh, after
# scripts/cluster/ivory.sh install and verify (the policies in $IVORY_CLUSTER_DIR/policies, the
# Service on a fixed ClusterIP whose address the serving certificate carries):
#
#   scripts/cluster.sh exec scripts/cluster/static.sh           steps 1-5
#   scripts/cluster.sh exec scripts/cluster/static.sh matrix    steps 1-6
#
# 1. `ivory webhooks --static` writes the manifests (calling https://<ClusterIP>:443) and the
#    AdmissionConfiguration; the API server restarts reading them (scripts/cluster.sh passes
#    --admission-control-config-file when the file exists); `ivory doctor --static-manifests`
#    says they are in force.
# 2. Every ivory webhook object is deleted through the API: an unsigned Pod is still denied, a
#    signed one admitted and pinned; doctor still finds every policy registered.
# 3. The API refuses to create a .static.k8s.io name and has none to delete.
# 4. An edit of the files (namespace static-late no longer excluded) applies without a restart.
# 5. The bootstrap gap: ivory scaled to 0 and the API server restarted, its first Pod request is
#    denied (failurePolicy Fail), even for a signed image; ivory back, the signed Pod is admitted.
# 6. (matrix) scripts/cluster/matrix.sh rollout sigkill apiserver with the static registration
#    alone, into target/cluster/static/matrix.md: no unsigned Pod admitted.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
: "${KUBECONFIG:?run through scripts/cluster.sh exec}" "${REGISTRY:?}" "${IVORY_CLUSTER_DIR:?}"
STATE="$IVORY_CLUSTER_DIR"
IVORY_BIN="${IVORY_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/ivory}"
# shellcheck source=scripts/lib/needs.sh
source "$ROOT/scripts/lib/needs.sh"
needs_pkgs curl:curl jq:jq
needs_cmds kubectl
needs_done

NS=ivory-system
DIR="$STATE/static-webhooks"
CHECK_NS=static-check
LATE_NS=static-late
OUT="${MATRIX_OUT:-$ROOT/target/cluster}/static"

log() { echo "[static.sh $(date -u +%H:%M:%S)] $*" >&2; }
step() { log "\$ $*"; "$@"; }
fail() { log "UNEXPECTED: $*"; exit 1; }

# write_static EXCLUDED_NS…: the static manifests for the policies of verify, calling the
# Service's ClusterIP, excluding ivory's namespace and EXCLUDED_NS.
write_static() {
  local ip args=()
  ip="$(kubectl -n "$NS" get service ivory -o jsonpath='{.spec.clusterIP}')"
  for ns in "$@"; do args+=(--exclude-namespace "$ns"); done
  step "$IVORY_BIN" webhooks --policies "$STATE/policies" --url "https://$ip:443" \
    --ca-bundle "$STATE/ivory-certs/ca.crt" --service-namespace "$NS" "${args[@]}" --static "$DIR"
}

# run_pod NS NAME IMAGE [kubectl flags…]: creates a Pod that never runs (no node matches its
# selector); prints its stored image.
run_pod() {
  kubectl -n "$1" run "$2" --image="$3" --restart=Never "${@:4}" \
    --overrides='{"spec": {"nodeSelector": {"ivory.test/never": "true"}}}' \
    -o jsonpath='{.spec.containers[0].image}'
}

# refused NS IMAGE PATTERN: a dry-run Pod of IMAGE is refused, with PATTERN in the answer.
refused() {
  local out
  if out="$(run_pod "$1" "probe-$RANDOM" "$2" --dry-run=server 2>&1)"; then
    fail "a Pod of $2 in $1 was admitted: $out"
  fi
  grep -q "$3" <<<"$out" || fail "the refusal of $2 does not say \"$3\": $out"
  log "refused as expected: $(cut -c1-220 <<<"$out")"
}

admitted_pinned() {
  local image
  image="$(run_pod "$1" "$2" "$3")" || fail "the signed Pod $2 was refused: $image"
  [[ "$image" == *@sha256:* ]] || fail "the signed Pod $2 was not pinned: $image"
  log "admitted and pinned: $image"
}

doctor_says() {
  local report
  report="$("$IVORY_BIN" doctor --static-manifests "$DIR" 2>&1)" || { echo "$report"; fail "ivory doctor failed"; }
  echo "$report"
  for expected in "$@"; do grep -qF "$expected" <<<"$report" || fail "ivory doctor does not say \"$expected\""; done
}

# The API server applies a static manifest set it reports by hash; wait until it is this one.
wait_applied() {
  local deadline=$((SECONDS + 120))
  until "$IVORY_BIN" doctor --static-manifests "$DIR" 2>/dev/null | grep -q "in force: the API server applies $DIR/validating"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "the API server does not apply $DIR after 120 s"
    sleep 2
  done
}

main() {
  log "1. static manifests written; the API server restarted with --admission-control-config-file"
  kubectl create namespace "$CHECK_NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl create namespace "$LATE_NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  write_static kube-system "$LATE_NS"
  sed 's/^/  /' "$DIR/admission-configuration.yaml"
  step "$ROOT/scripts/cluster.sh" restart kube-apiserver
  wait_applied
  doctor_says "static manifests (ValidatingAdmissionWebhook)" "static webhook"

  log "2. every ivory webhook object deleted through the API"
  step kubectl delete mutatingwebhookconfigurations,validatingwebhookconfigurations \
    -l webhook.ivory.dev/managed-by=ivory
  [ -z "$(kubectl get mutatingwebhookconfigurations,validatingwebhookconfigurations -o name)" ] ||
    fail "webhook objects remain: $(kubectl get mutatingwebhookconfigurations,validatingwebhookconfigurations -o name)"
  refused "$CHECK_NS" "$REGISTRY/demo/unsigned:v1" "denied the request"
  kubectl -n "$CHECK_NS" delete pod signed --ignore-not-found --wait=false >/dev/null
  admitted_pinned "$CHECK_NS" signed "$REGISTRY/demo/signed:v1"
  doctor_says "in force: the API server applies" "static webhook"

  log "3. the API refuses the reserved names"
  local out
  if out="$(kubectl create -f - 2>&1 <<'YAML'
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: ivory-resource-validating-webhook-cfg.static.k8s.io}
webhooks: []
YAML
)"; then fail "the API created a .static.k8s.io configuration: $out"; fi
  grep -q "reserved for static manifest-based configurations" <<<"$out" || fail "unexpected refusal: $out"
  log "create refused: $out"
  if out="$(kubectl delete validatingwebhookconfiguration ivory-resource-validating-webhook-cfg.static.k8s.io 2>&1)"; then
    fail "the API deleted the static configuration: $out"
  fi
  grep -q "NotFound\|not found" <<<"$out" || fail "unexpected answer to the delete: $out"
  log "delete: $out"
  refused "$CHECK_NS" "$REGISTRY/demo/unsigned:v1" "denied the request"

  log "4. an edit of the files applies without a restart: $LATE_NS no longer excluded"
  run_pod "$LATE_NS" "before-edit-$RANDOM" "$REGISTRY/demo/unsigned:v1" --dry-run=server >/dev/null ||
    fail "$LATE_NS was judged while excluded"
  write_static kube-system
  local deadline=$((SECONDS + 120)) took=$SECONDS
  until ! run_pod "$LATE_NS" "after-edit-$RANDOM" "$REGISTRY/demo/unsigned:v1" --dry-run=server >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "the edit was not applied in 120 s"
    sleep 1
  done
  log "the edit applied after $((SECONDS - took)) s"
  refused "$LATE_NS" "$REGISTRY/demo/unsigned:v1" "denied the request"
  wait_applied

  log "5. the bootstrap gap: no ivory Pod, the API server restarted"
  step kubectl -n "$NS" scale deployment/ivory --replicas=0
  kubectl -n "$NS" wait --for=delete pod -l app.kubernetes.io/name=ivory --timeout=120s
  step "$ROOT/scripts/cluster.sh" restart kube-apiserver
  refused "$CHECK_NS" "$REGISTRY/demo/signed:v1" "failed calling webhook"
  step kubectl -n "$NS" scale deployment/ivory --replicas=2
  step kubectl -n "$NS" rollout status deployment/ivory --timeout=300s
  kubectl -n "$CHECK_NS" delete pod signed --wait=true >/dev/null
  admitted_pinned "$CHECK_NS" signed "$REGISTRY/demo/signed:v1"
  refused "$CHECK_NS" "$REGISTRY/demo/unsigned:v1" "denied the request"

  if [ "${1:-}" = matrix ]; then
    log "6. the failure matrix with the static registration alone"
    mkdir -p "$OUT"
    step env MATRIX_OUT="$OUT" "$ROOT/scripts/cluster/matrix.sh" rollout sigkill apiserver
    local admitted
    admitted="$(awk -F'\t' '$2 == "unsigned" && $3 ~ /^2/' "$OUT"/matrix/*.tsv | wc -l)"
    [ "$admitted" = 0 ] || fail "$admitted unsigned Pod(s) admitted under the static registration"
    log "matrix: 0 unsigned admitted ($OUT/matrix.md)"
  fi
  kubectl delete namespace "$CHECK_NS" "$LATE_NS" --wait=false >/dev/null
  log "static registration: all steps passed"
}

main "$@"
