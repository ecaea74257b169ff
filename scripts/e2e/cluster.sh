#!/usr/bin/env bash
# Starts and stops the end-to-end test cluster: one etcd and one kube-apiserver on 127.0.0.1 (free
# ports), with a CA made here, a serving certificate, service-account keys and an admin client
# certificate (CN admin, O system:masters). No controller-manager, scheduler or kubelet: Pods are
# stored but never run, and the ServiceAccount admission plugin is off because nothing creates the
# `default` ServiceAccount.
#
#   cluster.sh start DIR   start a cluster whose files live in DIR; prints the env lines (see `env`)
#   cluster.sh stop DIR    stop it (DIR and its logs are kept)
#   cluster.sh env DIR     print KUBECONFIG=... and IVORY_E2E_* lines for a started cluster
#
# IVORY_E2E_ADMISSION_CONFIG=FILE starts the API server with --admission-control-config-file FILE
# (e.g. the AdmissionConfiguration `ivory webhooks --static` writes).
# With IVORY_E2E_OWNER_PID set, a watchdog stops the cluster and removes DIR once that process is
# gone (DIR is kept when IVORY_E2E_KEEP is non-empty), so a test process that exits without
# cleaning up leaves nothing running.
# Binaries come from scripts/e2e/build.sh's cache (IVORY_E2E_CACHE, default ~/.cache/ivory-e2e).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/e2e/versions.sh
source "$HERE/versions.sh"
# shellcheck source=scripts/lib/needs.sh
source "$HERE/../lib/needs.sh"
needs_pkgs openssl:openssl curl:curl ss:iproute2
needs_done
CACHE="${IVORY_E2E_CACHE:-$HOME/.cache/ivory-e2e}"
ETCD="$CACHE/bin/etcd-$ETCD_VERSION"
APISERVER="$CACHE/bin/kube-apiserver-$KUBE_VERSION"
READY_TIMEOUT="${IVORY_E2E_READY_TIMEOUT:-120}"

die() { echo "cluster.sh: $*" >&2; exit 1; }

# A port on 127.0.0.1 that no socket uses now, below the kernel's ephemeral range so that an
# outgoing connection cannot take it before the server binds (a later bind may still lose a
# race with another listener; the server then fails to start and says so in its log).
free_port() {
  local port low
  low="$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
  [ "$low" -gt 21000 ] || low=32768
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % (low - 20000)))
    if ! ss -Htan "sport = :$port" | grep -q . && ! grep -qx "$port" "$DIR/ports" 2>/dev/null; then
      echo "$port" >>"$DIR/ports"
      echo "$port"
      return
    fi
  done
  die "no free port found on 127.0.0.1"
}

gen_certs() {
  local pki="$DIR/pki"
  mkdir -p "$pki"
  (
    cd "$pki"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
      -subj "/CN=ivory-e2e-ca" -keyout ca.key -out ca.crt 2>/dev/null
    # Serving certificate of the API server.
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=kube-apiserver" \
      -keyout apiserver.key -out apiserver.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    # Admin client certificate: system:masters bypasses RBAC.
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/O=system:masters/CN=admin" \
      -keyout admin.key.sec1 -out admin.csr 2>/dev/null
    # PKCS#8, the key form every TLS client (rustls included) reads.
    openssl pkcs8 -topk8 -nocrypt -in admin.key.sec1 -out admin.key
    printf 'extendedKeyUsage=clientAuth\n' >admin.ext
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -extfile admin.ext -out admin.crt 2>/dev/null
    # Service-account token signing key pair.
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub
  )
}

