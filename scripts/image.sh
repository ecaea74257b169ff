#!/usr/bin/env bash
# Builds ivory's container image without a daemon and without pulling a base image, as an OCI
# image layout; optionally pushes it, signs it and attaches an SBOM and a SLSA provenance as
# cosign attestations.
#
#   scripts/image.sh [--binary PATH] [--out DIR] [--tag TAG]
#                    [--push REPOSITORY] [--sign-key COSIGN_KEY | --keyless]
#
#   --binary PATH   package an already-built ivory binary instead of `cargo build --release`
#                   (the tests package the binary they built; a release is built by the default)
#   --out DIR       where the layout and the metadata go (default target/image)
#   --tag TAG       the layout's ref name and the pushed tag (default: the crate version)
#   --push REPO     push to REPO (e.g. registry.example/ivory); prints REPO@sha256:… on stdout
#   --sign-key KEY  after pushing, sign with this cosign key and attach the SBOM and provenance
#                   attestations (COSIGN_PASSWORD is read from the environment)
#   --keyless       the same with Sigstore keyless signing (Fulcio + Rekor, browser/OIDC flow)
#
# Reproducible: the same commit and the same binary give the same image digest. Every timestamp is
# SOURCE_DATE_EPOCH (the commit's time unless set), tar entries are sorted with fixed owners and
# modes, gzip writes no name or time, and JSON is written by jq with sorted keys.
#
# The root filesystem holds only the binary, the shared libraries `ldd` lists for it (copied from
# the host's Debian packages; none when the binary is static), the Debian CA bundle, and
# passwd/group/nsswitch entries for the non-root user 65532. A static musl build is used when the
# x86_64-unknown-linux-musl target and musl-gcc are installed (its C dependencies need musl-gcc):
# without --binary it installs musl-tools (Debian) and adds the target (rustup) when missing.
# It installs what else it needs (git, jq, ca-certificates; crane, cosign v2, cargo-cyclonedx
# into .tools/ for --push and signing), or says in one line what it cannot.
#
# Pushing uses crane (built from the Go module proxy by scripts/install-tools.sh) rather than
# buildah: crane uploads the layout's blobs and manifest byte for byte, so the pushed digest is
# the digest built and tested here, and it needs no container storage, user namespaces or root.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPT_PATH="scripts/image.sh"
TOOLS="$ROOT/.tools/bin"

binary="" out="$ROOT/target/image" tag="" push="" sign_key="" keyless=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --binary) binary="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --push) push="$2"; shift 2 ;;
    --sign-key) sign_key="$2"; shift 2 ;;
    --keyless) keyless=1; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "image.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ "$keyless" == 1 && -n "$sign_key" ]]; then
  echo "image.sh: --sign-key and --keyless exclude each other" >&2; exit 2
fi
if [[ ( -n "$sign_key" || "$keyless" == 1 ) && -z "$push" ]]; then
  echo "image.sh: signing needs --push (signatures are stored next to the pushed image)" >&2; exit 2
fi

log() { echo "image.sh: $*" >&2; }

cd "$ROOT"
# shellcheck source=scripts/lib/needs.sh
source "$ROOT/scripts/lib/needs.sh"
# git (commit, tree state), jq (the JSON), ca-certificates (the image's CA bundle).
needs_pkgs git:git jq:jq update-ca-certificates:ca-certificates
# A release build is static with musl-gcc and the musl target (added below when missing).
[[ -n "$binary" ]] || needs_pkgs musl-gcc:musl-tools
[[ -z "$push" ]] || needs_tools crane
[[ -z "$sign_key" && "$keyless" == 0 ]] || needs_tools cosign2 cargo-cyclonedx
needs_done
commit="$(git rev-parse HEAD)"
# Built from uncommitted changes: the provenance says so (externalParameters.workingTree), a
# release policy can refuse it.
if [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then tree="modified"; else tree="clean"; fi
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct HEAD)}"
created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
version="$(cargo metadata --locked --no-deps --format-version 1 \
  | jq -r '.packages[] | select(.name == "ivory") | .version')"
tag="${tag:-$version}"
source_uri="${IVORY_SOURCE_URI:-https://github.com/ivory/ivory}"
builder_id="$source_uri/$SCRIPT_PATH"

