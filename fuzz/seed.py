#!/usr/bin/env python3
"""Writes the initial seeds of every fuzz target into corpus/<target>/ from fixtures/ and
policies/. Idempotent (seed files are named after their content's hash); run again after the
fixtures change. The fuzzer grows the corpus from here; scripts/fuzz.sh minimises it."""

import base64
import glob
import hashlib
import json
import os
import re

FUZZ = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(FUZZ)
DIGEST = "sha256:e2e16842c9b54d985bf1ef9242a313f36b856181f188de21313820e177002501"
HEX = DIGEST.split(":")[1]


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(FUZZ, "corpus", target)
    os.makedirs(d, exist_ok=True)
    name = "seed-" + hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def read(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


def files(pattern):
    return sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True))


def oci_blobs():
    """(media type or None, bytes, annotations) of every blob of the committed OCI layouts,
    with the layer descriptors' media types and annotations from the manifests."""
    layers = {}
    blobs = {}
    for path in files("fixtures/oci/**/blobs/sha256/*"):
        data = open(path, "rb").read()
        blobs[os.path.basename(path)] = data
        try:
            doc = json.loads(data)
        except ValueError:
            continue
        if isinstance(doc, dict):
            for layer in doc.get("layers") or []:
                digest = layer.get("digest", "").split(":")[-1]
                layers[digest] = (layer.get("mediaType"), layer.get("annotations") or {})
    return blobs, layers


def admission():
    for path in files("fixtures/admission/*.json"):
        put("admission_review", read(path))


def images():
    seen = set()
    for path in files("fixtures/admission/*.json"):
        for m in re.finditer(rb'"image"\s*:\s*"([^"]+)"', read(path)):
            seen.add(m.group(1).decode())
    seen.update([
        "nginx", "nginx:1.25", "library/nginx", "docker.io/nginx", "index.docker.io/nginx",
        "ghcr.io/org/app:v1", "ghcr.io/org/app@" + DIGEST, "ghcr.io/org/app:v1@" + DIGEST,
        "localhost/app", "localhost:5000/a/b:v1@" + DIGEST, "127.0.0.1:5000/x/y",
        "[::1]:5000/x:tag", "registry.example.com:443/deep/path/img:tag",
        "Registry.Example/app", "a/b/c/d:1.0-rc.1",
    ])
    for s in seen:
        put("image_reference", s)


def policies():
    for path in files("policies/**/*.yaml") + files("fixtures/**/*policy*.yaml"):
        text = read(path)
        put("policy_load", text)
        for m in re.finditer(rb'expression:\s*(?:>-?|\|-?)?\s*\n?\s*(.+)', text):
            expr = m.group(1).strip().strip(b"'\"")
            for scope in (0, 1, 2):
                put("cel_compile", bytes([scope]) + expr)
    for expr in [
        "images.containers.all(i, image(i).registry() == 'ghcr.io')",
        "verifyImageSignatures(image, [attestors.notary]) > 0",
        "ref.startsWith('ghcr.io/') && parseImageReference(ref).digest() != ''",
        "object.spec.?containers.orValue([]).map(c, c.image).exists(i, i.matches('^ghcr'))",
        "variables.x.size() > 2 && has(request.userInfo.username)",
    ]:
        put("cel_compile", bytes([0]) + expr.encode())


def envelopes():
    blobs, layers = oci_blobs()
    for digest, (media, annotations) in layers.items():
        blob = blobs.get(digest)
        if blob is None or media is None:
            continue
        fields = [annotations.get(k, "") for k in (
            "dev.cosignproject.cosign/signature", "dev.sigstore.cosign/certificate",
            "dev.sigstore.cosign/chain", "dev.sigstore.cosign/bundle")]
        raw = b"\0".join([blob] + [f.encode() for f in fields])
        if media == "application/vnd.dev.cosign.simplesigning.v1+json":
            put("cosign_envelope", b"\0" + blob.replace(
                re.search(rb'sha256:[0-9a-f]{64}', blob).group(0), DIGEST.encode()))
            put("cosign_envelope", b"\2" + raw)
        elif media == "application/vnd.dsse.envelope.v1+json":
            put("cosign_envelope", b"\3" + raw)
            try:
                env = json.loads(blob)
                st = base64.b64decode(env["payload"])
                st = re.sub(rb'"sha256"\s*:\s*"[0-9a-f]{64}"', b'"sha256":"' + HEX.encode() + b'"', st)
                put("cosign_envelope", b"\1" + st)
            except (ValueError, KeyError):
                pass
    for path in files("fixtures/captured/**/payload.json"):
        put("cosign_envelope", b"\0" + read(path))


