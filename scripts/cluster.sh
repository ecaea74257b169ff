#!/usr/bin/env bash
# A one-node Kubernetes cluster from real parts, all of it inside a network namespace of its own:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy (iptables mode),
# kubelet + containerd + runc, a CNI bridge pod network and a TLS Distribution registry that
# containerd pulls from. See docs/CLUSTER.md.
#
#   scripts/cluster.sh up          start it (builds the Kubernetes binaries first when missing)
#   scripts/cluster.sh down        stop everything it started and remove the namespace
#   scripts/cluster.sh status      what runs, the node and the Pods
#   scripts/cluster.sh kubectl …   kubectl against the cluster (run inside the namespace)
#   scripts/cluster.sh exec CMD …  any command inside the namespace, with KUBECONFIG, REGISTRY,
#                                  SSL_CERT_FILE (the cluster CA) and PATH (.tools/bin, kubectl)
#   scripts/cluster.sh restart kube-apiserver    stop the API server (TERM) and start it again
#                                  (with the static registration's AdmissionConfiguration, when
#                                  scripts/cluster/static.sh has written it)
#   scripts/cluster.sh registry block|unblock    drop / let through packets to the registry
#
# State (certificates, logs, data) lives in IVORY_CLUSTER_DIR (default ~/.cache/ivory-cluster);
# Kubernetes binaries come from scripts/e2e/build.sh's cache (IVORY_E2E_CACHE). Needs root.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/e2e/versions.sh
source "$ROOT/scripts/e2e/versions.sh"
# shellcheck source=scripts/lib/needs.sh
source "$ROOT/scripts/lib/needs.sh"
# The CNI plugins are not on PATH: their bridge plugin's path stands for the package. crane pushes
# the base images; helm and kustomize are for scripts/cluster/ivory.sh (nothing can be downloaded
# inside the
# namespace, so both are built here).
needs_pkgs containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins \
  iptables:iptables conntrack:conntrack ip:iproute2 docker-registry:docker-registry \
  openssl:openssl busybox:busybox-static curl:curl jq:jq nsenter:util-linux gawk:gawk pgrep:procps
needs_tools crane helm kustomize
needs_done
CACHE="${IVORY_E2E_CACHE:-$HOME/.cache/ivory-e2e}"
BIN="$CACHE/bin"
STATE="${IVORY_CLUSTER_DIR:-$HOME/.cache/ivory-cluster}"
NS="${IVORY_CLUSTER_NETNS:-ivory-cluster}"
CG="${IVORY_CLUSTER_CGROUP:-ivory-cluster}"
TOOLS="$ROOT/.tools/bin"

# The namespace's addresses exist only inside it: nothing routes them anywhere else.
NODE_NAME=ivory-node
NODE_IP=10.201.0.1
POD_CIDR=10.202.0.0/24
POD_GW=10.202.0.1
SVC_CIDR=10.203.0.0/24
SVC_API=10.203.0.1
REGISTRY="$NODE_IP:5000"
API_PORT=6443
READY_TIMEOUT="${IVORY_CLUSTER_READY_TIMEOUT:-180}"

COMPONENTS="registry containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy"

log() { echo "[cluster $(date -u +%H:%M:%S)] $*" >&2; }
die() { echo "cluster.sh: $*" >&2; exit 1; }

# --- prerequisites ---------------------------------------------------------------------------

need_root() {
  [ "$(id -u)" = 0 ] || die "cannot run: needs root (network namespace, cgroups, containerd)"
}


build_binaries() {
  local absent=0
  for c in etcd kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do
    [ -x "$BIN/$c" ] || absent=1
  done
  if [ "$absent" = 1 ]; then
    command -v go >/dev/null || die "cannot run: Kubernetes binaries missing in $BIN and no go command to build them"
    nice "$ROOT/scripts/e2e/build.sh" cluster
  fi
}

# --- helpers ---------------------------------------------------------------------------------

holder_pid() { cat "$STATE/run/holder.pid" 2>/dev/null; }

