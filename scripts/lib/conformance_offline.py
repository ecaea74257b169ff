"""pytest plugin for offline runs of the Sigstore conformance suite (scripts/sigstore-conformance.sh).

The suite's `identity_token` fixture downloads a signing token for every test, even those that only
verify (fixtures/sigstore-conformance/test/conftest.py). Verification never uses it, so this plugin,
loaded with `-p conformance_offline` before the suite's conftest imports `urllib3.request`, answers
that one URL with a placeholder and refuses every other request: the run sends nothing anywhere.
"""

import base64
import json

import urllib3
from urllib3.response import HTTPResponse

TOKEN_URL = (
    "https://storage.googleapis.com/sigstore-conformance-testing-token/untrusted-testing-token.txt"
)


def _b64url(document: dict) -> bytes:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).rstrip(b"=")


# The suite reads `email`, `iss` and `exp` from the token's payload (test/client.py); nothing
# signs with it, so it is unsigned and names no real identity.
PLACEHOLDER_TOKEN = b".".join(
    [
        _b64url({"alg": "none", "typ": "JWT"}),
        _b64url(
            {
                "email": "placeholder@conformance.invalid",
                "iss": "https://placeholder.invalid",
                "exp": 4102444800,
            }
        ),
        b"",
    ]
)


def _offline_request(method, url, *args, **kwargs):
    if method == "GET" and url == TOKEN_URL:
        return HTTPResponse(body=PLACEHOLDER_TOKEN, status=200, preload_content=True)
    raise RuntimeError(f"offline conformance run: refused {method} {url}")


urllib3.request = _offline_request
