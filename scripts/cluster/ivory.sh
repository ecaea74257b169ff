#!/usr/bin/env bash
# ivory in the cluster of scripts/cluster.sh, installed the way users install it. Run through
# `scripts/cluster.sh exec` (inside the cluster's namespace, with KUBECONFIG, REGISTRY,
# SSL_CERT_FILE and IVORY_CLUSTER_DIR set):
#
#   scripts/cluster.sh exec scripts/cluster/ivory.sh smoke     a Deployment + Service of busybox (milestone A)
#   scripts/cluster.sh exec scripts/cluster/ivory.sh install   image, Helm chart, policy, webhooks, doctor (B)
#   scripts/cluster.sh exec scripts/cluster/ivory.sh verify    a signed Deployment runs, an unsigned one is denied (C)
#   scripts/cluster.sh exec scripts/cluster/ivory.sh kustomize the kustomize path (deploy/), checked, then removed
#
# IVORY_BIN: the ivory binary to package and to run `ivory webhooks`/`ivory doctor` with
# (default $CARGO_TARGET_DIR/debug/ivory, else target/debug/ivory).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
: "${KUBECONFIG:?run through scripts/cluster.sh exec}" "${REGISTRY:?}" "${IVORY_CLUSTER_DIR:?}"
STATE="$IVORY_CLUSTER_DIR"
IVORY_BIN="${IVORY_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/ivory}"
NS=ivory-system
# ivory's Service address, fixed (the lower band of the service range, which Kubernetes keeps for
# fixed addresses) so that the static registration (scripts/cluster/static.sh) can name it.
SERVICE_IP=10.203.0.10
# scripts/cluster.sh up installed these (nothing can be downloaded inside the namespace);
# kubectl is on PATH through scripts/cluster.sh exec.
# shellcheck source=scripts/lib/needs.sh
source "$ROOT/scripts/lib/needs.sh"
needs_pkgs curl:curl jq:jq openssl:openssl file:file
needs_cmds kubectl
needs_tools crane helm kustomize
needs_done

log() { echo "[ivory.sh $(date -u +%H:%M:%S)] $*" >&2; }
step() { log "\$ $*"; "$@"; }
# retry SECONDS CMD…: CMD again every 3 s until it succeeds (its last output shown), at most SECONDS.
retry() {
  local deadline=$((SECONDS + $1)) out; shift
  log "\$ $*"
  until out="$("$@" 2>&1)"; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "$out"; return 1; }
    sleep 3
  done
  echo "$out"
}

smoke() {
  kubectl create namespace smoke --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl apply -n smoke -f - <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: hello}
spec:
  replicas: 2
  selector: {matchLabels: {app: hello}}
  template:
    metadata: {labels: {app: hello}}
    spec:
      containers:
        - name: httpd
          image: $REGISTRY/library/busybox:1
          command: [sh, -c, 'echo hello from \$(hostname) >/tmp/index.html; exec httpd -f -p 8080 -h /tmp']
          ports: [{containerPort: 8080}]
          readinessProbe: {httpGet: {path: /index.html, port: 8080}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: hello}
spec:
  selector: {app: hello}
  ports: [{port: 80, targetPort: 8080}]
YAML
  step kubectl -n smoke rollout status deployment/hello --timeout=120s
  kubectl -n smoke get pods -o wide
  local ip
  ip="$(kubectl -n smoke get service hello -o jsonpath='{.spec.clusterIP}')"
  log "through the Service's ClusterIP (kube-proxy's iptables rules): http://$ip/index.html"
  for _ in 1 2 3 4; do curl -fsS --max-time 5 "http://$ip/index.html"; done
}