# Runs a command inside the cluster's network namespace (the machine's file system as it is).
in_ns() { nsenter --net="/run/netns/$NS" -- "$@"; }

# The cgroup v1 hierarchies (and the v2 one when mounted) the cluster's processes go into.
cgroup_dirs() {
  local d
  for d in /sys/fs/cgroup/*/; do
    [ -f "$d/cgroup.procs" ] && echo "${d%/}"
  done
  if [ -f /sys/fs/cgroup/cgroup.procs ]; then echo /sys/fs/cgroup; fi
}

make_cgroups() {
  local d sub
  for d in $(cgroup_dirs); do
    for sub in "$CG" "$CG/system"; do
      mkdir -p "$d/$sub"
      if [ -f "$d/$sub/cpuset.cpus" ] && [ -z "$(cat "$d/$sub/cpuset.cpus")" ]; then
        cat "$(dirname "$d/$sub")/cpuset.cpus" >"$d/$sub/cpuset.cpus"
        cat "$(dirname "$d/$sub")/cpuset.mems" >"$d/$sub/cpuset.mems"
      fi
    done
  done
}

# Every pid in the cluster's cgroups (its components, containerd's shims, the containers).
cgroup_pids() {
  local d
  for d in $(cgroup_dirs); do
    [ -d "$d/$CG" ] && find "$d/$CG" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -un
}

remove_cgroups() {
  local d
  for d in $(cgroup_dirs); do
    [ -d "$d/$CG" ] && find "$d/$CG" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  return 0
}

# spawn NAME CMD…: starts CMD inside the namespaces and the cluster's "system" cgroup, detached,
# logging to $STATE/logs/NAME.log; its pid goes to $STATE/run/NAME.pid.
spawn() {
  local name="$1"; shift
  # shellcheck disable=SC2016  # expanded by the inner shell
  setsid nsenter -t "$(holder_pid)" -m -n -- bash -c '
    for d in $1; do echo $$ >"$d/$2/system/cgroup.procs"; done
    shift 2
    exec "$@"' spawn "$(cgroup_dirs | tr '\n' ' ')" "$CG" "$@" \
    </dev/null >"$STATE/logs/$name.log" 2>&1 &
  echo $! >"$STATE/run/$name.pid"
}

alive() { local p; p="$(cat "$STATE/run/$1.pid" 2>/dev/null)" && kill -0 "$p" 2>/dev/null; }

# wait_for WHAT SECONDS CMD…: until CMD succeeds; fails (with the component's log) when the
# component dies or time runs out.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ -f "$STATE/run/$what.pid" ] && ! alive "$what"; then
      tail -n 30 "$STATE/logs/$what.log" >&2
      die "$what exited during start-up (log: $STATE/logs/$what.log; scripts/cluster.sh down stops the rest)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 30 "$STATE/logs/$what.log" >&2 || true
      die "$what not ready after ${secs}s (log: $STATE/logs/$what.log; scripts/cluster.sh down stops the rest)"
    fi
    sleep 1
  done
}

crane_ns() { in_ns env SSL_CERT_FILE="$STATE/pki/ca.crt" "$TOOLS/crane" "$@"; }

# kubectl's and helm's caches stay in the state folder too.
client_env() {
  echo KUBECONFIG="$STATE/admin.kubeconfig" KUBECACHEDIR="$STATE/client/kube-cache" \
    HELM_CACHE_HOME="$STATE/client/helm-cache" HELM_CONFIG_HOME="$STATE/client/helm-config" \
    HELM_DATA_HOME="$STATE/client/helm-data"
}

# shellcheck disable=SC2046  # client_env prints NAME=VALUE words without spaces
kubectl_ns() { in_ns env $(client_env) "$BIN/kubectl" "$@"; }

# --- certificates ----------------------------------------------------------------------------

# cert NAME SUBJECT EXT: a P-256 key (PKCS#8) and a certificate signed by the cluster CA.
cert() {
  local name="$1" subj="$2" ext="$3" pki="$STATE/pki"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$subj" \
    -keyout "$pki/$name.key.sec1" -out "$pki/$name.csr" 2>/dev/null
  openssl pkcs8 -topk8 -nocrypt -in "$pki/$name.key.sec1" -out "$pki/$name.key"
  rm -f "$pki/$name.key.sec1"
  printf '%b' "$ext" >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
}

gen_certs() {
  local pki="$STATE/pki" client='extendedKeyUsage=clientAuth\n'
  mkdir -p "$pki"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=ivory-cluster-ca" -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" "subjectAltName=IP:$NODE_IP,IP:127.0.0.1,IP:$SVC_API,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n"
  cert registry "/CN=ivory-cluster-registry" "subjectAltName=IP:$NODE_IP\nextendedKeyUsage=serverAuth\n"
  cert admin "/O=system:masters/CN=admin" "$client"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
  cert controller-manager "/CN=system:kube-controller-manager" "$client"
  cert scheduler "/CN=system:kube-scheduler" "$client"
  cert kube-proxy "/CN=system:kube-proxy" "$client"
  cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "$client"
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key" 2>/dev/null
  openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
}

# kubeconfig NAME USER: $STATE/NAME.kubeconfig with USER's client certificate.
kubeconfig() {
  local pki="$STATE/pki"
  cat >"$STATE/$1.kubeconfig" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: ivory-cluster
  cluster:
    server: https://$NODE_IP:$API_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $pki/$2.crt
    client-key: $pki/$2.key
contexts:
- name: ivory-cluster
  context:
    cluster: ivory-cluster
    user: $2
current-context: ivory-cluster
KCFG
}

# --- the namespaces --------------------------------------------------------------------------

# The network namespace: loopback, which also holds the node address, and later the CNI bridge.
# No veth, no default route and no NAT to the host: nothing inside can reach outside (a
# connection to any other address fails at once with "network is unreachable").
# A holder process keeps a private mount namespace in which the cluster runs: a sysfs of the
# network namespace (with the host's cgroup mounts bound back in) and fixed values over the
# kernel sysctls the kubelet insists on (vm.overcommit_memory, kernel.panic, …), so it does not
# change them for the whole machine.
make_namespaces() {
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip -n "$NS" addr add "$NODE_IP/32" dev lo
  # Connections from the namespace itself (the API server calling a webhook Service) need a route
  # to the service range before kube-proxy's OUTPUT rules rewrite them to a Pod address.
  ip -n "$NS" route add "$SVC_CIDR" dev lo src "$NODE_IP"

  local sys="$STATE/sysctl"
  mkdir -p "$sys"
  echo 1 >"$sys/overcommit_memory"; echo 0 >"$sys/panic_on_oom"; echo 10 >"$sys/panic"
  echo 1 >"$sys/panic_on_oops"; echo 1000000 >"$sys/root_maxkeys"; echo 25000000 >"$sys/root_maxbytes"
  cat >"$STATE/run/holder.sh" <<'HOLDER'
set -eu
state="$1"
stage="$state/run/cgroup-stage"
mkdir -p "$stage"
mount --rbind /sys/fs/cgroup "$stage"
mount -t sysfs sysfs /sys
mount --rbind "$stage" /sys/fs/cgroup
umount -l "$stage"
# Paths the kubelet, containerd and the CNI plugins write to whatever their configuration says
# (/var/lib/kubelet/device-plugins, /var/log/containers, libcni's cache, containerd's shim
# sockets in /run/containerd/s, pod network namespaces): private copies from the state folder.
# A mount point missing on the machine is made (an empty folder) and listed for `down` to remove.
for p in /run /var/lib/kubelet /var/lib/cni /var/log/containers; do
  if [ ! -d "$p" ]; then echo "$p" >>"$state/run/made-dirs"; mkdir -p "$p"; fi
  private="$state/host${p//\//-}"
  mkdir -p "$private"
  mount --bind "$private" "$p"
done
for f in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops \
         kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
  mount --bind "$state/sysctl/${f##*/}" "/proc/sys/$f"
