#!/usr/bin/env bash
# ivory's job through the controllers of the cluster of scripts/cluster.sh, after
# `scripts/cluster/ivory.sh install` and `verify` (which leave the sample key policy for
# $REGISTRY/demo/* with autogen off, so every Pod a controller makes is judged when it is made):
#
#   scripts/cluster.sh exec scripts/cluster/workloads.sh
#
# 1. CronJobs: the Job of a signed one runs the pinned digest; the Job of an unsigned one gets no
#    Pod and its FailedCreate event carries ivory's denial.
# 2. DaemonSets: the same.
# 3. `kubectl debug` with an unsigned image is denied; with a signed one, the ephemeral container
#    is admitted.
# 4. A sidecar injected by a second mutating webhook (scripts/cluster/sidecar-injector.py, called
#    after ivory's): a signed sidecar is pinned on ivory's reinvocation and runs; with an
#    unsigned one the same Pod is denied.
# 5. PolicyReports written by ivory from inside the cluster name these Pods (from here on ivory
#    scans every 20 s: `extraArgs={--background-scan-interval=20s}`).
# 6. Background re-verification: the signature of a running image is
#    deleted from the registry; the next scan reports the Pod as failing, and a new Pod of the
#    image is denied. The signature is written again at the end.
# Each step says what it checked; the first surprise stops the script (exit 1).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
: "${KUBECONFIG:?run through scripts/cluster.sh exec}" "${REGISTRY:?}" "${IVORY_CLUSTER_DIR:?}"
STATE="$IVORY_CLUSTER_DIR"
# shellcheck source=scripts/lib/needs.sh
source "$ROOT/scripts/lib/needs.sh"
needs_pkgs jq:jq openssl:openssl python3:python3
needs_cmds kubectl
needs_tools crane helm
needs_done

NS=ivory-system
W=work
CRANE="$ROOT/.tools/bin/crane"
export PATH="$ROOT/.tools/bin:$PATH"

log() { echo "[workloads.sh $(date -u +%H:%M:%S)] $*" >&2; }
step() { log "\$ $*"; "$@"; }
fail() { log "UNEXPECTED: $*"; exit 1; }

# until SECONDS CMD…: CMD until it succeeds, at most SECONDS.
until_ok() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 2
  done
}

digest_of() { "$CRANE" digest "$REGISTRY/demo/$1:v1"; }

# image NAME LABEL: busybox with a label of its own (its own digest) as demo/NAME:v1.
image() {
  "$CRANE" mutate "$REGISTRY/library/busybox:1" --label "ivory.demo=$2" -t "$REGISTRY/demo/$1:v1" >/dev/null 2>&1
}

sign() {
  "$ROOT/scripts/cluster/sign.sh" "$STATE/pki/cosign.key" "$REGISTRY/demo/$1@$(digest_of "$1")" >/dev/null
}

pod_template() { # NAME IMAGE [RESTART]
  cat <<YAML
    metadata: {labels: {app: $1}}
    spec:
      terminationGracePeriodSeconds: 1
      restartPolicy: ${3:-Always}
      containers:
        - name: main
          image: $REGISTRY/demo/$2:v1
          command: [sh, -c, 'echo ran $2; sleep 3600']
YAML
}

cronjob() { # NAME IMAGE
  cat <<YAML
apiVersion: batch/v1
kind: CronJob
metadata: {name: $1}
spec:
  schedule: "* * * * *"
  concurrencyPolicy: Forbid
  jobTemplate:
    spec:
      backoffLimit: 0
      template:
$(pod_template "$1" "$2" Never | sed 's/^/    /; s/sleep 3600/exit 0/')
YAML
}

daemonset() { # NAME IMAGE
  cat <<YAML
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: $1}
spec:
  selector: {matchLabels: {app: $1}}
  template:
$(pod_template "$1" "$2")
YAML
}

# failed_create KIND NAME: the FailedCreate event message of KIND/NAME (or of its Jobs).
failed_create() {
  kubectl -n "$W" get events -o json | jq -r --arg kind "$1" --arg name "$2" '
    .items[] | select(.reason == "FailedCreate" and .involvedObject.kind == $kind
      and (.involvedObject.name | startswith($name))) | .message' | head -n 1
}

