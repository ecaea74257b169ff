#!/usr/bin/env bash
# Failures under load: a steady stream of Pod creations through ivory while one thing goes wrong at
# a time, written as a table to target/cluster/matrix.md (raw answers in target/cluster/matrix/).
# Run through `scripts/cluster.sh exec` after `scripts/cluster/ivory.sh install` and `verify`
# (demo/signed:v1 signed, demo/unsigned:v1 not, the sample policy in force):
#
#   scripts/cluster.sh exec scripts/cluster/matrix.sh [SCENARIO…]
#
# Scenarios (all by default, in this order): baseline, rollout (kubectl rollout restart),
# sigkill three times (SIGKILL to the serving process of the replica holding the API server's
# connection), sigkill-main (to that replica's main process: the container), evict (every ivory Pod
# through the Eviction API, which honours the PodDisruptionBudget), apiserver (the kube-apiserver
# restarts), registry (the registry drops every packet for 30 s).
#
# The load: LOAD_RATE (10) Pod creations a second with curl against the API server, signed and
# unsigned images by tag in turn, at most LOAD_MAX (2000) per scenario and LOAD_IN_FLIGHT (100)
# waiting at once. The Pods select a
# node label no node has, so they are admitted (or not) and never run; they are deleted after
# each scenario.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
: "${KUBECONFIG:?run through scripts/cluster.sh exec}" "${REGISTRY:?}" "${IVORY_CLUSTER_DIR:?}"
STATE="$IVORY_CLUSTER_DIR"
# shellcheck source=scripts/lib/needs.sh
source "$ROOT/scripts/lib/needs.sh"
needs_pkgs curl:curl jq:jq conntrack:conntrack gawk:gawk pgrep:procps nproc:coreutils
needs_cmds kubectl
needs_done

OUT="${MATRIX_OUT:-$ROOT/target/cluster}"
RAW="$OUT/matrix"
API="https://10.201.0.1:6443"
NS=ivory-system
LOAD_NS=load
RATE="${LOAD_RATE:-10}"
PERIOD="$(awk -v r="$RATE" 'BEGIN { printf "%.3f", 1 / r }')"
MAX="${LOAD_MAX:-2000}"
IN_FLIGHT="${LOAD_IN_FLIGHT:-100}"
# An answer later than the webhooks' timeoutSeconds (read in main) is the API server's timeout,
# not ivory's.
LATE_AFTER=10
CURL_AUTH=(--cert "$STATE/pki/admin.crt" --key "$STATE/pki/admin.key" --cacert "$STATE/pki/ca.crt")

log() { echo "[matrix.sh $(date -u +%H:%M:%S)] $*" >&2; }
now() { date +%s.%N; }

pod_json() {
  jq -nc --arg image "$REGISTRY/demo/$1:v1" '{apiVersion: "v1", kind: "Pod",
    metadata: {generateName: "load-", labels: {load: "matrix"}},
    spec: {nodeSelector: {"ivory.test/never": "true"}, terminationGracePeriodSeconds: 0,
      containers: [{name: "main", image: $image}]}}'
}

# send KIND FILE: one Pod creation; appends one line: start time, image kind, HTTP status,
# seconds, the API server's message (one write, so lines of concurrent senders do not mix).
send() {
  local kind="$1" file="$2" start res body msg
  body="$(mktemp)"
  start="$(now)"
  res="$(curl -sS -o "$body" -w '%{http_code} %{time_total}' --max-time 40 "${CURL_AUTH[@]}" \
    -H 'Content-Type: application/json' --data-binary "${PAYLOAD[$kind]}" \
    "$API/api/v1/namespaces/$LOAD_NS/pods" 2>/dev/null)" || res="${res:-000 0}"
  msg="$(jq -r '.message // empty' "$body" 2>/dev/null | tr '\t\n' '  ' | cut -c1-400 || true)"
  rm -f "$body"
  printf '%s\t%s\t%s\t%s\t%s\n' "$start" "$kind" "${res% *}" "${res#* }" "$msg" >>"$file"
}