def bundles():
    paths = files("fixtures/keyless/*.bundle.json") + files("fixtures/captured/**/bundle.sigstore.json")
    blobs, layers = oci_blobs()
    for digest, (media, _) in layers.items():
        if media and media.startswith("application/vnd.dev.sigstore.bundle") and digest in blobs:
            put("sigstore_bundle", blobs[digest])
    for path in paths:
        put("sigstore_bundle", read(path))


def notation():
    """The envelopes notation v1.3.2 made for fixtures/notation (JWS and COSE)."""
    for path in files("fixtures/notation/oci/**/blobs/sha256/*"):
        data = read(path)
        if data.startswith(b'{"payload"'):
            put("notation_jws", data)
        elif data.startswith(b"\xd2\x84"):
            put("notation_cose", data)


def manifests():
    blobs, _ = oci_blobs()
    for data in blobs.values():
        if data.lstrip().startswith(b"{") and b"schemaVersion" in data:
            put("oci_manifest", b"\0" + data)
            if b'"manifests"' in data:
                put("oci_manifest", b"\1" + data)
    for path in files("fixtures/oci/**/index.json") + files("fixtures/captured/**/sha256*.json"):
        put("oci_manifest", b"\0" + read(path))
        put("oci_manifest", b"\1" + read(path))


def durations():
    for d in ["10s", "1m30s", "1.5s", "500ms", "2h45m", "1µs", "3us", "100ns", "0", "+5s",
              ".5h", "1.h", "timeout=3s", "a=b&timeout=30s", "timeout=10s&timeout=1s"]:
        put("go_duration", d)


def resp_replies():
    # Four limit bytes (bulk 4080, array 8, depth 3, total 16328), then what a Redis server sends
    # ivory-l2: its real replies and the shapes of the attacks it must refuse.
    head = bytes([255, 8, 3, 255])
    for r in [b"+OK\r\n", b"+PONG\r\n", b"-ERR unknown command\r\n", b":-42\r\n", b"$-1\r\n",
              b"$5\r\nhello\r\n", b"$0\r\n\r\n", b"*-1\r\n",
              b"*3\r\n$8\r\nIVL2abcd\r\n:0\r\n$0\r\n\r\n", b"*3\r\n$0\r\n\r\n:2\r\n$6\r\nplant!\r\n",
              b"*2\r\n$0\r\n\r\n$0\r\n\r\n", b"*2\r\n*2\r\n:1\r\n:2\r\n$1\r\nv\r\n",
              b"$2000000000\r\nxxxx", b"*2000000000\r\n+x\r\n", b"*1\r\n" * 8, b"+" + b"x" * 64]:
        put("resp_reply", head + r)


def egress():
    # Mode 0: ranges an operator writes; mode 1: IPv4 + IPv6 bytes; mode 2: URL hosts in the
    # spellings the metadata address was attacked with.
    for r in ["10.0.0.0/8", "169.254.169.254/32", "169.254.169.254", "fd00:ec2::/32", "::/0",
              "0.0.0.0/0", "10.0.0.0/33", "2852039166", "1.2.3.4/08"]:
        put("egress_judge", b"\0" + r.encode())
    for v4, v6 in [("169.254.169.254", "::ffff:169.254.169.254"), ("10.0.0.1", "64:ff9b::a9fe:a9fe"),
                   ("0.0.0.1", "::1"), ("100.100.100.200", "fd00:ec2::254"),
                   ("8.8.8.8", "2002:a9fe:a9fe::1")]:
        a = bytes(int(x) for x in v4.split("."))
        put("egress_judge", b"\1" + a + __import__("ipaddress").IPv6Address(v6).packed)
    for h in ["169.254.169.254", "2852039166", "0xa9fea9fe", "169.254.43518",
              "0251.0376.0251.0376", "0xA9.0xfe.43518", "169.254.169.254.", "[::ffff:169.254.169.254]",
              "[::169.254.169.254]", "[64:ff9b::a9fe:a9fe]", "[fd00:ec2::254]", "[fe80::1%25lo]",
              "metadata.google.internal", "127.0.0.1:5000", "0", "%31%36%39.254.169.254"]:
        put("egress_judge", b"\2" + h.encode())


for step in (admission, images, policies, envelopes, bundles, notation, manifests, durations,
             resp_replies, egress):
    step()
