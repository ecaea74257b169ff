#!/usr/bin/env bash
# The sharded registry audit in the cluster of scripts/cluster.sh, after scripts/cluster/ivory.sh
# install (the ivory image in the registry, the cluster's cosign key):
#
#   scripts/cluster.sh exec scripts/cluster/audit.sh
#
# 1. scripts/cluster/audit-corpus.py pushes 5,001 images in 53 repositories under audit/ (two
#    hold 1,500 tags each; every third image signed with the cluster's key; audit/broken:v1
#    cannot be served: a registry error).
# 2. One process: `ivory audit --registry … --repository 'audit/*' -o json` on the node, timed.
# 3. Four shards: `ivory audit … --job audit-4 --job-shards 4` applied (an Indexed Job, the parts
#    on a hostPath PersistentVolume, verdicts shared through a Redis on the node); once shard 2
#    has written part of its work its process is killed (SIGKILL); the Job controller starts
#    the index again and it resumes. Timed from creation to completion.
# 4. `ivory audit --merge` of the parts equals the single process's report; the broken image is
#    an error in both, and in its shard's counts.
# Results (timings, images per second) go to target/cluster/audit/.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
: "${KUBECONFIG:?run through scripts/cluster.sh exec}" "${REGISTRY:?}" "${IVORY_CLUSTER_DIR:?}"
STATE="$IVORY_CLUSTER_DIR"
IVORY_BIN="${IVORY_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/ivory}"
# shellcheck source=scripts/lib/needs.sh
source "$ROOT/scripts/lib/needs.sh"
needs_pkgs jq:jq curl:curl redis-server:redis-server redis-cli:redis-tools python3:python3 pgrep:procps
needs_cmds kubectl
needs_done
# The corpus signs with the `cryptography` package (Debian's python3-cryptography).
python3 -c 'import cryptography' 2>/dev/null ||
  { echo "audit.sh: needs python3-cryptography (apt-get install python3-cryptography)" >&2; exit 1; }

NS=ivory-system
OUT="${MATRIX_OUT:-$ROOT/target/cluster}/audit"
WORK="$STATE/audit"
PARTS="$STATE/audit-parts"
NODE_IP="${REGISTRY%:*}"
REDIS_PORT=6391
SHARDS=4

log() { echo "[audit.sh $(date -u +%H:%M:%S)] $*" >&2; }
step() { log "\$ $*"; "$@"; }
fail() { log "UNEXPECTED: $*"; exit 1; }

corpus() {
  mkdir -p "$WORK" "$OUT"
  if [ ! -s "$WORK/images.tsv" ]; then
    local started=$SECONDS
    step python3 "$ROOT/scripts/cluster/audit-corpus.py" --registry "$REGISTRY" --ca "$SSL_CERT_FILE" \
      --key "$STATE/pki/cosign.key" --storage "$STATE/registry" --out "$WORK/images.tsv"
    log "corpus pushed in $((SECONDS - started)) s"
  fi
  "$ROOT/scripts/cluster/ivory.sh" policy "$REGISTRY/audit" "$STATE/pki/cosign.pub" audit-signed \
    >"$WORK/policy.yaml"
}

# The shared cache: a Redis on the node's address (the Pods reach it as they reach the
# registry), no persistence; its key in a Secret as the chart's sharedCache.keySecret.
redis() {
  if ! redis-cli -h "$NODE_IP" -p "$REDIS_PORT" ping >/dev/null 2>&1; then
    redis-server --bind "$NODE_IP" --port "$REDIS_PORT" --save '' --appendonly no \
      --protected-mode no --daemonize yes --pidfile "$STATE/run/audit-redis.pid" \
      --logfile "$STATE/logs/audit-redis.log"
    for _ in $(seq 1 50); do redis-cli -h "$NODE_IP" -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  [ -s "$WORK/cache.key" ] || head -c 48 /dev/urandom | base64 -w0 >"$WORK/cache.key"
  kubectl -n "$NS" create secret generic audit-cache-key --from-file=current="$WORK/cache.key" \
    --dry-run=client -o yaml | kubectl apply -f - >/dev/null
}

# The parts' volume: a hostPath PersistentVolume (one node) bound to the claim audit-parts.
volume() {
  mkdir -p "$PARTS"
  chmod 0777 "$PARTS"
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: ivory-audit-parts}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ivory-audit
  hostPath: {path: $PARTS, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: audit-parts, namespace: $NS}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: ivory-audit
  volumeName: ivory-audit-parts
  resources: {requests: {storage: 1Gi}}
YAML
}

# Requests the registry has answered so far (its Prometheus counter, scripts/cluster.sh's
# registry configuration).
registry_requests() {
  curl -fsS "http://$NODE_IP:5001/metrics" | awk '/^registry_http_requests_total/ { s += $NF } END { print s + 0 }'
}

audit_args() {
  echo --policy "$WORK/policy.yaml" --registry "$REGISTRY" --repository 'audit/*' \
    --registry-ca "$SSL_CERT_FILE" --max-images 20000 --timeout 60s
}