# --- the binary ----------------------------------------------------------------------------
build_kind="prebuilt"
if [[ -z "$binary" ]]; then
  if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
    rustup target add x86_64-unknown-linux-musl >&2 ||
      log "could not add the x86_64-unknown-linux-musl target (rustup): building for glibc"
  fi
  if rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl \
      && command -v musl-gcc >/dev/null; then
    log "cargo build --release (static, x86_64-unknown-linux-musl)"
    CC_x86_64_unknown_linux_musl=musl-gcc \
      cargo build --release --locked -p ivory --target x86_64-unknown-linux-musl >&2
    binary="target/x86_64-unknown-linux-musl/release/ivory"
    build_kind="release-musl"
  else
    log "cargo build --release (glibc; no musl target + musl-gcc: shipping the libraries ldd lists)"
    cargo build --release --locked -p ivory >&2
    binary="target/release/ivory"
    build_kind="release-gnu"
  fi
fi
[[ -x "$binary" ]] || { log "binary '$binary' is missing or not executable"; exit 1; }

# --- root filesystem -----------------------------------------------------------------------
rm -rf "$out"
mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs"/{etc/ssl/certs,usr/local/bin,tmp}
install -m 0755 "$binary" "$rootfs/usr/local/bin/ivory"
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/tmp:/sbin/nologin\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$rootfs/etc/group"
printf 'hosts: files dns\n' > "$rootfs/etc/nsswitch.conf"

# Shared libraries: exactly what the dynamic loader resolves for this binary ("not a dynamic
# executable" for a static one), each at the path the loader looks for it.
libs=()
if ldd "$binary" >/dev/null 2>&1; then
  mapfile -t libs < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
fi
for lib in "${libs[@]}"; do
  mkdir -p "$rootfs$(dirname "$lib")"
  install -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
done
chmod 1777 "$rootfs/tmp"
find "$rootfs" -type d ! -path "$rootfs/tmp" -exec chmod 0755 {} +
find "$rootfs/etc" -type f -exec chmod 0644 {} +

# --- layer, config, manifest, layout -------------------------------------------------------
tar --sort=name --format=posix --numeric-owner --owner=0 --group=0 --mtime="@$SOURCE_DATE_EPOCH" \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -C "$rootfs" -cf "$work/layer.tar" .
gzip -n -c "$work/layer.tar" > "$work/layer.tar.gz"
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }
diff_id="sha256:$(sha "$work/layer.tar")"

blobs="$out/oci/blobs/sha256"
mkdir -p "$blobs"
put_blob() { local h; h="$(sha "$1")"; cp "$1" "$blobs/$h"; echo "$h"; }

layer_hex="$(put_blob "$work/layer.tar.gz")"
jq -cnS --arg created "$created" --arg diff "$diff_id" --arg rev "$commit" --arg ver "$version" \
  --arg src "$source_uri" --arg tag "$tag" '{
  architecture: "amd64", os: "linux", created: $created,
  config: {
    User: "65532:65532",
    Entrypoint: ["/usr/local/bin/ivory"],
    Cmd: ["serve"],
    WorkingDir: "/tmp",
    Env: ["PATH=/usr/local/bin", "HOME=/tmp", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],
    ExposedPorts: {"8443/tcp": {}},
    Labels: {
      "org.opencontainers.image.created": $created,
      "org.opencontainers.image.revision": $rev,
      "org.opencontainers.image.source": $src,
      "org.opencontainers.image.title": "ivory",
      "org.opencontainers.image.version": $ver,
      "org.opencontainers.image.licenses": "Apache-2.0"
    }
  },
  rootfs: {type: "layers", diff_ids: [$diff]},
  history: [{created: $created, created_by: "scripts/image.sh (no base image)"}]
}' > "$work/config.json"
config_hex="$(put_blob "$work/config.json")"
jq -cnS --arg c "sha256:$config_hex" --argjson cs "$(size "$work/config.json")" \
  --arg l "sha256:$layer_hex" --argjson ls "$(size "$work/layer.tar.gz")" '{
  schemaVersion: 2,
  mediaType: "application/vnd.oci.image.manifest.v1+json",
  config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $c, size: $cs},
  layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $l, size: $ls}]
}' > "$work/manifest.json"
manifest_hex="$(put_blob "$work/manifest.json")"
digest="sha256:$manifest_hex"
printf '{"imageLayoutVersion":"1.0.0"}' > "$out/oci/oci-layout"
jq -cnS --arg d "$digest" --argjson s "$(size "$work/manifest.json")" --arg tag "$tag" '{
  schemaVersion: 2,
  mediaType: "application/vnd.oci.image.index.v1+json",
  manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $d, size: $s,
               annotations: {"org.opencontainers.image.ref.name": $tag}}]
}' > "$out/oci/index.json"
echo "$digest" > "$out/digest"
log "built $digest ($build_kind, revision $commit, $tree tree, ${#libs[@]} shared libraries) in $out/oci"