done
touch "$state/run/holder.ready"
exec sleep 2147483647
HOLDER
  setsid nsenter --net="/run/netns/$NS" -- unshare --mount --propagation private -- \
    bash "$STATE/run/holder.sh" "$STATE" </dev/null >"$STATE/logs/holder.log" 2>&1 &
  echo $! >"$STATE/run/holder.pid"
  wait_for holder 10 test -f "$STATE/run/holder.ready"
  for d in $(cgroup_dirs); do holder_pid >"$d/$CG/system/cgroup.procs"; done
}

# --- components ------------------------------------------------------------------------------

start_registry() {
  mkdir -p "$STATE/registry"
  cat >"$STATE/registry.yml" <<YML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE/registry
  delete:
    enabled: true
http:
  addr: $REGISTRY
  secret: ivory-cluster
  # Its request counter (registry_http_requests_total), for the audit's requests per image.
  debug:
    addr: $NODE_IP:5001
    prometheus:
      enabled: true
      path: /metrics
  tls:
    certificate: $STATE/pki/registry.crt
    key: $STATE/pki/registry.key
YML
  spawn registry docker-registry serve "$STATE/registry.yml"
  wait_for registry 30 in_ns curl -fsS --cacert "$STATE/pki/ca.crt" "https://$REGISTRY/v2/"
}