# push_image: scripts/image.sh packs IVORY_BIN and pushes it; sets IMAGE_REPO and IMAGE_DIGEST.
push_image() {
  # Nothing can be downloaded inside the namespace: build these before, outside it.
  [ -x "$IVORY_BIN" ] || { log "cannot install: $IVORY_BIN is missing (run cargo build -p ivory first)"; exit 1; }
  [ -x "$ROOT/.tools/bin/helm" ] || { log "cannot install: no helm in .tools/bin (run scripts/install-deploy-tools.sh first)"; exit 1; }
  export PATH="$ROOT/.tools/bin:$PATH"
  local ref
  log "image: scripts/image.sh --binary $IVORY_BIN --push $REGISTRY/ivory/ivory"
  ref="$("$ROOT/scripts/image.sh" --binary "$IVORY_BIN" --out "$STATE/image" --tag cluster \
    --push "$REGISTRY/ivory/ivory")"
  IMAGE_REPO="${ref%@*}" IMAGE_DIGEST="${ref#*@}"
  log "pushed $ref ($(file -b "$IVORY_BIN" | grep -o 'static-pie linked\|statically linked\|dynamically linked'))"
}

# prerequisites: the namespace, the serving certificate's Secret (deploy/certs/make-certs.sh),
# the registry CA's ConfigMap, and the PolicyReport CRDs (Kyverno's, in deploy/crds/kyverno:
# ivory writes reports only when they are installed before it starts).
prerequisites() {
  kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  step "$ROOT/deploy/certs/make-certs.sh" --out "$STATE/ivory-certs" --namespace "$NS" --service ivory \
    --ip "$SERVICE_IP" >/dev/null
  step kubectl apply -f "$STATE/ivory-certs/secret.yaml"
  kubectl -n "$NS" create configmap registry-ca --from-file=ca.crt="$SSL_CERT_FILE" \
    --dry-run=client -o yaml | kubectl apply -f -
  step kubectl apply -f "$ROOT/deploy/crds/kyverno/wgpolicyk8s.io_policyreports.yaml" \
    -f "$ROOT/deploy/crds/kyverno/wgpolicyk8s.io_clusterpolicyreports.yaml"
}

# register POLICY_FILE: the policy, then the webhooks `ivory webhooks` derives from it.
register() {
  step kubectl apply -f "$1"
  log "\$ ivory webhooks --policies $1 --service-namespace $NS --service-name ivory --ca-bundle $STATE/ivory-certs/ca.crt | kubectl apply -f -"
  "$IVORY_BIN" webhooks --policies "$1" --service-namespace "$NS" --service-name ivory \
    --ca-bundle "$STATE/ivory-certs/ca.crt" | kubectl apply -f -
}

install() {
  # The rehearsal's pod network has no route out: the chart's default TUF refresh from the
  # public-good repository is turned off (nothing leaves the machine); the built-in root serves.
  push_image
  prerequisites
  step helm upgrade --install ivory "$ROOT/deploy/helm/ivory" -n "$NS" \
    --set image.repository="$IMAGE_REPO" --set image.digest="$IMAGE_DIGEST" \
    --set replicaCount=2 --set podDisruptionBudget.minAvailable=1 --set service.clusterIP="$SERVICE_IP" \
    --set registryCA.configMap=registry-ca --set trustRoot.tuf.mirror= --wait --timeout 5m
  kubectl -n "$NS" get deploy,pods,pdb,svc,endpointslices -o wide
  policy >"$STATE/policy.yaml"
  register "$STATE/policy.yaml"
  retry 30 "$IVORY_BIN" doctor
}

