#!/usr/bin/env bash
# Makes a private CA and a serving certificate for ivory's Service with openssl, writes the
# kubernetes.io/tls Secret manifest the Deployment mounts, and prints the CA bundle for
# `ivory webhooks --ca-bundle`. See README.md beside this script.
#
#   deploy/certs/make-certs.sh [--out DIR] [--namespace NS] [--service NAME] [--secret NAME] [--days N] [--ip IP]…
#
# --ip adds an IP address to the certificate (repeatable): the Service's fixed ClusterIP, which
# the static webhook manifests call (they can only name a URL).
set -euo pipefail

out=./ivory-certs
namespace=ivory-system
service=ivory
secret=ivory-tls
days=365
ca_days=3650
ips=()

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --namespace) namespace=$2; shift 2 ;;
    --service) service=$2; shift 2 ;;
    --secret) secret=$2; shift 2 ;;
    --days) days=$2; shift 2 ;;
    --ip) ips+=("$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "make-certs.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
command -v openssl >/dev/null || { echo "make-certs.sh: openssl is required" >&2; exit 1; }

mkdir -p "$out"
umask 077
host="$service.$namespace.svc"

# Keep an existing CA so re-running only renews the serving certificate (the webhooks' caBundle
# stays valid).
if [ ! -s "$out/ca.key" ] || [ ! -s "$out/ca.crt" ]; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$out/ca.key"
  openssl req -x509 -new -key "$out/ca.key" -sha256 -days "$ca_days" \
    -subj "/CN=ivory-webhook-ca" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$out/ca.crt"
fi

openssl ecparam -name prime256v1 -genkey -noout -out "$out/tls.key.ec"
# PKCS#8 ("BEGIN PRIVATE KEY"), which every TLS stack reads.
openssl pkcs8 -topk8 -nocrypt -in "$out/tls.key.ec" -out "$out/tls.key"
rm -f "$out/tls.key.ec"
openssl req -new -key "$out/tls.key" -subj "/CN=$host" -out "$out/tls.csr"
ip_sans=""
for ip in "${ips[@]}"; do ip_sans="$ip_sans,IP:$ip"; done
cat > "$out/tls.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$service,DNS:$service.$namespace,DNS:$host,DNS:$host.cluster.local$ip_sans
EXT
openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -days "$days" -sha256 -extfile "$out/tls.ext" -out "$out/tls.crt" 2>/dev/null
rm -f "$out/tls.csr" "$out/tls.ext"
openssl verify -CAfile "$out/ca.crt" "$out/tls.crt" >/dev/null

b64() { base64 < "$1" | tr -d '\n'; }
cat > "$out/secret.yaml" <<YAML
# Serving certificate for $host, made by deploy/certs/make-certs.sh. Contains a private key:
# do not commit it.
apiVersion: v1
kind: Secret
metadata:
  name: $secret
  namespace: $namespace
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$out/tls.crt")
  tls.key: $(b64 "$out/tls.key")
  ca.crt: $(b64 "$out/ca.crt")
YAML

echo "wrote $out/{ca.key,ca.crt,tls.key,tls.crt,secret.yaml} for $host (valid $days days)" >&2
echo "next: kubectl apply -f $out/secret.yaml" >&2
echo "      ivory webhooks --service-namespace $namespace --service-name $service --ca-bundle $out/ca.crt | kubectl apply -f -" >&2
echo "caBundle (base64 of $out/ca.crt):" >&2
b64 "$out/ca.crt"
echo
