#!/usr/bin/env bash
# Signs an image in the cluster's registry the way `cosign sign --key KEY --tlog-upload=false`
# does (legacy "simple signing" tag `sha256-<hex>.sig`: one layer of media type
# application/vnd.dev.cosign.simplesigning.v1+json whose annotation
# dev.cosignproject.cosign/signature is the base64 ECDSA-P256/SHA-256 signature of the payload),
# with openssl and crane only: the fixtures' private keys are thrown away and the Sigstore tools
# are a long build, so scripts/cluster.sh makes its own key pair and signs with this.
#
#   scripts/cluster/sign.sh KEY.pem REPOSITORY@sha256:DIGEST
#
# Runs crane from .tools/bin (SSL_CERT_FILE must name the registry's CA when it is a test CA).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=scripts/lib/needs.sh
source "$root/scripts/lib/needs.sh"
needs_pkgs jq:jq openssl:openssl
needs_tools crane
needs_done

key="$1" ref="$2"
repo="${ref%@*}" digest="${ref#*@}"
[[ "$digest" == sha256:* && "$repo" != "$ref" ]] || { echo "sign.sh: give REPOSITORY@sha256:DIGEST" >&2; exit 2; }
crane="$root/.tools/bin/crane"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/blobs/sha256"

blob() { # blob FILE: stores FILE as a blob, prints its digest
  local d
  d="$(sha256sum "$1" | cut -d' ' -f1)"
  cp "$1" "$work/blobs/sha256/$d"
  echo "sha256:$d"
}

printf '{"critical":{"identity":{"docker-reference":"%s"},"image":{"docker-manifest-digest":"%s"},"type":"cosign container image signature"},"optional":null}' \
  "$repo" "$digest" >"$work/payload"
payload_digest="$(blob "$work/payload")"
signature="$(openssl dgst -sha256 -sign "$key" "$work/payload" | base64 -w0)"

printf '{"architecture":"","created":"0001-01-01T00:00:00Z","history":[{"created":"0001-01-01T00:00:00Z"}],"os":"","rootfs":{"type":"layers","diff_ids":["%s"]},"config":{}}' \
  "$payload_digest" >"$work/config"
config_digest="$(blob "$work/config")"

jq -cn --arg cd "$config_digest" --argjson cs "$(stat -c %s "$work/config")" \
  --arg pd "$payload_digest" --argjson ps "$(stat -c %s "$work/payload")" --arg sig "$signature" '{
  schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
  config: {mediaType: "application/vnd.oci.image.config.v1+json", size: $cs, digest: $cd},
  layers: [{mediaType: "application/vnd.dev.cosign.simplesigning.v1+json", size: $ps, digest: $pd,
            annotations: {"dev.cosignproject.cosign/signature": $sig}}]}' | tr -d '\n' >"$work/manifest"
manifest_digest="$(blob "$work/manifest")"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/oci-layout"
jq -cn --arg d "$manifest_digest" --argjson s "$(stat -c %s "$work/manifest")" \
  '{schemaVersion: 2, manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $d, size: $s}]}' \
  >"$work/index.json"

"$crane" push "$work" "$repo:sha256-${digest#sha256:}.sig" >&2
