#!/usr/bin/env python3
"""A second mutating admission webhook for the cluster of scripts/cluster.sh: it adds a sidecar
container to Pods labelled `sidecar.ivory.test/inject: NAME`, as service meshes and agents do.
The image of each NAME is the injector's own configuration (never taken from the Pod), given as
NAME=IMAGE arguments. ivory must pin and verify the injected container like any other
(scripts/cluster/workloads.sh).

    sidecar-injector.py --listen 10.201.0.1:9443 --cert C --key K proxy=IMAGE [NAME=IMAGE…]
"""

import argparse
import base64
import http.server
import json
import ssl
import sys

LABEL = "sidecar.ivory.test/inject"
MAX_BODY = 3 * 1024 * 1024


def review_response(review, images):
    request = review.get("request") or {}
    pod = request.get("object") or {}
    name = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL)
    response = {"uid": request.get("uid", ""), "allowed": True}
    containers = (pod.get("spec") or {}).get("containers") or []
    if name in images and not any(c.get("name") == "sidecar" for c in containers):
        patch = [{"op": "add", "path": "/spec/containers/-",
                  "value": {"name": "sidecar", "image": images[name],
                            "command": ["sleep", "3600"]}}]
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def handler(images):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY:
                self.send_error(413)
                return
            try:
                review = json.loads(self.rfile.read(length))
                body = json.dumps(review_response(review, images)).encode()
            except (ValueError, AttributeError) as err:
                self.send_error(400, str(err))
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):
            sys.stderr.write("sidecar-injector: " + fmt % args + "\n")

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("images", nargs="+", metavar="NAME=IMAGE")
    args = parser.parse_args()
    images = dict(pair.split("=", 1) for pair in args.images)
    host, port = args.listen.rsplit(":", 1)
    server = http.server.ThreadingHTTPServer((host, int(port)), handler(images))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    sys.stderr.write(f"sidecar-injector: https://{args.listen} {images}\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
