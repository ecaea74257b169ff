#!/usr/bin/env python3
"""Pushes the sharded audit's corpus into the cluster's registry (docs/CLUSTER.md, "Sharded
audit"): 5,000 small images in 52 repositories under audit/ (two repositories hold 1,500 tags
each, fifty hold 40), every third one signed the way `cosign sign --key --tlog-upload=false`
signs (scripts/cluster/sign.sh's format: a `sha256-<hex>.sig` simple-signing manifest, the
ECDSA-P256/SHA-256 signature in the layer's annotation, made with the `cryptography` package),
and one image, audit/broken:v1, whose manifest the registry can no longer serve (its stored blob
is removed), so that auditing it is a registry error.

    audit-corpus.py --registry HOST:PORT --ca CA.pem --key COSIGN_KEY.pem --storage DIR --out FILE

--storage is the registry's filesystem root (to break audit/broken:v1); --out gets one line per
image: `image<TAB>digest<TAB>signed|unsigned|broken`. Standard library plus `cryptography`.
"""

import argparse
import base64
import gzip
import hashlib
import http.client
import io
import json
import os
import ssl
import sys
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
LAYOUT = [("audit/big-a", 1500), ("audit/big-b", 1500)] + [
    (f"audit/r{n:02d}", 40) for n in range(50)
]


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Client:
    """One keep-alive HTTPS connection per thread to the registry."""

    def __init__(self, host, ca):
        self.host = host
        self.context = ssl.create_default_context(cafile=ca)
        self.local = threading.local()

    def request(self, method, path, body=None, headers=None):
        for attempt in range(3):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = http.client.HTTPSConnection(self.host, context=self.context, timeout=60)
                self.local.conn = conn
            try:
                conn.request(method, path, body=body, headers=headers or {})
                response = conn.getresponse()
                data = response.read()
                return response.status, response.getheader("Location"), data
            except (http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        raise RuntimeError("unreachable")

    def blob(self, repo, data):
        d = digest(data)
        status, _, _ = self.request("HEAD", f"/v2/{repo}/blobs/{d}")
        if status == 200:
            return d
        status, location, body = self.request("POST", f"/v2/{repo}/blobs/uploads/")
        if status != 202:
            raise RuntimeError(f"{repo}: starting an upload: {status} {body[:200]!r}")
        path = location.split(self.host, 1)[-1]
        sep = "&" if "?" in path else "?"
        status, _, body = self.request(
            "PUT", f"{path}{sep}digest={d}", body=data,
            headers={"Content-Type": "application/octet-stream"})
        if status != 201:
            raise RuntimeError(f"{repo}: uploading {d}: {status} {body[:200]!r}")
        return d

    def manifest(self, repo, ref, manifest):
        data = json.dumps(manifest, separators=(",", ":")).encode()
        status, _, body = self.request(
            "PUT", f"/v2/{repo}/manifests/{ref}", body=data,
            headers={"Content-Type": OCI_MANIFEST})
        if status != 201:
            raise RuntimeError(f"{repo}:{ref}: {status} {body[:200]!r}")
        return digest(data)


def layer():
    """A tiny gzipped tar, the same for every image (the manifests differ by annotation)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        content = b"ivory sharded audit corpus\n"
        info = tarfile.TarInfo("corpus.txt")
        info.size, info.mtime = len(content), 0
        tar.addfile(info, io.BytesIO(content))
    return gzip.compress(raw.getvalue(), mtime=0)


def push_image(client, repo, tag, layer_desc, config_desc):
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config_desc,
        "layers": [layer_desc], "annotations": {"ivory.test/corpus": f"{repo}:{tag}"},
    }
    return client.manifest(repo, tag, manifest)


def sign(client, key, registry, repo, image_digest):
    reference = f"{registry}/{repo}"
    payload = json.dumps({
        "critical": {"identity": {"docker-reference": reference},
                     "image": {"docker-manifest-digest": image_digest},
                     "type": "cosign container image signature"},
        "optional": None}, separators=(",", ":")).encode()
    signature = base64.b64encode(key.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()
    payload_digest = client.blob(repo, payload)
    config = json.dumps({
        "architecture": "", "created": "0001-01-01T00:00:00Z", "os": "",
        "rootfs": {"type": "layers", "diff_ids": [payload_digest]}, "config": {}},
        separators=(",", ":")).encode()
    config_digest = client.blob(repo, config)
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "size": len(config), "digest": config_digest},
        "layers": [{"mediaType": SIMPLE_SIGNING, "size": len(payload), "digest": payload_digest,
                    "annotations": {"dev.cosignproject.cosign/signature": signature}}],
    }
    client.manifest(repo, "sha256-" + image_digest.split(":", 1)[1] + ".sig", manifest)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    with open(args.key, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), password=None)
    client = Client(args.registry, args.ca)
    layer_bytes = layer()
    config_bytes = json.dumps({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [digest(gzip.decompress(layer_bytes))]},
        "config": {}}, separators=(",", ":")).encode()
    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                  "size": len(layer_bytes), "digest": digest(layer_bytes)}
    config_desc = {"mediaType": OCI_CONFIG, "size": len(config_bytes),
                   "digest": digest(config_bytes)}
    repos = [repo for repo, _ in LAYOUT] + ["audit/broken"]
    for repo in repos:
        client.blob(repo, layer_bytes)
        client.blob(repo, config_bytes)

    def one(job):
        repo, n = job
        tag = f"t{n:04d}"
        image_digest = push_image(client, repo, tag, layer_desc, config_desc)
        signed = n % 3 == 0
        if signed:
            sign(client, key, args.registry, repo, image_digest)
        return f"{args.registry}/{repo}:{tag}\t{image_digest}\t{'signed' if signed else 'unsigned'}"

    jobs = [(repo, n) for repo, count in LAYOUT for n in range(count)]
    with ThreadPoolExecutor(args.threads) as pool:
        lines = list(pool.map(one, jobs))

    broken = push_image(client, "audit/broken", "v1", layer_desc, config_desc)
    hexdigest = broken.split(":", 1)[1]
    data = os.path.join(args.storage, "docker/registry/v2/blobs/sha256", hexdigest[:2], hexdigest, "data")
    os.remove(data)
    lines.append(f"{args.registry}/audit/broken:v1\t{broken}\tbroken")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"audit-corpus: {len(lines)} images in {len(repos)} repositories "
          f"({sum(1 for l in lines if l.endswith(chr(9) + 'signed'))} signed)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