# The kustomize path of deploy/README.md: an overlay over deploy/ made with `kustomize create` and
# `kustomize edit` (the image by digest, 2 replicas, PDB minAvailable 1, the registry CA), then
# `kubectl apply -k`; webhooks;
# doctor; a signed Pod admitted and pinned, an unsigned one denied. Then everything it made in
# the namespace goes (the namespace itself, and the cluster-wide RBAC objects), so that
# `install` (Helm) starts clean; the CRDs stay (Helm skips CRDs that exist).
install_kustomize() {
  push_image
  prerequisites
  local overlay="$STATE/kustomize"
  rm -rf "$overlay"; mkdir -p "$overlay"
  cp "$SSL_CERT_FILE" "$overlay/registry-ca.crt"
  (
    cd "$overlay"
    step kustomize create --resources "$(realpath --relative-to=. "$ROOT/deploy")"
    step kustomize edit set image "ghcr.io/ivory/ivory=$IMAGE_REPO@$IMAGE_DIGEST"
    step kustomize edit set replicas ivory=2
    step kustomize edit add patch --kind PodDisruptionBudget --name ivory \
      --patch '[{"op": "replace", "path": "/spec/minAvailable", "value": 1}]'
    step kustomize edit add patch --kind Deployment --name ivory --patch '[
      {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--registry-ca=/etc/ivory/registry-ca/ca.crt"},
      {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-", "value": {"name": "registry-ca", "mountPath": "/etc/ivory/registry-ca", "readOnly": true}},
      {"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": "registry-ca", "configMap": {"name": "registry-ca"}}}]'
  )
  cat "$overlay/kustomization.yaml"
  step kubectl apply -k "$overlay"
  step kubectl -n "$NS" rollout status deployment/ivory --timeout=300s
  kubectl -n "$NS" get deploy,pods,pdb,svc -o wide
  key_pair
  policy >"$STATE/policy.yaml"
  register "$STATE/policy.yaml"
  retry 30 "$IVORY_BIN" doctor
  demo_images
  kubectl create namespace kustomize-check --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  step kubectl -n kustomize-check run signed --image="$REGISTRY/demo/signed:v1" --restart=Never -- sleep 5
  kubectl -n kustomize-check get pod signed -o jsonpath='  spec image: {.spec.containers[0].image}{"\n"}'
  [[ "$(kubectl -n kustomize-check get pod signed -o jsonpath='{.spec.containers[0].image}')" == *@sha256:* ]] ||
    { log "UNEXPECTED: the signed Pod was not pinned"; exit 1; }
  if kubectl -n kustomize-check run unsigned --image="$REGISTRY/demo/unsigned:v1" --restart=Never; then
    log "UNEXPECTED: the unsigned Pod was admitted"; exit 1
  fi
  log "kustomize path done; removing it for the Helm install"
  kubectl delete namespace kustomize-check "$NS" --wait=true >/dev/null
  kubectl delete clusterrole,clusterrolebinding -l app.kubernetes.io/part-of=ivory >/dev/null
}

# policy [GLOB_PREFIX KEYFILE NAME]: the sample key policy (policies/samples/cosign-key.yaml)
# for images under GLOB_PREFIX (default this registry's demo/ repositories) and KEYFILE (default
# the cluster's own cosign key pair, made when missing), named NAME.
policy() {
  local prefix="${1:-$REGISTRY/demo}" keyfile="${2:-$STATE/pki/cosign.pub}" name="${3:-sample-cosign-key}"
  [ $# -gt 0 ] || key_pair
  awk -v host="$prefix" -v keyfile="$keyfile" -v keyname="${keyfile##*/}" -v name="$name" '
    /BEGIN PUBLIC KEY/ {
      indent = substr($0, 1, index($0, "-") - 1)
      while ((getline line < keyfile) > 0) print indent line
      skipping = 1; next
    }
    skipping && /END PUBLIC KEY/ { skipping = 0; next }
    skipping { next }
    /^  name: sample-cosign-key$/ { print "  name: " name; next }
    { gsub("ghcr.io/acme", host); gsub("the acme release key", "the key " keyname); print }
  ' "$ROOT/policies/samples/cosign-key.yaml"
}

# push_fixture NAME: fixtures/oci/ivory/NAME into $REGISTRY/fixtures/NAME, every manifest of its
# index.json in order (one crane push per manifest; tags from the ref.name annotations).
push_fixture() {
  local layout="$ROOT/fixtures/oci/ivory/$1" tmp n i tag digest
  tmp="$(mktemp -d)"
  ln -s "$layout/blobs" "$tmp/blobs"
  cp "$layout/oci-layout" "$tmp/oci-layout"
  n="$(jq '.manifests | length' "$layout/index.json")"
  for i in $(seq 0 $((n - 1))); do
    jq -c "{schemaVersion: 2, manifests: [.manifests[$i]]}" "$layout/index.json" >"$tmp/index.json"
    tag="$(jq -r ".manifests[$i].annotations[\"org.opencontainers.image.ref.name\"] // empty" "$layout/index.json")"
    digest="$(jq -r ".manifests[$i].digest" "$layout/index.json")"
    "$ROOT/.tools/bin/crane" push "$tmp" "$REGISTRY/fixtures/$1:${tag:-push-$i}" >/dev/null 2>&1
    log "pushed fixtures/$1 ${tag:-(by digest)} $digest"
  done
  rm -rf "$tmp"
}

key_pair() {
  [ -f "$STATE/pki/cosign.key" ] && return
  openssl ecparam -name prime256v1 -genkey -noout -out "$STATE/pki/cosign.key.sec1"
  openssl pkcs8 -topk8 -nocrypt -in "$STATE/pki/cosign.key.sec1" -out "$STATE/pki/cosign.key"
  openssl pkey -in "$STATE/pki/cosign.key" -pubout -out "$STATE/pki/cosign.pub"
  rm -f "$STATE/pki/cosign.key.sec1"
}

# The API server's audit log (Metadata level) records ivory's verified-images audit annotation on
# the create of each signed Pod: the digest that was verified and the key that signed it.
audited_evidence() {
  local digest="$1" events
  events="$(jq -c 'select(.verb == "create" and .objectRef.resource == "pods"
      and .objectRef.namespace == "demo" and .stage == "ResponseComplete")
    | .annotations // {} | to_entries[] | select(.key | endswith("/verified-images")) | .value' \
    "$STATE/logs/audit.log")"
  if ! grep -q "$digest" <<<"$events"; then
    log "UNEXPECTED: no audit event names the verified digest $digest"; exit 1
  fi
  log "the API server's audit log, verified-images of the signed Pods' creates:"
  head -n 1 <<<"$events" | jq -r 'fromjson | .[] | "  \(.image)  key \(.key)  policy \(.policy)"'
}