show_pod_images() { # SELECTOR
  kubectl -n "$W" get pods -l "$1" -o json | jq -r '.items[] | "  pod \(.metadata.name) (\(.status.phase))",
    (.spec.containers[], (.spec.ephemeralContainers // [])[] | "    spec   \(.name): \(.image)"),
    ((.status.containerStatuses // [])[], (.status.ephemeralContainerStatuses // [])[]
      | "    pulled \(.name): \(.imageID)")'
}

# pinned SELECTOR IMAGE: every container of IMAGE in the Pods of SELECTOR is spec'd
# IMAGE:v1@sha256:<its digest>, and what containerd pulled for it is that digest.
pinned() {
  local digest bad
  digest="$(digest_of "$2")"
  bad="$(kubectl -n "$W" get pods -l "$1" -o json | jq -r --arg image "$REGISTRY/demo/$2:v1" --arg d "$digest" '
    .items[] | . as $pod | [.spec.containers[], (.spec.ephemeralContainers // [])[]]
    | map(select(.image | startswith($image))) | .[]
    | select(.image != "\($image)@\($d)") | "\($pod.metadata.name)/\(.name): \(.image)"')"
  [ -z "$bad" ] || fail "not pinned to $digest: $bad"
}

prepare() {
  log "images: demo/proxy:v1 (signed) and demo/proxy-unsigned:v1 beside demo/signed and demo/unsigned"
  image proxy proxy
  image proxy-unsigned proxy-unsigned
  sign proxy
  kubectl delete namespace "$W" --ignore-not-found --wait=true >/dev/null
  kubectl create namespace "$W" >/dev/null
}

cronjobs_start() {
  log "1. CronJobs (their Jobs run at the next minute; checked in step 1b)"
  kubectl -n "$W" apply -f - <<<"$(cronjob cron-signed signed)"
  kubectl -n "$W" apply -f - <<<"$(cronjob cron-unsigned unsigned)"
}

cronjobs_check() {
  log "1b. the CronJobs' Jobs"
  until_ok 150 sh -c "kubectl -n $W get pods -l app=cron-signed -o jsonpath='{.items[0].status.phase}' | grep -qx Succeeded" ||
    fail "no Pod of cron-signed's Job succeeded in 150 s"
  show_pod_images app=cron-signed
  pinned app=cron-signed signed
  until_ok 60 sh -c "[ -n \"\$(kubectl -n $W get events --field-selector reason=FailedCreate -o name)\" ]" || true
  local why
  why="$(failed_create Job cron-unsigned)"
  [ -n "$why" ] || fail "cron-unsigned's Job has no FailedCreate event"
  [ -z "$(kubectl -n "$W" get pods -l app=cron-unsigned -o name)" ] || fail "a Pod of cron-unsigned exists"
  log "  cron-unsigned's Job, FailedCreate: ${why:0:260}"
  kubectl -n "$W" delete cronjob cron-signed cron-unsigned --wait=false >/dev/null
}

daemonsets() {
  log "2. DaemonSets"
  kubectl -n "$W" apply -f - <<<"$(daemonset ds-signed signed)"
  kubectl -n "$W" apply -f - <<<"$(daemonset ds-unsigned unsigned)"
  step kubectl -n "$W" rollout status daemonset/ds-signed --timeout=120s
  show_pod_images app=ds-signed
  pinned app=ds-signed signed
  until_ok 30 sh -c "[ -n \"\$(kubectl -n $W get events --field-selector reason=FailedCreate,involvedObject.name=ds-unsigned -o name)\" ]" ||
    fail "ds-unsigned has no FailedCreate event"
  [ -z "$(kubectl -n "$W" get pods -l app=ds-unsigned -o name)" ] || fail "a Pod of ds-unsigned exists"
  log "  ds-unsigned, FailedCreate: $(failed_create DaemonSet ds-unsigned | cut -c1-260)"
}

debug() {
  log "3. kubectl debug on the running Pod of ds-signed"
  local pod out
  pod="$(kubectl -n "$W" get pods -l app=ds-signed -o jsonpath='{.items[0].metadata.name}')"
  if out="$(kubectl -n "$W" debug "pod/$pod" -c debug-unsigned --image="$REGISTRY/demo/unsigned:v1" -- sleep 600 2>&1)"; then
    fail "kubectl debug with an unsigned image was admitted: $out"
  fi
  log "  unsigned: ${out:0:300}"
  step kubectl -n "$W" debug "pod/$pod" -c debug-signed --image="$REGISTRY/demo/signed:v1" -- sleep 600
  until_ok 60 sh -c "kubectl -n $W get pod $pod -o jsonpath='{.status.ephemeralContainerStatuses[0].state.running}' | grep -q started" ||
    fail "the signed debug container did not start"
  show_pod_images app=ds-signed
}

injector_start() {
  local dir="$STATE/sidecar-injector"
  mkdir -p "$dir"
  if [ ! -f "$dir/tls.crt" ]; then
    openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null | openssl pkcs8 -topk8 -nocrypt -out "$dir/tls.key"
    openssl req -new -key "$dir/tls.key" -subj /CN=sidecar-injector -out "$dir/tls.csr" 2>/dev/null
    printf 'subjectAltName=IP:10.201.0.1\nextendedKeyUsage=serverAuth\n' >"$dir/tls.ext"
    openssl x509 -req -in "$dir/tls.csr" -CA "$STATE/pki/ca.crt" -CAkey "$STATE/pki/ca.key" \
      -CAcreateserial -days 2 -extfile "$dir/tls.ext" -out "$dir/tls.crt" 2>/dev/null
  fi
  python3 "$ROOT/scripts/cluster/sidecar-injector.py" --listen 10.201.0.1:9443 \
    --cert "$dir/tls.crt" --key "$dir/tls.key" \
    "proxy=$REGISTRY/demo/proxy:v1" "proxy-unsigned=$REGISTRY/demo/proxy-unsigned:v1" \
    >"$STATE/logs/sidecar-injector.log" 2>&1 &
  INJECTOR=$!
  trap 'kill "$INJECTOR" 2>/dev/null || true' EXIT
  # Named to sort after ivory's configuration: the API server calls mutating webhooks in
  # configuration-name order, so the sidecar arrives after ivory has mutated and ivory's
  # reinvocation (reinvocationPolicy IfNeeded) pins it.
  kubectl apply -f - <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: zz-sidecar-injector}
webhooks:
  - name: inject.sidecar.ivory.test
    admissionReviewVersions: [v1]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 5
    reinvocationPolicy: Never
    objectSelector: {matchExpressions: [{key: sidecar.ivory.test/inject, operator: Exists}]}
    rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
    clientConfig:
      url: https://10.201.0.1:9443/inject
      caBundle: $(base64 -w0 "$STATE/pki/ca.crt")
YAML
}

sidecars() {
  log "4. a sidecar injected by a second mutating webhook"
  injector_start
  sleep 2
  step kubectl -n "$W" apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: meshed, labels: {app: meshed, sidecar.ivory.test/inject: proxy}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: main, image: $REGISTRY/demo/signed:v1, command: [sleep, "3600"]}]
YAML
  step kubectl -n "$W" wait --for=condition=Ready pod/meshed --timeout=120s
  show_pod_images app=meshed
  pinned app=meshed proxy
  pinned app=meshed signed
  local out
  if out="$(kubectl -n "$W" apply -f - 2>&1 <<YAML
apiVersion: v1
kind: Pod
metadata: {name: meshed-bad, labels: {app: meshed-bad, sidecar.ivory.test/inject: proxy-unsigned}}
spec:
  containers: [{name: main, image: $REGISTRY/demo/signed:v1, command: [sleep, "3600"]}]
YAML
  )"; then
    fail "a Pod with an unsigned injected sidecar was admitted: $out"
  fi
  # The same Pod with the signed sidecar was admitted above: the sidecar is what was refused
  # (the message is the policy's own, which names no image).
  log "  the same Pod with the unsigned sidecar: ${out:0:300}"
  kubectl delete mutatingwebhookconfiguration zz-sidecar-injector >/dev/null
}

# report_result POD POLICY: the result ivory's PolicyReports hold for POD and POLICY.
report_result() {
  kubectl -n "$W" get policyreports -o json | jq -r --arg pod "$1" --arg policy "$2" '
    [.items[] | select(.scope.name == $pod) | .results[] | select(.policy == $policy)
      | "\(.result) (\(.source // "")\(if .properties.process then ", " + .properties.process else "" end))"] | first // empty'
}

reports() {
  # The sample policy denies: like Kyverno, ivory reports Deny policies' results from background
  # scans (admission reports only Audit/Warn results), so scans run every 20 s from here on.
  log "5. PolicyReports written by ivory from inside the cluster (background scans every 20 s)"
  step helm upgrade ivory "$ROOT/deploy/helm/ivory" -n "$NS" --reuse-values \
    --set 'extraArgs={--background-scan-interval=20s}' --wait --timeout 5m >/dev/null
  local pod
  pod="$(kubectl -n "$W" get pods -l app=ds-signed -o jsonpath='{.items[0].metadata.name}')"
  until_ok 60 sh -c "[ -n \"\$(kubectl -n $W get policyreports -o name)\" ]" || fail "no PolicyReport in $W"
  kubectl -n "$W" get policyreports
  until_ok 60 test -n "$(report_result "$pod" sample-cosign-key)" || true
  log "  $pod, sample-cosign-key: $(report_result "$pod" sample-cosign-key)"
  [[ "$(report_result "$pod" sample-cosign-key)" == pass* ]] || fail "no passing result for $pod"
}

background() {
  log "6. background re-verification (scans every 20 s)"
  local pod digest tag result deadline out
  pod="$(kubectl -n "$W" get pods -l app=ds-signed -o jsonpath='{.items[0].metadata.name}')"
  digest="$(digest_of signed)"
  tag="sha256-${digest#sha256:}.sig"
  # Distribution deletes manifests by digest only (the tag goes with it).
  step "$CRANE" delete "$REGISTRY/demo/signed@$("$CRANE" digest "$REGISTRY/demo/signed:$tag")"
  log "  deleted the signature $REGISTRY/demo/signed:$tag of the image $pod runs"
  deadline=$((SECONDS + 90))
  until result="$(report_result "$pod" sample-cosign-key)"; [[ "$result" == fail* ]]; do
    [ "$SECONDS" -lt "$deadline" ] || { sign signed; fail "after 90 s the report of $pod still says: $result"; }
    sleep 3
  done
  log "  the next scan: $pod, sample-cosign-key: $result"
  if out="$(kubectl -n "$W" run after-removal --image="$REGISTRY/demo/signed:v1" --restart=Never -- sleep 60 2>&1)"; then
    sign signed; fail "a new Pod of the image whose signature was deleted was admitted: $out"
  fi
  log "  a new Pod of it: ${out:0:300}"
  sign signed
  # The scan's negative verdict is cached for the negative TTL (30 s) in each replica: the image
  # is admitted again once it has passed, without waiting for the next scan.
  local resigned=$SECONDS
  until_ok 90 kubectl -n "$W" run after-resign --image="$REGISTRY/demo/signed:v1" --restart=Never \
    --dry-run=server -- sleep 1 || fail "the image signed again is still denied after 90 s"
  log "  signature written again: a new Pod of the image is admitted again after $((SECONDS - resigned)) s"
  sleep $((resigned + 35 > SECONDS ? resigned + 35 - SECONDS : 0)) # the other replica's negative TTL too
  step helm upgrade ivory "$ROOT/deploy/helm/ivory" -n "$NS" --reuse-values --set 'extraArgs=null' \
    --wait --timeout 5m >/dev/null
}

prepare
cronjobs_start
daemonsets
debug
sidecars
reports
cronjobs_check
background
log "all steps as expected"