# --- SBOM and provenance -------------------------------------------------------------------
# The SBOM describes the binary's crates as Cargo.lock resolves them (cargo-cyclonedx, built by
# scripts/install-tools.sh image). Only needed when attesting.
if [[ -n "$sign_key" || "$keyless" == 1 ]]; then
  "$TOOLS/cargo-cyclonedx" cyclonedx --manifest-path crates/ivory/Cargo.toml --format json \
    --spec-version 1.5 --all --override-filename ivory-image-sbom >&2
  # It writes one file per workspace member; ivory's is the binary's.
  mv crates/ivory/ivory-image-sbom.json "$out/sbom.cdx.json"
  cargo metadata --locked --no-deps --format-version 1 | jq -r '.packages[].manifest_path' \
    | while read -r manifest; do rm -f "$(dirname "$manifest")/ivory-image-sbom.json"; done

  lib_deps="$(for lib in "${libs[@]}"; do
      pkg="$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null | head -1 | cut -d: -f1 || true)"
      [[ -z "$pkg" ]] && pkg="$(dpkg -S "$lib" 2>/dev/null | head -1 | cut -d: -f1 || true)"
      ver=""
      [[ -z "$pkg" ]] || ver="$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)"
      jq -cn --arg p "$lib" --arg pkg "$pkg" --arg v "$ver" --arg h "$(sha "$(readlink -f "$lib")")" \
        '{uri: ("file://" + $p), name: (if $pkg == "" then $p else ("pkg:deb/debian/" + $pkg + "@" + $v) end), digest: {sha256: $h}}'
    done | jq -cs .)"
  jq -nS --arg builder "$builder_id" --arg src "$source_uri" --arg commit "$commit" \
    --arg tree "$tree" --arg kind "$build_kind" --arg sde "$SOURCE_DATE_EPOCH" \
    --arg script "$(sha "$ROOT/$SCRIPT_PATH")" --arg rustc "$(rustc -V)" --arg cargo "$(cargo -V)" \
    --arg bin "$(sha "$binary")" --arg ca "$(sha /etc/ssl/certs/ca-certificates.crt)" \
    --arg cav "$(dpkg-query -W -f='${Version}' ca-certificates 2>/dev/null || echo unknown)" \
    --argjson libs "$lib_deps" --arg started "$(date -u +%Y-%m-%dT%H:%M:%SZ)" '{
    buildDefinition: {
      buildType: ($src + "/scripts/image.sh@v1"),
      externalParameters: {
        source: {uri: ("git+" + $src), digest: {gitCommit: $commit}},
        workingTree: $tree,
        binary: $kind
      },
      internalParameters: {SOURCE_DATE_EPOCH: $sde},
      resolvedDependencies: ([
        {uri: ("git+" + $src), digest: {gitCommit: $commit}},
        {name: "ivory binary", uri: "file:///usr/local/bin/ivory", digest: {sha256: $bin}},
        {name: ("pkg:deb/debian/ca-certificates@" + $cav), uri: "file:///etc/ssl/certs/ca-certificates.crt", digest: {sha256: $ca}}
      ] + $libs)
    },
    runDetails: {
      builder: {id: $builder, version: {"scripts/image.sh": ("sha256:" + $script), rustc: $rustc, cargo: $cargo}},
      metadata: {startedOn: $started}
    }
  }' > "$out/provenance.json"
fi

# --- push, sign, attest --------------------------------------------------------------------
if [[ -n "$push" ]]; then
  "$TOOLS/crane" push "$out/oci" "$push:$tag" >&2
  ref="$push@$digest"
  if [[ -n "$sign_key" || "$keyless" == 1 ]]; then
    if [[ "$keyless" == 1 ]]; then
      sign=(--yes)
    else
      # A private key signs without a transparency-log entry; policies then set
      # ctlog.insecureIgnoreTlog (see README: signing a release).
      sign=(--key "$sign_key" --tlog-upload=false)
    fi
    "$TOOLS/cosign2" sign "${sign[@]}" "$ref" >&2
    "$TOOLS/cosign2" attest "${sign[@]}" --type cyclonedx --predicate "$out/sbom.cdx.json" "$ref" >&2
    "$TOOLS/cosign2" attest "${sign[@]}" --type slsaprovenance1 --predicate "$out/provenance.json" "$ref" >&2
    log "signed $ref; attached the SBOM and the provenance"
  fi
  echo "$ref"
fi