# demo_images: demo/signed:v1 and demo/unsigned:v1, busybox with different labels (so different
# digests); the first gets a signature of the cluster's cosign key. Sets SIGNED and UNSIGNED.
demo_images() {
  key_pair
  local crane="$ROOT/.tools/bin/crane"
  "$crane" mutate "$REGISTRY/library/busybox:1" --label ivory.demo=signed -t "$REGISTRY/demo/signed:v1" >/dev/null 2>&1
  "$crane" mutate "$REGISTRY/library/busybox:1" --label ivory.demo=unsigned -t "$REGISTRY/demo/unsigned:v1" >/dev/null 2>&1
  SIGNED="$REGISTRY/demo/signed@$("$crane" digest "$REGISTRY/demo/signed:v1")"
  UNSIGNED="$REGISTRY/demo/unsigned@$("$crane" digest "$REGISTRY/demo/unsigned:v1")"
  step "$ROOT/scripts/cluster/sign.sh" "$STATE/pki/cosign.key" "$SIGNED"
  log "signed $SIGNED; not signed $UNSIGNED"
}

verify() {
  demo_images
  local signed="$SIGNED"

  # A rerun starts from the sample policy and an empty namespace.
  kubectl delete namespace demo --ignore-not-found --wait=true >/dev/null
  policy >"$STATE/policy.yaml"
  kubectl apply -f "$STATE/policy.yaml" >/dev/null
  "$IVORY_BIN" webhooks --policies "$STATE/policy.yaml" --service-namespace "$NS" --service-name ivory \
    --ca-bundle "$STATE/ivory-certs/ca.crt" 2>/dev/null | kubectl apply -f - >/dev/null
  kubectl create namespace demo
  log "1. the sample policy as it is (autogen: Deployments are checked too)"
  step kubectl -n demo apply -f - <<<"$(deployment signed)"
  step kubectl -n demo rollout status deployment/signed --timeout=120s
  log "the signed Deployment: template image (pinned by ivory's mutating webhook) and the digest containerd pulled"
  kubectl -n demo get deploy signed -o jsonpath='  template image: {.spec.template.spec.containers[0].image}{"\n"}'
  pods_images signed
  log "the unsigned Deployment is refused when it is created:"
  if kubectl -n demo apply -f - <<<"$(deployment unsigned)"; then
    log "UNEXPECTED: the unsigned Deployment was admitted"; exit 1
  fi

  log "2. the same policy with autogen off (spec.autogen.podControllers.controllers: []): only Pods are checked"
  policy | awk '{print} /^spec:$/ {print "  autogen:\n    podControllers:\n      controllers: []"}' >"$STATE/policy-pods.yaml"
  step kubectl apply -f "$STATE/policy-pods.yaml"
  "$IVORY_BIN" webhooks --policies "$STATE/policy-pods.yaml" --service-namespace "$NS" --service-name ivory \
    --ca-bundle "$STATE/ivory-certs/ca.crt" | kubectl apply -f -
  sleep 3 # ivory's policy watch
  kubectl -n demo delete deployment signed --wait=true >/dev/null
  step kubectl -n demo apply -f - <<<"$(deployment signed)"
  step kubectl -n demo rollout status deployment/signed --timeout=120s
  kubectl -n demo get deploy signed -o jsonpath='  template image: {.spec.template.spec.containers[0].image}{"\n"}'
  pods_images signed
  audited_evidence "${signed#*@}"
  step kubectl -n demo apply -f - <<<"$(deployment unsigned)"
  sleep 10
  log "the unsigned Deployment: no Pod; its ReplicaSet says why"
  kubectl -n demo get deploy,rs,pods -o wide
  kubectl -n demo get rs -l app=unsigned \
    -o jsonpath='{range .items[*]}{.metadata.name}{": "}{range .status.conditions[*]}{.type}={.status} {.message}{"\n"}{end}{end}'
  [ -z "$(kubectl -n demo get pods -l app=unsigned -o name)" ] || { log "UNEXPECTED: an unsigned Pod exists"; exit 1; }

  log "3. signatures made by cosign itself: the fixtures (fixtures/oci/ivory/sig-p256, signed with the key"
  log "   of fixtures/keys/cosign-p256.pub; its image holds no program, so only admission is shown)"
  push_fixture sig-p256
  push_fixture unsigned
  mkdir -p "$STATE/policies"
  cp "$STATE/policy-pods.yaml" "$STATE/policies/demo.yaml"
  policy "$REGISTRY/fixtures" "$ROOT/fixtures/keys/cosign-p256.pub" fixture-cosign-key >"$STATE/policies/fixtures.yaml"
  step kubectl apply -f "$STATE/policies/fixtures.yaml"
  "$IVORY_BIN" webhooks --policies "$STATE/policies" --service-namespace "$NS" --service-name ivory \
    --ca-bundle "$STATE/ivory-certs/ca.crt" 2>/dev/null | kubectl apply -f -
  sleep 3 # ivory's policy watch
  step kubectl -n demo run fixture-signed --image="$REGISTRY/fixtures/sig-p256:v1" --restart=Never
  kubectl -n demo get pod fixture-signed -o jsonpath='  spec image: {.spec.containers[0].image}{"\n"}'
  if kubectl -n demo run fixture-unsigned --image="$REGISTRY/fixtures/unsigned:v1" --restart=Never; then
    log "UNEXPECTED: the unsigned fixture was admitted"; exit 1
  fi
  kubectl -n demo delete pod fixture-signed --wait=false >/dev/null
}

# deployment NAME: a one-replica Deployment of $REGISTRY/demo/NAME:v1 (by tag).
deployment() {
  cat <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: $1}
spec:
  replicas: 1
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: main
          image: $REGISTRY/demo/$1:v1
          command: [sleep, "3600"]
YAML
}

pods_images() {
  kubectl -n demo get pods -l "app=$1" --field-selector=status.phase=Running \
    -o jsonpath='{range .items[*]}  pod {.metadata.name}{"\n    spec image: "}{.spec.containers[0].image}{"\n    imageID:    "}{.status.containerStatuses[0].imageID}{"\n"}{end}'
}

case "${1:-}" in
  smoke) smoke ;;
  install) install ;;
  kustomize) install_kustomize ;;
  verify) verify ;;
  policy) shift; policy "$@" ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