write_kubeconfig() {
  local pki="$DIR/pki"
  b64() { base64 -w0 <"$1"; }
  cat >"$DIR/kubeconfig" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: ivory-e2e
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(b64 "$pki/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(b64 "$pki/admin.crt")
    client-key-data: $(b64 "$pki/admin.key")
contexts:
- name: ivory-e2e
  context:
    cluster: ivory-e2e
    user: admin
current-context: ivory-e2e
KCFG
}

# Starts "$@" detached (own session, no inherited stdio) and records its pid in $DIR/$name.pid.
spawn() {
  local name="$1"; shift
  setsid "$@" </dev/null >"$DIR/$name.log" 2>&1 &
  echo $! >"$DIR/$name.pid"
}

start_etcd() {
  local client peer
  client="$(free_port)"; peer="$(free_port)"
  ETCD_URL="http://127.0.0.1:$client"
  # --unsafe-no-fsync: a throwaway test store; fsync would only slow the tests down.
  spawn etcd "$ETCD" --name e2e --data-dir "$DIR/etcd-data" \
    --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "e2e=http://127.0.0.1:$peer" --unsafe-no-fsync --log-level warn
}

# The API server's audit log ($DIR/audit.log): Metadata for Pods and their subresources (the
# level that records admission webhooks' audit annotations), nothing else.
write_audit_policy() {
  cat >"$DIR/audit-policy.yaml" <<'YAML'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    resources:
      - group: ""
        resources: ["pods", "pods/ephemeralcontainers"]
  - level: None
YAML
}

start_apiserver() {
  local pki="$DIR/pki" extra=()
  APISERVER_PORT="$(free_port)"
  write_audit_policy
  if [ -n "${IVORY_E2E_ADMISSION_CONFIG:-}" ]; then
    extra+=(--admission-control-config-file "$IVORY_E2E_ADMISSION_CONFIG")
  fi
  # The service range is only an allocation range for Service objects: no traffic goes there.
  # No endpoint reconciler: it refuses a loopback advertise address, and nothing here needs the
  # `kubernetes` Service endpoints.
  spawn kube-apiserver "$APISERVER" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
    --endpoint-reconciler-type none \
    --etcd-servers "$ETCD_URL" \
    --cert-dir "$DIR/apiserver-certs" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --authorization-mode RBAC \
    --disable-admission-plugins ServiceAccount \
    --allow-privileged=true \
    --audit-policy-file "$DIR/audit-policy.yaml" --audit-log-path "$DIR/audit.log" \
    --audit-log-mode blocking \
    --profiling=false "${extra[@]}"
  echo "$APISERVER_PORT" >"$DIR/apiserver.port"
}

wait_ready() {
  local pki="$DIR/pki" deadline=$((SECONDS + READY_TIMEOUT))
  until curl -fsS --max-time 5 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT/readyz" >/dev/null 2>&1; do
    for name in etcd kube-apiserver; do
      kill -0 "$(cat "$DIR/$name.pid")" 2>/dev/null || {
        tail -n 30 "$DIR/$name.log" >&2
        stop_all
        die "$name exited during start-up (log: $DIR/$name.log)"
      }
    done
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 30 "$DIR/kube-apiserver.log" >&2
      stop_all
      die "kube-apiserver not ready after ${READY_TIMEOUT}s (log: $DIR/kube-apiserver.log)"
    fi
    sleep 0.5
  done
}

# Stops one recorded process: TERM, then KILL after 15 s.
stop_one() {
  local pidfile="$DIR/$1.pid" pid
  [ -f "$pidfile" ] || return 0
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

stop_all() {
  stop_one kube-apiserver
  stop_one etcd
  # An explicit stop ends the watchdog too; the watchdog's own stop must not end itself.
  if [ -z "${IVORY_E2E_FROM_WATCHDOG:-}" ]; then stop_one watchdog; fi
}

print_env() {
  [ -f "$DIR/apiserver.port" ] || die "no cluster started in $DIR"
  echo "export KUBECONFIG=$DIR/kubeconfig"
  echo "export IVORY_E2E_KUBECONFIG=$DIR/kubeconfig"
  echo "export IVORY_E2E_CA=$DIR/pki/ca.crt"
}

start_watchdog() {
  local owner="$1" self="$HERE/cluster.sh"
  # shellcheck disable=SC2016  # expanded by the watchdog's own shell
  setsid bash -c '
    while kill -0 "$1" 2>/dev/null; do sleep 1; done
    IVORY_E2E_FROM_WATCHDOG=1 "$2" stop "$3"
    [ -n "${IVORY_E2E_KEEP:-}" ] || rm -rf "$3"
  ' watchdog "$owner" "$self" "$DIR" </dev/null >/dev/null 2>&1 &
  echo $! >"$DIR/watchdog.pid"
}

cmd="${1:-}"
DIR="${2:-}"
if [ -z "$cmd" ] || [ -z "$DIR" ]; then die "usage: cluster.sh start|stop|env DIR"; fi

case "$cmd" in
  start)
    [ -x "$ETCD" ] || die "$ETCD is missing: run scripts/e2e/build.sh"
    [ -x "$APISERVER" ] || die "$APISERVER is missing: run scripts/e2e/build.sh"
    mkdir -p "$DIR"
    DIR="$(cd "$DIR" && pwd)"
    [ ! -f "$DIR/apiserver.port" ] || die "$DIR already holds a cluster; stop it or use another folder"
    gen_certs
    start_etcd
    start_apiserver
    write_kubeconfig
    wait_ready
    if [ -n "${IVORY_E2E_OWNER_PID:-}" ]; then start_watchdog "$IVORY_E2E_OWNER_PID"; fi
    print_env
    ;;
  stop)
    [ -d "$DIR" ] || exit 0
    DIR="$(cd "$DIR" && pwd)"
    stop_all
    rm -f "$DIR/apiserver.port"
    ;;
  env) DIR="$(cd "$DIR" && pwd)"; print_env ;;
  *) die "usage: cluster.sh start|stop|env DIR" ;;
esac