# A static busybox (Debian's busybox-static) as a one-layer OCI image, pushed twice: busybox:1
# (Cmd sh) and pause:1 (sleeps; the Pod sandbox image, since registry.k8s.io is out of reach).
push_base_images() {
  local work="$STATE/images/busybox"
  rm -rf "$work"; mkdir -p "$work/rootfs/bin" "$work/rootfs/tmp" "$work/rootfs/etc"
  cp /bin/busybox "$work/rootfs/bin/busybox"
  for a in sh sleep httpd echo cat ls wget nc env id; do ln -s busybox "$work/rootfs/bin/$a"; done
  echo 'nobody:x:65534:65534:nobody:/:/bin/sh' >"$work/rootfs/etc/passwd"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/rootfs" -czf "$work/layer.tar.gz" .
  {
    crane_ns append --oci-empty-base -f "$work/layer.tar.gz" -t "$REGISTRY/library/busybox:base"
    crane_ns mutate "$REGISTRY/library/busybox:base" --cmd sh --env PATH=/bin -t "$REGISTRY/library/busybox:1"
    crane_ns mutate "$REGISTRY/library/busybox:base" --entrypoint /bin/sleep,2147483647 --env PATH=/bin \
      -t "$REGISTRY/library/pause:1"
  } >/dev/null 2>>"$STATE/logs/crane.log"
}

start_containerd() {
  local c="$STATE/containerd"
  mkdir -p "$c/root" "$c/state" "$c/certs.d/$REGISTRY" "$STATE/cni/net.d" "$STATE/cni/ipam"
  cat >"$c/certs.d/$REGISTRY/hosts.toml" <<TOML
server = "https://$REGISTRY"

[host."https://$REGISTRY"]
  capabilities = ["pull", "resolve"]
  ca = "$STATE/pki/ca.crt"
TOML
  cat >"$STATE/cni/net.d/10-ivory.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "ivory-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GW"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  cat >"$c/config.toml" <<TOML
version = 2
root = "$c/root"
state = "$c/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$c/containerd.sock"

[ttrpc]
  address = "$c/containerd.sock.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$REGISTRY/library/pause:1"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  # Pod network namespaces are bind mounts in the cluster's private mount namespace: keep their
  # files under the state folder, not in the machine's /run/netns (where they would stay behind
  # as empty files).
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$c/certs.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "runc"
        Root = "$c/runc"
        SystemdCgroup = false
TOML
  spawn containerd containerd --config "$c/config.toml"
  wait_for containerd 30 test -S "$c/containerd.sock"
}