# load FILE STOPFILE: an open loop (a slow answer does not slow the stream, as with the
# controllers of a real cluster): a Pod creation every 1/LOAD_RATE s, signed and unsigned in
# turn, until STOPFILE exists or LOAD_MAX were sent; at most LOAD_IN_FLIGHT wait at once.
load() {
  local file="$1" stop="$2" i=0 kind
  while [ ! -e "$stop" ] && [ "$i" -lt "$MAX" ]; do
    kind=signed; [ $((i % 2)) = 0 ] || kind=unsigned
    while [ "$(jobs -pr | wc -l)" -ge "$IN_FLIGHT" ]; do wait -n || true; done
    send "$kind" "$file" &
    i=$((i + 1))
    sleep "$PERIOD"
  done
  wait
}

# scenario NAME DESCRIPTION FAULT_FUNCTION: 5 s of load, the fault (timed), 15 s more load.
scenario() {
  local name="$1" what="$2" fault="$3" file="$RAW/$1.tsv" stop="$RAW/$1.stop" loader t0 t1
  rm -f "$file" "$stop"; : >"$file"
  log "scenario $name: $what"
  load "$file" "$stop" &
  loader=$!
  sleep 5
  t0="$(now)"
  if ! "$fault" >"$RAW/$name.fault.log" 2>&1; then
    log "the fault step of $name did not go as expected (see $RAW/$name.fault.log)"
    echo "$name" >>"$RAW/fault-failures"
  fi
  t1="$(now)"
  sleep 15
  touch "$stop"
  wait "$loader"
  printf '%s\t%s\t%s\n' "$name" "$t0" "$t1" >>"$RAW/faults.tsv"
  printf '%s\t%s\n' "$name" "$what" >>"$RAW/descriptions.tsv"
  kubectl -n "$LOAD_NS" delete pods -l load=matrix --wait=false >/dev/null 2>&1 || true
}

ivory_pods() { kubectl -n "$NS" get pods -l app.kubernetes.io/name=ivory -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.podIP}{"\n"}{end}'; }
wait_ivory_ready() {
  kubectl -n "$NS" rollout status deployment/ivory --timeout=300s
  kubectl -n "$NS" wait --for=condition=Available deployment/ivory --timeout=300s
}

fault_baseline() { sleep 20; }

fault_rollout() {
  kubectl -n "$NS" rollout restart deployment/ivory
  wait_ivory_ready
}

# The API server holds one HTTP/2 connection to the webhook Service; conntrack names the Pod it
# went to. That replica is the worst one to kill: its in-flight requests die with it.
target_pod() {
  local svc_ip pod_ip pod
  svc_ip="$(kubectl -n "$NS" get service ivory -o jsonpath='{.spec.clusterIP}')"
  pod_ip="$(conntrack -L -p tcp --orig-dst "$svc_ip" --state ESTABLISHED 2>/dev/null |
    sed -n 's/.*src=[0-9.]* dst=[0-9.]* sport=[0-9]* dport=[0-9]* src=\([0-9.]*\) .*/\1/p' | head -n 1)"
  pod="$(ivory_pods | awk -v ip="$pod_ip" '$2 == ip {print $1}')"
  [ -n "$pod" ] || pod="$(ivory_pods | awk 'NR == 1 {print $1}')"
  echo "$pod $pod_ip"
}

# ivory_pids POD: the ivory processes of POD (its cgroup names the Pod's UID), parent first.
ivory_pids() {
  local uid p
  uid="$(kubectl -n "$NS" get pod "$1" -o jsonpath='{.metadata.uid}')"
  for p in $(pgrep -x ivory); do
    if grep -q "${uid//-/_}\|$uid" "/proc/$p/cgroup" 2>/dev/null; then echo "$p"; fi
  done | sort -n
}