single() {
  local started before
  before="$(registry_requests)"
  started="$(date +%s.%N)"
  # shellcheck disable=SC2046 # one argument per word of audit_args
  "$IVORY_BIN" audit $(audit_args) --no-cache -o json >"$OUT/single.json" 2>"$OUT/single.stderr" || true
  SINGLE_SECONDS="$(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')"
  SINGLE_REQUESTS=$(($(registry_requests) - before))
  log "one process: $(tail -n 1 "$OUT/single.stderr") in $SINGLE_SECONDS s"
}

# kill_one_shard INDEX: waits until the shard's part holds 100 reports, then SIGKILLs its
# process (the container exits 137; restartPolicy Never: the Pod fails, the Job starts the
# index again).
kill_one_shard() {
  local part="$PARTS/audit-$SHARDS/shard-$1-of-$SHARDS.jsonl" deadline=$((SECONDS + 300)) pid
  # The part appears once the shard's Pod has started.
  until [ "$({ wc -l <"$part"; } 2>/dev/null || echo 0)" -ge 100 ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "shard $1 wrote no 100 reports in 300 s"
    sleep 0.2
  done
  pid="$(pgrep -f -- "--shard $1/$SHARDS" | head -n 1)"
  [ -n "$pid" ] || fail "no process of shard $1"
  log "shard $1 killed with $(wc -l <"$part") reports in its part (pid $pid)"
  kill -KILL "$pid"
}

sharded() {
  local image started before
  image="$(kubectl -n "$NS" get deployment ivory -o jsonpath='{.spec.template.spec.containers[0].image}')"
  redis-cli -h "$NODE_IP" -p "$REDIS_PORT" flushall >/dev/null
  kubectl -n "$NS" delete job "audit-$SHARDS" --ignore-not-found --wait=true >/dev/null
  rm -rf "${PARTS:?}/audit-$SHARDS"
  # shellcheck disable=SC2046
  "$IVORY_BIN" audit $(audit_args) --cache-redis "redis://$NODE_IP:$REDIS_PORT" \
    --cache-redis-key "$WORK/cache.key" --job "audit-$SHARDS" --job-shards "$SHARDS" \
    --job-image "$image" --job-namespace "$NS" --job-parts-claim audit-parts \
    --job-registry-ca-configmap registry-ca --job-cache-key-secret audit-cache-key >"$OUT/job.yaml"
  before="$(registry_requests)"
  started="$(date +%s.%N)"
  step kubectl apply -f "$OUT/job.yaml"
  kill_one_shard 2
  step kubectl -n "$NS" wait --for=condition=Complete "job/audit-$SHARDS" --timeout=900s
  SHARDED_SECONDS="$(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')"
  SHARDED_REQUESTS=$(($(registry_requests) - before))
  kubectl -n "$NS" get pods -l "app.kubernetes.io/instance=audit-$SHARDS" \
    -o custom-columns='POD:.metadata.name,INDEX:.metadata.annotations.batch\.kubernetes\.io/job-completion-index,PHASE:.status.phase' |
    tee "$OUT/pods.txt"
  [ "$(awk '$2 == 2 && $3 == "Failed"' "$OUT/pods.txt" | wc -l)" -ge 1 ] ||
    fail "the killed shard's Pod is not recorded as failed"
  log "$SHARDS shards (one killed and resumed): complete in $SHARDED_SECONDS s"
}

compare() {
  local code=0
  "$IVORY_BIN" audit --merge "$PARTS/audit-$SHARDS" -o json >"$OUT/merged.json" 2>"$OUT/merged.stderr" || code=$?
  cat "$OUT/merged.stderr" >&2
  [ "$code" = 2 ] || fail "the merge exited $code, not 2 (the broken image is an error)"
  cmp -s <(jq -S . "$OUT/single.json") <(jq -S . "$OUT/merged.json") ||
    fail "the merged report differs from the single process's: diff <(jq -S . $OUT/single.json) <(jq -S . $OUT/merged.json)"
  local broken
  broken="$(jq -r '.images[] | select(.image | endswith("audit/broken:v1")) | .verdict' "$OUT/merged.json")"
  [ "$broken" = error ] || fail "audit/broken:v1 is $broken, not error"
  grep -q ', 1 error$' "$OUT/merged.stderr" || fail "no shard reports the broken image's error"
  local images
  images="$(jq '.summary.images' "$OUT/merged.json")"
  log "merged = single process: $(jq -c .summary "$OUT/merged.json")"
  {
    echo "images $images"
    echo "single_seconds $SINGLE_SECONDS"
    echo "sharded_seconds $SHARDED_SECONDS"
    echo "single_registry_requests $SINGLE_REQUESTS"
    echo "sharded_registry_requests $SHARDED_REQUESTS"
    awk -v n="$images" -v s="$SINGLE_SECONDS" -v p="$SHARDED_SECONDS" -v rs="$SINGLE_REQUESTS" \
      -v rp="$SHARDED_REQUESTS" 'BEGIN {
        printf "single_images_per_second %.0f\nsharded_images_per_second %.0f\n", n / s, n / p
        printf "single_requests_per_image %.2f\nsharded_requests_per_image %.2f\n", rs / n, rp / n }'
  } | tee "$OUT/results.txt"
}

main() {
  corpus
  redis
  volume
  single
  sharded
  compare
  log "sharded audit: all steps passed"
}

main "$@"