start_etcd() {
  spawn etcd "$BIN/etcd" --name ivory-cluster --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster ivory-cluster=http://127.0.0.1:2380 --unsafe-no-fsync --log-level warn
}

# The static registration's AdmissionConfiguration (scripts/cluster/static.sh writes it with
# `ivory webhooks --static`): when it exists, the API server reads it at every (re)start.
STATIC_ADMISSION="$STATE/static-webhooks/admission-configuration.yaml"

start_apiserver() {
  local pki="$STATE/pki" extra=()
  if [ -f "$STATIC_ADMISSION" ]; then extra+=(--admission-control-config-file "$STATIC_ADMISSION"); fi
  spawn kube-apiserver "$BIN/kube-apiserver" \
    --bind-address 0.0.0.0 --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
    --etcd-servers http://127.0.0.1:2379 \
    --cert-dir "$STATE/apiserver-certs" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range "$SVC_CIDR" \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction \
    --allow-privileged=true \
    --audit-log-path "$STATE/logs/audit.log" --audit-policy-file "$STATE/audit-policy.yaml" \
    --profiling=false "${extra[@]}"
}

start_controllers() {
  local pki="$STATE/pki"
  spawn kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$STATE/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$STATE/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$STATE/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-name ivory-cluster --allocate-node-cidrs=false --profiling=false
  spawn kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig "$STATE/scheduler.kubeconfig" \
    --authentication-kubeconfig "$STATE/scheduler.kubeconfig" \
    --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --leader-elect=false --profiling=false
}

start_kubelet() {
  mkdir -p "$STATE/kubelet" "$STATE/pod-logs"
  : >"$STATE/resolv.conf"
  cat >"$STATE/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$STATE/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$CG
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: true
podLogsDir: $STATE/pod-logs
volumePluginDir: $STATE/kubelet/volume-plugins
resolvConf: $STATE/resolv.conf
serializeImagePulls: false
maxPods: 40
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
YAML
  spawn kubelet "$BIN/kubelet" --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/kubelet.kubeconfig" \
    --root-dir "$STATE/kubelet" --cert-dir "$STATE/kubelet/pki" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v 1
}

start_kube_proxy() {
  cat >"$STATE/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [primary]
# 0: leave the (global) conntrack table size and timeouts as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
  spawn kube-proxy "$BIN/kube-proxy" --config "$STATE/kube-proxy.yaml"
}

write_audit_policy() {
  cat >"$STATE/audit-policy.yaml" <<'YAML'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    resources: [{group: coordination.k8s.io, resources: [leases]}, {group: "", resources: [events]}]
  - level: Metadata
YAML
}

# --- commands --------------------------------------------------------------------------------

up() {
  need_root
  build_binaries
  if [ -f "$STATE/run/holder.pid" ] || [ -e "/run/netns/$NS" ]; then
    die "a cluster is up already (or was not torn down): run scripts/cluster.sh down"
  fi
  local started=$SECONDS
  rm -rf "$STATE"
  mkdir -p "$STATE/run" "$STATE/logs"
  log "certificates"
  gen_certs
  kubeconfig admin admin
  kubeconfig controller-manager controller-manager
  kubeconfig scheduler scheduler
  kubeconfig kube-proxy kube-proxy
  kubeconfig kubelet kubelet
  write_audit_policy
  log "network namespace $NS, cgroup /$CG"
  make_cgroups
  make_namespaces
  log "registry https://$REGISTRY"
  start_registry
  push_base_images
  log "containerd, etcd, kube-apiserver"
  start_containerd
  start_etcd
  start_apiserver
  wait_for kube-apiserver "$READY_TIMEOUT" kubectl_ns get --raw /readyz
  log "kube-controller-manager, kube-scheduler, kubelet, kube-proxy"
  start_controllers
  start_kubelet
  start_kube_proxy
  wait_for kubelet "$READY_TIMEOUT" kubectl_ns wait --for=condition=Ready "node/$NODE_NAME" --timeout=5s
  wait_for kube-controller-manager 60 kubectl_ns get serviceaccount default -n default
  log "up in $((SECONDS - started))s: scripts/cluster.sh kubectl get nodes; registry $REGISTRY (inside the namespace)"
}