# kill_replica WHICH: SIGKILL to the serving process (`serving`: the one doing the work, which
# the OOM killer and crashes end; the chart's --supervise parent then starts another on the
# same socket) or to the container's main process (`main`: the whole container goes, as with
# `kill -9 1` or a runtime kill), until both replicas are Ready again.
kill_replica() {
  local pod ip pids pid
  read -r pod ip <<<"$(target_pod)"
  mapfile -t pids < <(ivory_pids "$pod")
  [ ${#pids[@]} -gt 0 ] || { echo "no ivory process of Pod $pod"; return 1; }
  if [ "$1" = main ]; then pid="${pids[0]}"; else pid="${pids[${#pids[@]} - 1]}"; fi
  echo "SIGKILL to pid $pid ($1 process; processes of the Pod: ${pids[*]}): Pod $pod ($ip), the one the API server's connection went to"
  kill -KILL "$pid"
  sleep 2
  wait_ivory_ready
  kubectl -n "$NS" get pods -l app.kubernetes.io/name=ivory -o wide
  echo "processes of $pod now: $(ivory_pids "$pod" | tr '\n' ' ')"
}
fault_sigkill() { kill_replica serving; }
fault_sigkill_main() { kill_replica main; }

# kubectl drain without the cordon (a one-node cluster would have nowhere to put the
# replacements): each Pod through the Eviction API, retried while the PDB refuses it.
fault_evict() {
  local pod code deadline
  for pod in $(ivory_pods | awk '{print $1}'); do
    deadline=$((SECONDS + 240))
    while :; do
      code="$(curl -sS -o /dev/null -w '%{http_code}' "${CURL_AUTH[@]}" -H 'Content-Type: application/json' \
        --data-binary "{\"apiVersion\":\"policy/v1\",\"kind\":\"Eviction\",\"metadata\":{\"name\":\"$pod\",\"namespace\":\"$NS\"}}" \
        "$API/api/v1/namespaces/$NS/pods/$pod/eviction")"
      echo "$(date -u +%T) evict $pod: $code"
      [ "$code" = 201 ] && break
      [ "$SECONDS" -lt "$deadline" ] || { echo "$pod not evicted in 240 s"; return 1; }
      sleep 1
    done
  done
  wait_ivory_ready
}

# After the restart, each replica's policy watch must have listed again (it logs the set it
# published): a replica whose watch had silently ended would serve a stale policy set forever.
fault_apiserver() {
  local restarted pod deadline
  restarted="$(date -u +%Y-%m-%dT%H:%M:%S)"
  "$ROOT/scripts/cluster.sh" restart kube-apiserver
  for pod in $(ivory_pods | awk '{print $1}'); do
    deadline=$((SECONDS + 120))
    # Read whole, then searched: `kubectl logs | grep -q` fails under pipefail when grep stops
    # reading before kubectl has written everything (SIGPIPE).
    until grep -q 'policies from Kubernetes published' \
        <<<"$(kubectl -n "$NS" logs "$pod" --since-time="${restarted}Z" 2>/dev/null)"; do
      [ "$SECONDS" -lt "$deadline" ] || { echo "$pod: no policy list after the restart in 120 s"; return 1; }
      sleep 2
    done
    echo "$pod: policy watch listed again after the restart"
  done
}

fault_registry() {
  "$ROOT/scripts/cluster.sh" registry block
  sleep 30
  "$ROOT/scripts/cluster.sh" registry unblock
}

# report: one row per scenario from the raw answers.
report() {
  {
    echo "# Failures under load ($(date -u +%F), scripts/cluster/matrix.sh)"
    echo
    echo "ivory $(kubectl -n "$NS" get deployment ivory -o jsonpath='{.spec.template.spec.containers[0].image}'),"
    echo "$(kubectl -n "$NS" get deployment ivory -o jsonpath='{.spec.replicas}') replicas, chart defaults otherwise; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "on $(nproc) cores."
    echo "Load: $RATE Pod creations a second (signed and unsigned images by tag, in turn) from 5 s before"
    echo "the fault until 15 s after it ended. Columns: *failed* = the API server did not get ivory's"
    echo "judgement (webhook unreachable, or ivory denied because it could not judge in time: the"
    echo "policy's failurePolicy Fail); *late* = answered after the webhook's ${LATE_AFTER} s timeout;"
    echo "*wrong* = an unsigned image admitted or a signed one denied on its merits; *API down* = the"
    echo "API server itself did not answer; *recovered after* = from the fault's start to the last"
    echo "answer that was not right."
    echo
    echo "| scenario | fault took | requests | admitted (signed) | denied (unsigned) | failed | late | wrong | API down | p50 / p99 / max latency | recovered after |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    while IFS=$'\t' read -r name t0 t1; do
      gawk -F'\t' -v name="$name" -v t0="$t0" -v t1="$t1" -v late="$LATE_AFTER" -f "$ROOT/scripts/cluster/matrix-row.awk" "$RAW/$name.tsv"
    done <"$RAW/faults.tsv"
    echo
    echo "What each scenario did:"
    echo
    while IFS=$'\t' read -r name what; do echo "* **$name**: $what"; done <"$RAW/descriptions.tsv"
    echo
    if [ -s "$RAW/fault-failures" ]; then
      echo "**Fault steps that did not go as expected** (their logs are in $RAW): $(tr '\n' ' ' <"$RAW/fault-failures")"
      echo
    fi
    echo "Messages of answers that were not right, per scenario (first of each kind):"
    echo
    while IFS=$'\t' read -r name _ _; do
      gawk -F'\t' -v name="$name" -v late="$LATE_AFTER" -v list=1 -v t0=0 -v t1=0 \
        -f "$ROOT/scripts/cluster/matrix-row.awk" "$RAW/$name.tsv" | head -n 6
    done <"$RAW/faults.tsv"
  } >"$OUT/matrix.md"
}

main() {
  mkdir -p "$RAW"
  rm -f "$RAW"/*
  LATE_AFTER="$(kubectl get validatingwebhookconfigurations -o json |
    jq '[.items[].webhooks[] | select(.clientConfig.service.namespace == "'"$NS"'") | .timeoutSeconds] | max // 10')"
  declare -gA PAYLOAD=([signed]="$(pod_json signed)" [unsigned]="$(pod_json unsigned)")
  kubectl create namespace "$LOAD_NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  local all=(baseline rollout sigkill sigkill sigkill sigkill-main evict apiserver registry)
  [ $# -gt 0 ] && all=("$@")
  local s n ran=""
  for s in "${all[@]}"; do
    # A scenario named twice (e.g. sigkill sigkill sigkill) runs again as sigkill-2, sigkill-3.
    ran="$ran $s"
    n="$(tr ' ' '\n' <<<"$ran" | grep -cx "$s")"
    SUFFIX=""; [ "$n" -gt 1 ] && SUFFIX="-$n"
    case "$s" in
      baseline) scenario "baseline$SUFFIX" "no fault: 20 s of load" fault_baseline ;;
      rollout) scenario "rollout$SUFFIX" "kubectl rollout restart deployment/ivory, until the rollout is complete" fault_rollout ;;
      sigkill) scenario "sigkill$SUFFIX" "SIGKILL to the serving ivory process of the replica the API server's connection goes to (as the OOM killer or a crash ends it), until both replicas are Ready again" fault_sigkill ;;
      sigkill-main) scenario "sigkill-main$SUFFIX" "SIGKILL to the container's main process of the replica the API server's connection goes to (the whole container goes), until both replicas are Ready again" fault_sigkill_main ;;
      evict) scenario "evict$SUFFIX" "every ivory Pod evicted through the Eviction API (retried while the PodDisruptionBudget refuses), until the replacements are Ready" fault_evict ;;
      apiserver) scenario "apiserver$SUFFIX" "the kube-apiserver stopped (SIGTERM) and started again, until /readyz answers" fault_apiserver ;;
      registry) scenario "registry$SUFFIX" "every packet to the registry dropped for 30 s (iptables DROP in the cluster's namespace)" fault_registry ;;
      *) log "unknown scenario $s"; exit 2 ;;
    esac
  done
  report
  cat "$OUT/matrix.md"
  if [ -s "$RAW/fault-failures" ]; then
    log "fault steps that did not go as expected: $(tr '\n' ' ' <"$RAW/fault-failures")(logs in $RAW)"
    exit 1
  fi
}

main "$@"