down() {
  local started=$SECONDS name pid
  # A throwaway cluster: no Pod is drained. The components get TERM (KILL after 5 s: etcd and the
  # API server take longer to end their watches, for nothing here); the
  # containers and containerd's shims are killed with whatever else is left in the cgroups.
  local pids=()
  for name in $COMPONENTS; do
    pid="$(cat "$STATE/run/$name.pid" 2>/dev/null)" || continue
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$STATE/run/$name.pid"
  done
  for _ in $(seq 1 50); do
    local left=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  # What is left in the cluster's cgroups: containerd's shims and their containers.
  for pid in $(cgroup_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  pid="$(holder_pid || true)"
  if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; rm -f "$STATE/run/holder.pid" "$STATE/run/holder.ready"; fi
  for _ in $(seq 1 50); do [ -z "$(cgroup_pids)" ] && break; sleep 0.1; done
  remove_cgroups
  if [ -e "/run/netns/$NS" ]; then ip netns del "$NS"; fi
  if [ -f "$STATE/run/made-dirs" ]; then
    while read -r d; do rmdir "$d" 2>/dev/null || true; done <"$STATE/run/made-dirs"
    rm -f "$STATE/run/made-dirs"
  fi
  log "down in $((SECONDS - started))s (logs kept in $STATE/logs)"
}

# restart_apiserver: TERM (KILL after 10 s), start it again with the same flags, wait for /readyz.
# Its log of the previous run is kept as kube-apiserver.log.1; the audit log is appended to.
restart_apiserver() {
  local pid
  pid="$(cat "$STATE/run/kube-apiserver.pid")" || die "the API server is not running"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  mv -f "$STATE/logs/kube-apiserver.log" "$STATE/logs/kube-apiserver.log.1"
  start_apiserver
  wait_for kube-apiserver "$READY_TIMEOUT" kubectl_ns get --raw /readyz
}

# registry block|unblock: a DROP rule for the registry's port in the namespace, so that its
# clients (ivory's Pods, containerd) see an unreachable registry: connections and packets of
# open connections vanish, nothing answers (worse than a refused connection).
REGISTRY_BLOCK=(INPUT -p tcp -d "$NODE_IP" --dport 5000 -m comment --comment ivory-cluster-registry-block -j DROP)
registry_block() {
  case "${1:-}" in
    block) in_ns iptables -C "${REGISTRY_BLOCK[@]}" 2>/dev/null || in_ns iptables -I "${REGISTRY_BLOCK[@]}" ;;
    unblock) while in_ns iptables -D "${REGISTRY_BLOCK[@]}" 2>/dev/null; do :; done ;;
    *) die "registry block|unblock" ;;
  esac
}

status() {
  local name
  for name in holder $COMPONENTS; do
    if alive "$name"; then echo "$name: running (pid $(cat "$STATE/run/$name.pid"))"; else echo "$name: stopped"; fi
  done
  if alive kube-apiserver; then kubectl_ns get nodes,pods -A -o wide; fi
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  up) up ;;
  down) need_root; down ;;
  status) status ;;
  kubectl) need_root; kubectl_ns "$@" ;;
  restart)
    need_root
    [ "${1:-}" = kube-apiserver ] || die "restart: only kube-apiserver can be restarted"
    restart_apiserver ;;
  registry) need_root; registry_block "$@" ;;
  exec)
    need_root
    # shellcheck disable=SC2046  # as in kubectl_ns
    in_ns env $(client_env) REGISTRY="$REGISTRY" SSL_CERT_FILE="$STATE/pki/ca.crt" \
      IVORY_CLUSTER_DIR="$STATE" PATH="$TOOLS:$BIN:$PATH" "$@" ;;
  _step) need_root; "$@" ;; # development: run internal steps one by one
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
